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
"""The student's logits inside the actor update (verl 0.9.x only), and the layout helpers a distribution-level loss
needs on the engine's packed micro-batch.

verl 0.9.1's FSDP engine has one hook that hands a loss the student's logits: when a micro-batch carries the
non-tensor flag ``distillation_use_topk``, ``FSDPEngineWithLMHead.prepare_model_outputs`` calls
``loss_function(student_logits=[1, nnz, V], data=micro_batch)`` with the packed logits of the micro-batch (already
divided by the temperature) and puts each returned ``[1, nnz]`` tensor into the model output (gradient kept), before
the usual ``loss_function(model_output=..., data=..., dp_group=...)`` call. This module builds on that hook:

- layout helpers on the engine's micro-batch (packed rows, :func:`response_positions`): :func:`response_index`
  (which packed logits predict the response tokens) and :func:`scatter_response_values` (one value per response token
  back to the packed ``[1, nnz]`` layout the hook must return);
- :func:`student_logits_in_update`: a driver-side seam that makes verl's actor update set ``distillation_use_topk``,
  so the installed loss receives the student's logits (the teacher's forward beside it:
  :mod:`treetune_verl.update_teacher`);
- :func:`check_distribution_support`: a one-line refusal on a verl release without the hook.

Only sequence-parallel size 1 is supported: with Ulysses SP the hook sees a shard of the packed sequence.
"""

from __future__ import annotations

import contextlib

import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu

from treetune_verl.version import installed_verl_version

__all__ = [
    "check_distribution_support",
    "response_index",
    "response_positions",
    "scatter_response_values",
    "student_logits_in_update",
]


def check_distribution_support() -> None:
    """Raise a one-line error on a verl release without the FSDP engine's student-logits hook (anything but 0.9.x)."""
    release = installed_verl_version()
    if not release.startswith("0.9."):
        raise RuntimeError(
            f"distribution-level passes need verl 0.9.x (the FSDP engine's distillation_use_topk logits hook); "
            f"the installed verl is {release}: run them on the default release (.venv)"
        )


def _check_single_sequence_shard(data: TensorDict) -> None:
    # SYNC WARNING: verl/workers/engine/fsdp/transformer_impl.py:FSDPEngine.forward_backward_batch (0.9.1 l.726:
    # sp_size is written into every micro-batch); with Ulysses SP the hook's logits are a shard of the packed rows.
    sp_size = tu.get_non_tensor_data(data=data, key="sp_size", default=1)
    if sp_size not in (None, 1):
        raise NotImplementedError(
            f"distribution passes support sequence-parallel size 1 only; this micro-batch has sp_size={sp_size}: "
            "set ulysses_sequence_parallel_size=1"
        )


def response_positions(data: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each response token is predicted in the packed rows of an engine micro-batch.

    The packed logits ``[nnz, V]`` of ``data`` (``input_ids`` nested: prompt + response of each row, no padding) at
    position ``start_i + prompt_len_i + t - 1`` predict response token ``t`` of row ``i``.

    Args:
        data: an engine request or micro-batch after ``left_right_2_no_padding``: nested ``input_ids``, and
            ``prompts`` / ``responses`` / ``attention_mask`` in the padded layout (or ``prompts`` and ``responses``
            nested, as ``no_padding_2_padding`` accepts).

    Returns:
        ``(positions [B, T] int64, valid [B, T] bool)``: the packed index for each response slot (0 where invalid)
        and which slots hold a response token.

    Raises:
        NotImplementedError: with sequence parallelism (the logits would be a shard).
        ValueError: if the lengths do not add up to the packed rows, or a row has no prompt token.
    """
    _check_single_sequence_shard(data)
    offsets = data["input_ids"].offsets()
    seq_lens = offsets.diff()
    prompts, responses = data["prompts"], data["responses"]
    if prompts.is_nested:
        prompt_lens, response_lens = prompts.offsets().diff(), responses.offsets().diff()
        width = tu.get_non_tensor_data(data=data, key="max_response_len", default=-1)
        width = int(response_lens.max()) if width is None or width < 0 else int(width)
    else:
        attention_mask = data["attention_mask"]
        prompt_lens = attention_mask[:, : prompts.shape[1]].sum(-1)
        response_lens = attention_mask[:, prompts.shape[1] :].sum(-1)
        width = responses.shape[1]
    prompt_lens, response_lens = prompt_lens.to(offsets.device), response_lens.to(offsets.device)
    if not torch.equal(prompt_lens + response_lens, seq_lens):
        raise ValueError("prompt + response lengths do not match the packed rows of input_ids")
    if bool((prompt_lens == 0).any()):
        raise ValueError("every row needs a prompt token: response token 0 is predicted at the prompt's last position")
    steps = torch.arange(width, device=offsets.device)
    valid = steps[None, :] < response_lens[:, None]
    positions = offsets[:-1, None] + prompt_lens[:, None] - 1 + steps[None, :]
    return torch.where(valid, positions, torch.zeros_like(positions)), valid


def response_index(logits: torch.Tensor, data: TensorDict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where the response tokens' logits are in the packed logits of a micro-batch, without copying them.

    Returns:
        ``(packed [nnz, V], index [M], valid [B, T])``: the logits as ``[nnz, V]`` (a view of the hook's
        ``[1, nnz, V]``), the packed row of each of the M valid response slots in row-major order (the logits that
        predict them), and which slots are valid.
    """
    if logits.dim() == 3:
        if logits.shape[0] != 1:
            raise ValueError(f"packed logits must be [1, nnz, V] or [nnz, V], got {tuple(logits.shape)}")
        logits = logits[0]
    positions, valid = response_positions(data)
    nnz = int(data["input_ids"].offsets()[-1])
    if logits.shape[0] != nnz:
        raise ValueError(
            f"packed logits have {logits.shape[0]} rows for {nnz} tokens (sequence parallelism or a padded packed "
            "sequence, pad_to_length, are not supported)"
        )
    return logits, positions[valid].to(logits.device), valid


def scatter_response_values(values: torch.Tensor, data: TensorDict) -> torch.Tensor:
    """One value per response token -> the packed ``[1, nnz]`` layout the hook returns (zeros off the response); the
    inverse of ``no_padding_2_padding`` for such values. ``values``: the padded response layout ``[B, T]``, or ``[M]``
    for the valid slots in row-major order (as :func:`response_index` orders them). Differentiable."""
    positions, valid = response_positions(data)
    nnz = int(data["input_ids"].offsets()[-1])
    out = values.new_zeros(nnz)
    valid = valid.to(values.device)
    out[positions.to(values.device)[valid]] = values if values.dim() == 1 else values[valid]
    return out.unsqueeze(0)


@contextlib.contextmanager
def _rerouted(worker_group, name: str, replacement):
    """Within the block, ``worker_group.<name>`` is ``replacement(original, data, *args, **kwargs)``; restored on exit
    (a worker group binds its remote methods as instance attributes)."""
    owned = name in vars(worker_group)
    original = getattr(worker_group, name)

    def call(data, *args, **kwargs):
        if not isinstance(data, TensorDict):
            raise TypeError(f"{name} needs the engine workers' TensorDict request here, got {type(data)}")
        return replacement(original, data, *args, **kwargs)

    setattr(worker_group, name, call)
    try:
        yield worker_group
    finally:
        if owned:
            setattr(worker_group, name, original)
        else:
            delattr(worker_group, name)


@contextlib.contextmanager
def student_logits_in_update(worker_group):
    """Within the block, ``worker_group.update_actor`` sends ``distillation_use_topk=True`` with its request, so the
    engine calls the installed loss with ``student_logits=`` first (see the module docstring).

    verl's ``RayPPOTrainer._update_actor`` sets that flag only from verl's own distillation config; the loss installed
    on the actor must then accept the ``student_logits=`` call and return a dict of ``[1, nnz]`` tensors (e.g. built
    with :func:`response_index` and :func:`scatter_response_values`). The worker group's method is restored on exit.
    """
    check_distribution_support()
    # SYNC WARNING: verl/trainer/ppo/ray_trainer.py:RayPPOTrainer._update_actor (0.9.1 l.1327-1375: the request's
    # distillation_use_topk comes from verl's distillation config, then actor_rollout_wg.update_actor(batch_td))

    def update_actor(original, data, *args, **kwargs):
        tu.assign_non_tensor(data, distillation_use_topk=True)
        return original(data, *args, **kwargs)

    with _rerouted(worker_group, "update_actor", update_actor):
        yield worker_group
