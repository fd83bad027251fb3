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
"""A reference model that can take the actor's weights: verl's fused actor/rollout/reference worker plus one call.

verl (0.9.1 and 0.7.1, engine workers) builds the reference policy inside ``ActorRolloutRefWorker`` (role
``actor_rollout_ref``) whenever a KL term needs it, from the same model path as the actor, and never changes it.
:class:`RefreshableReferenceWorker` adds ``copy_actor_weights_to_reference``, which overwrites the reference's
parameters with the actor's current ones in every worker process, shard by shard (both models are wrapped by the same
FSDP strategy over the same mesh, so their local shards line up; the copy casts to the reference's dtype and device,
so an offloaded or lower-precision reference works too). A recipe maps its actor role to this class in its TaskRunner's
``add_actor_rollout_worker``.
"""

from __future__ import annotations

import torch
from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import ActorRolloutRefWorker


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The process-local shard of an FSDP2 ``DTensor`` parameter, or the tensor itself (FSDP1 flat parameter)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


@torch.no_grad()
def copy_parameters(source: torch.nn.Module, target: torch.nn.Module) -> int:
    """Copy every parameter of ``source`` into the same-named parameter of ``target`` (local shards).

    Returns:
        The number of parameters copied.

    Raises:
        ValueError: if the two modules' parameter names or local shard shapes differ (different models or
            different sharding), before anything is copied.
    """
    source_params, target_params = dict(source.named_parameters()), dict(target.named_parameters())
    if source_params.keys() != target_params.keys():
        differ = sorted(source_params.keys() ^ target_params.keys())
        raise ValueError(f"actor and reference have different parameters, e.g. {differ[:3]}")
    shapes = {name: (_local(p).shape, _local(target_params[name]).shape) for name, p in source_params.items()}
    mismatched = {name: pair for name, pair in shapes.items() if pair[0] != pair[1]}
    if mismatched:
        raise ValueError(f"actor and reference shards differ in shape (different sharding?): {mismatched}")
    for name, param in source_params.items():
        _local(target_params[name]).copy_(_local(param))
    return len(source_params)


class RefreshableReferenceWorker(ActorRolloutRefWorker):
    """``ActorRolloutRefWorker`` whose reference model can be overwritten with the actor's weights."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def copy_actor_weights_to_reference(self) -> int:
        """Overwrite the reference's parameters with the actor's (every rank, its own shards); returns the count."""
        # SYNC WARNING: verl/workers/engine_workers.py:ActorRolloutRefWorker.init_model (self.actor and self.ref are
        # TrainingWorkers; their engine's .module is the FSDP-wrapped model)
        if self.ref is None or self.actor is None:
            raise RuntimeError(
                "copy_actor_weights_to_reference needs the reference inside this worker (role actor_rollout_ref: a KL "
                "term on, no LoRA); this worker has role " + repr(self.role)
            )
        return copy_parameters(self.actor.engine.module, self.ref.engine.module)
