# Copyright 2026 treetune-verl contributors
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""The recipe's one custom worker: verl's fused actor/rollout/reference worker whose reference model can take the
actor's weights and whose loss can run a teacher's forward.

verl (0.9.1 and 0.7.1, engine workers) builds the reference policy inside ``ActorRolloutRefWorker`` (role
``actor_rollout_ref``) whenever a KL term needs it, from the same model path as the actor, and never changes it.
:class:`TeacherWorker` adds:

- ``copy_actor_weights_to_reference``, which overwrites the reference's parameters with the actor's current ones in
  every worker process, shard by shard (both models are wrapped by the same FSDP strategy over the same mesh, so their
  local shards line up; the copy casts to the reference's dtype and device, so an offloaded or lower-precision
  reference works too);
- ``ema_actor_weights_into_reference(rate)``, the same walk over the shards moving the reference towards the actor:
  θ_ref ← (1 − rate)·θ_ref + rate·θ_actor (``rate=1`` is the copy);
- ``save_reference_weights(folder)`` / ``load_reference_weights(folder)``: every rank writes or reads the local shards
  of the reference's parameters (``model_world_size_<W>_rank_<r>.pt``), so a moving teacher can be checkpointed
  (verl checkpoints the actor only);
- ``set_loss_fn_with_teacher(loss_fn, teacher)`` (verl 0.9.x only): installs the actor's loss with the teacher's
  forward bound to it (``loss_fn(..., teacher=UpdateTeacher)``, :mod:`treetune_verl.update_teacher`): the reference's
  engine, or the actor's own for a ``policy`` teacher, run per update micro-batch beside the student; ``update_actor``
  then holds an offloaded reference on the device for the whole update (one load and one offload per step).

A recipe maps its actor role to this class in its TaskRunner's ``add_actor_rollout_worker``.
"""

from __future__ import annotations

import contextlib
import os
from functools import partial

import torch
from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.utils import tensordict_utils as tu
from verl.workers.engine_workers import ActorRolloutRefWorker

from treetune_verl.update_teacher import UpdateTeacher

#: Which model a loss's in-update teacher runs (``set_loss_fn_with_teacher``): verl's reference, or the actor itself.
TEACHER_MODELS = ("reference", "actor")


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """The process-local shard of an FSDP2 ``DTensor`` parameter, or the tensor itself (FSDP1 flat parameter)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


@torch.no_grad()
def copy_parameters(source: torch.nn.Module, target: torch.nn.Module, rate: float = 1.0) -> int:
    """Move every parameter of ``target`` to the same-named parameter of ``source`` (local shards):
    ``target ← (1 − rate)·target + rate·source``; ``rate=1`` (the default) copies exactly.

    Returns:
        The number of parameters updated.

    Raises:
        ValueError: if ``rate`` is outside (0, 1], or the two modules' parameter names or local shard shapes differ
            (different models or different sharding), before anything is changed.
    """
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"the reference update rate must be in (0, 1], got {rate}")
    source_params, target_params = dict(source.named_parameters()), dict(target.named_parameters())
    if source_params.keys() != target_params.keys():
        differ = sorted(source_params.keys() ^ target_params.keys())
        raise ValueError(f"actor and reference have different parameters, e.g. {differ[:3]}")
    shapes = {name: (local_shard(p).shape, local_shard(target_params[name]).shape) for name, p in source_params.items()}
    mismatched = {name: pair for name, pair in shapes.items() if pair[0] != pair[1]}
    if mismatched:
        raise ValueError(f"actor and reference shards differ in shape (different sharding?): {mismatched}")
    for name, param in source_params.items():
        target_shard = local_shard(target_params[name])
        if rate == 1.0:
            target_shard.copy_(local_shard(param))
        else:
            target_shard.lerp_(local_shard(param).to(device=target_shard.device, dtype=target_shard.dtype), rate)
    return len(source_params)


def shard_file(folder: str, rank: int, world_size: int) -> str:
    """The file of one rank's local shards in ``folder`` (the naming of verl's actor shards)."""
    return os.path.join(folder, f"model_world_size_{world_size}_rank_{rank}.pt")


def save_local_shards(module: torch.nn.Module, path: str) -> int:
    """Write the process-local shard of every parameter of ``module`` to ``path`` (CPU tensors, their own dtype);
    returns the number of parameters."""
    shards = {name: local_shard(param).detach().to("cpu", copy=True) for name, param in module.named_parameters()}
    torch.save(shards, path)
    return len(shards)


@torch.no_grad()
def load_local_shards(module: torch.nn.Module, path: str) -> int:
    """Overwrite every parameter's local shard of ``module`` with those :func:`save_local_shards` wrote to ``path``.

    Raises:
        ValueError: if the file's names, shapes or dtypes differ from the module's (another model, sharding or
            precision), before anything is changed.
    """
    shards = torch.load(path, map_location="cpu", weights_only=True)
    params = {name: local_shard(param) for name, param in module.named_parameters()}
    if shards.keys() != params.keys():
        differ = sorted(shards.keys() ^ params.keys())
        raise ValueError(f"{path} holds other parameters than the reference, e.g. {differ[:3]}")
    mismatched = [
        name for name, shard in shards.items() if (shard.shape, shard.dtype) != (params[name].shape, params[name].dtype)
    ]
    if mismatched:
        raise ValueError(f"{path}: shards of another shape or dtype than the reference's, e.g. {mismatched[:3]}")
    for name, shard in shards.items():
        params[name].copy_(shard)
    return len(shards)


def _rank_and_world_size() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class TeacherWorker(ActorRolloutRefWorker):
    """``ActorRolloutRefWorker`` whose reference model can take the actor's weights and whose loss can run a teacher's
    forward inside the update (the module docstring lists the calls)."""

    def _update_reference(self, rate: float, caller: str) -> int:
        # SYNC WARNING: verl/workers/engine_workers.py:ActorRolloutRefWorker.init_model (self.actor and self.ref are
        # TrainingWorkers; their engine's .module is the FSDP-wrapped model)
        if self.ref is None or self.actor is None:
            raise RuntimeError(
                f"{caller} needs the reference inside this worker (role actor_rollout_ref: a KL term on, no LoRA); "
                "this worker has role " + repr(self.role)
            )
        return copy_parameters(self.actor.engine.module, self.ref.engine.module, rate=rate)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def copy_actor_weights_to_reference(self) -> int:
        """Overwrite the reference's parameters with the actor's (every rank, its own shards); returns the count."""
        return self._update_reference(1.0, "copy_actor_weights_to_reference")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def ema_actor_weights_into_reference(self, rate: float) -> int:
        """θ_ref ← (1 − rate)·θ_ref + rate·θ_actor on every rank's shards, ``rate`` in (0, 1]; returns the count."""
        return self._update_reference(float(rate), "ema_actor_weights_into_reference")

    def _reference_module(self, caller: str) -> torch.nn.Module:
        if self.ref is None:
            raise RuntimeError(f"{caller} needs the reference inside this worker; role {self.role!r}")
        return self.ref.engine.module

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_reference_weights(self, folder: str) -> int:
        """Every rank writes its local shards of the reference's parameters into ``folder``; returns the count."""
        module = self._reference_module("save_reference_weights")
        os.makedirs(folder, exist_ok=True)
        return save_local_shards(module, shard_file(folder, *_rank_and_world_size()))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_reference_weights(self, folder: str) -> int:
        """Every rank reads its local shards of the reference's parameters from ``folder``; returns the count."""
        module = self._reference_module("load_reference_weights")
        return load_local_shards(module, shard_file(folder, *_rank_and_world_size()))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_loss_fn_with_teacher(self, loss_fn, teacher: str) -> None:
        """Install ``partial(loss_fn, teacher=UpdateTeacher(...))`` on the actor: the loss runs the teacher's forward on
        each update micro-batch, on this worker. ``teacher``: ``reference`` (verl's reference model; with LoRA and no
        reference worker, the actor without its adapter) or ``actor`` (the student's own module, no-grad)."""
        if teacher not in TEACHER_MODELS:
            raise ValueError(f"set_loss_fn_with_teacher: teacher must be one of {TEACHER_MODELS}, got {teacher!r}")
        # SYNC WARNING: verl/workers/engine_workers.py:ActorRolloutRefWorker.init_model (0.9.1 l.543-588: self.actor and
        # self.ref are TrainingWorkers in this process; self.ref is None with a LoRA reference inside the actor)
        if teacher == "actor":
            bound = UpdateTeacher(self.actor.engine, name="policy teacher (the actor, no-grad)")
        elif self.ref is not None:
            bound = UpdateTeacher(self.ref.engine, name="reference teacher")
        elif self.config.model.get("lora_rank", 0) > 0 or self.config.model.get("lora_adapter_path") is not None:
            bound = UpdateTeacher(self.actor.engine, without_adapter=True, name="reference teacher (actor, no adapter)")
        else:
            raise RuntimeError(
                "a reference teacher needs verl's reference model in this worker (role actor_rollout_ref: "
                "actor_rollout_ref.actor.use_kl_loss=true) or a LoRA actor; this worker has role " + repr(self.role)
            )
        self.update_teacher = bound
        self.actor.set_loss_fn(partial(loss_fn, teacher=bound))

    def _reference_teacher_on_device(self):
        """With a reference teacher bound, a context holding the reference on the device, in eval mode (an offloaded
        reference is loaded on enter and offloaded on exit); else a no-op context."""
        teacher = getattr(self, "update_teacher", None)
        if teacher is None or self.ref is None or teacher.engine is not self.ref.engine:
            return contextlib.nullcontext()
        # SYNC WARNING: verl/workers/engine/base.py:BaseEngineCtx (0.9.1 l.300-335: eval_mode loads an offloaded
        # model's parameters on enter and offloads them on exit)
        return self.ref.engine.eval_mode()

    # SYNC WARNING: verl/workers/engine_workers.py:ActorRolloutRefWorker.update_actor and compute_log_prob (0.9.1
    # l.700-716: the same dispatch, mesh "actor")
    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def update_actor(self, data):
        """verl's update; with a reference teacher bound, the reference stays on the device for the whole update."""
        with self._reference_teacher_on_device():
            return super().update_actor(data)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_log_prob(self, data):
        """verl's actor pass; when the request hands the logits to the loss (the credit dump's pass), the bound
        reference teacher is on the device for it, as in the update."""
        if not tu.get_non_tensor_data(data=data, key="distillation_use_topk", default=False):
            return super().compute_log_prob(data)
        with self._reference_teacher_on_device():
            return super().compute_log_prob(data)
