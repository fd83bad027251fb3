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
"""Distribution-level passes: a model's next-token distribution at each response token, not only the sampled token's
log-prob (verl 0.9.x only).

verl 0.9.1's FSDP engine has one hook that hands a loss the student's logits: when a micro-batch carries the
non-tensor flag ``distillation_use_topk``, ``FSDPEngineWithLMHead.prepare_model_outputs`` calls
``loss_function(student_logits=[1, nnz, V], data=micro_batch)`` with the packed logits of the micro-batch (already
divided by the temperature) and puts each returned ``[1, nnz]`` tensor into the model output (gradient kept), before
the usual ``loss_function(model_output=..., data=..., dp_group=...)`` call. This module builds on that hook:

- layout helpers on the engine's micro-batch (packed rows, :func:`response_positions`):
  :func:`gather_response_log_probs` (full-vocabulary log-probs at given ids, differentiable),
  :func:`topk_response_log_probs` (the model's own top-k) and :func:`scatter_response_values` (one value per response
  token back to the packed ``[1, nnz]`` layout the hook must return);
- :func:`topk_log_probs`: a forward-only top-k (or given-ids) scoring on a verl ``TrainingWorker`` (actor or
  reference), through ``infer_batch`` with a temporary loss object that collects the top-k from the hook;
- :func:`student_logits_in_update`: a driver-side seam that makes verl's actor update set ``distillation_use_topk``,
  so the installed loss receives the student's logits;
- :func:`check_distribution_support`: a one-line refusal on a verl release without the hook.

Only sequence-parallel size 1 is supported: with Ulysses SP the hook sees a shard of the packed sequence.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu

from treetune_verl.version import installed_verl_version

__all__ = [
    "TOPK_IDS",
    "TOPK_K",
    "TopK",
    "check_distribution_support",
    "gather_response_log_probs",
    "response_positions",
    "scatter_response_values",
    "student_logits_in_update",
    "topk_log_probs",
    "topk_response_log_probs",
]

#: Request keys of the worker's top-k methods: the number of ids per token (non-tensor; 0 or the vocabulary size: the
#: whole vocabulary) and, optionally, the ids to score (tensor ``[B, T, k]``, int64, padded response layout).
TOPK_K, TOPK_IDS = "treetune_topk_k", "treetune_topk_ids"
# A column that follows each row through the engine's micro-batching (dynamic batch size reorders rows).
_ROW = "treetune_topk_row"


class TopK(NamedTuple):
    """Per response token ids and their full-vocabulary log-probs, padded response layout."""

    ids: torch.Tensor  #: ``[B, T, k]`` int64 (0 off the response)
    log_probs: torch.Tensor  #: ``[B, T, k]`` float32 (0 off the response)


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


def _response_rows(logits: torch.Tensor, data: TensorDict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(rows [M, V] float32, log-normaliser [M], valid [B, T])``: the logits of the M response-token positions."""
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
    rows = logits.index_select(0, positions[valid].to(logits.device)).float()
    return rows, torch.logsumexp(rows, dim=-1), valid


def _to_response_layout(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``values [M, k]`` of the valid slots -> ``[B, T, k]`` with zeros elsewhere (differentiable)."""
    out = values.new_zeros((*valid.shape, values.shape[-1]))
    out[valid.to(values.device)] = values
    return out


def gather_response_log_probs(logits: torch.Tensor, data: TensorDict, ids: torch.Tensor) -> torch.Tensor:
    """Full-vocabulary log-probs at ``ids`` for each response token: ``log_softmax(logits)[position, ids]``.

    The log-normaliser is computed once per response position and the ids' logits gathered from it; no ``[B, T, V]``
    copy is made. Differentiable with respect to ``logits``.

    Args:
        logits: packed logits of the micro-batch, ``[1, nnz, V]`` (as the hook passes them) or ``[nnz, V]``.
        data: the micro-batch (see :func:`response_positions`).
        ids: ``[B, T, k]`` int64 token ids per response slot (read at response tokens only).

    Returns:
        ``[B, T, k]`` float32 log-probs, 0 off the response.
    """
    rows, log_normaliser, valid = _response_rows(logits, data)
    picked = rows.gather(-1, ids.to(rows.device)[valid.to(rows.device)].long()) - log_normaliser[:, None]
    return _to_response_layout(picked, valid)


def topk_response_log_probs(logits: torch.Tensor, data: TensorDict, k: int) -> TopK:
    """The model's own ``k`` most likely ids per response token and their full-vocabulary log-probs (sorted
    descending); ``k=0`` or ``k=V`` gives the whole vocabulary. Arguments as :func:`gather_response_log_probs`."""
    vocab = logits.shape[-1]
    if not 0 <= k <= vocab:
        raise ValueError(f"top-k needs 0 <= k <= vocabulary size {vocab}, got k={k}")
    rows, log_normaliser, valid = _response_rows(logits, data)
    values, ids = rows.topk(k or vocab, dim=-1)
    return TopK(_to_response_layout(ids, valid), _to_response_layout(values - log_normaliser[:, None], valid))


def scatter_response_values(values: torch.Tensor, data: TensorDict) -> torch.Tensor:
    """One value per response token, padded response layout ``[B, T]`` -> the packed ``[1, nnz]`` layout the hook
    returns (zeros off the response); the inverse of ``no_padding_2_padding`` for such values. Differentiable."""
    positions, valid = response_positions(data)
    nnz = int(data["input_ids"].offsets()[-1])
    out = values.new_zeros(nnz)
    valid = valid.to(values.device)
    out[positions.to(values.device)[valid]] = values[valid]
    return out.unsqueeze(0)


class _TopKCollector:
    """A stand-in loss for one forward-only pass: collects the top-k from the hook's ``student_logits=`` call (and
    returns no model output there), and returns a zero loss from the loss call."""

    def __init__(self, k: int, with_ids: bool):
        self.k, self.with_ids = k, with_ids
        self.parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def __call__(self, *, data: TensorDict, student_logits=None, model_output=None, dp_group=None):
        # SYNC WARNING: verl/workers/engine/fsdp/transformer_impl.py:FSDPEngineWithLMHead.prepare_model_outputs (0.9.1
        # l.1411-1421 and l.1512: logits_processor_func(student_logits=, data=)) and .forward_step (0.9.1 l.1574:
        # loss_function(model_output=, data=, dp_group=) -> (loss, metrics))
        if student_logits is None:
            return torch.zeros((), device=data["input_ids"].device), {}
        if self.with_ids:
            ids = data[TOPK_IDS].long() * response_positions(data)[1][..., None].to(data[TOPK_IDS].device)
            log_probs = gather_response_log_probs(student_logits, data, ids)
        else:
            ids, log_probs = topk_response_log_probs(student_logits, data, self.k)
        self.parts.append((data[_ROW].cpu(), ids.cpu(), log_probs.float().cpu()))
        return {}

    def assemble(self, rows: int) -> TopK:
        """The collected parts in the request's row order: :class:`TopK` of ``[rows, T, k]``."""
        if not self.parts:
            raise RuntimeError(
                "the engine never called the loss with student_logits: the top-k hook needs the FSDP engine without "
                "fused kernels (actor_rollout_ref.model.use_fused_kernels=false)"
            )
        _, ids, log_probs = self.parts[0]
        out_ids = ids.new_zeros((rows, *ids.shape[1:]))
        out_log_probs = log_probs.new_zeros((rows, *log_probs.shape[1:]))
        seen = torch.zeros(rows, dtype=torch.long)
        for row, ids, log_probs in self.parts:
            out_ids[row], out_log_probs[row] = ids, log_probs
            seen[row] += 1
        if not bool((seen == 1).all()):
            raise RuntimeError(f"the top-k pass scored rows {seen.tolist()} times (each row must be scored once)")
        return TopK(out_ids, out_log_probs)


def topk_log_probs(training_worker, data: TensorDict, *, k: int, ids: torch.Tensor | None = None):
    """Forward-only top-k scoring of a request on a verl ``TrainingWorker`` (the actor or the reference).

    Runs the worker's ``infer_batch`` with ``compute_loss=True`` and ``distillation_use_topk=True`` and a temporary loss
    object that reads the engine's logits (divided by the request's temperature) at each response token; the worker's
    own loss function is put back afterwards. The engine's other outputs (``log_probs``, ``entropy`` when the request
    asks for it) come back as usual, from the same forward.

    Args:
        training_worker: ``verl.workers.engine_workers.TrainingWorker`` (``ActorRolloutRefWorker.actor`` or ``.ref``).
        data: an old-log-prob request (``left_right_2_no_padding`` layout, ``temperature`` and flags as verl's
            ``_compute_old_log_prob`` sends; ``B`` rows). Not modified.
        k: ids per token: the model's own top-k, sorted by descending log-prob; 0 or the vocabulary size ``V`` (the
            logits' width) for the whole vocabulary. Ignored when ``ids`` is given.
        ids: optional ``[B, T, k]`` int64 ids (padded response layout, the request's row order) to score instead.

    Returns:
        The ``infer_batch`` output (a ``TensorDict``) with ``topk_ids [B, T, k]`` (int64) and
        ``topk_log_probs [B, T, k]`` (float32, full-vocabulary log-probs) added, 0 off the response, in the request's
        row order; None on ranks that return no output (as ``infer_batch``).
    """
    check_distribution_support()
    request = data.copy()
    request[_ROW] = torch.arange(len(request))
    if ids is not None:
        if ids.dim() != 3 or ids.shape[0] != len(request):
            raise ValueError(f"ids must be [B={len(request)}, T, k], got {tuple(ids.shape)}")
        request[TOPK_IDS] = ids.long()
    # SYNC WARNING: verl/workers/engine_workers.py:TrainingWorker.infer_batch (0.9.1 l.398-441: the loss function is
    # self.loss_fn, used only when the request's compute_loss is True)
    tu.assign_non_tensor(request, compute_loss=True, distillation_use_topk=True, distillation_only=False)
    collector = _TopKCollector(k, with_ids=ids is not None)
    saved = training_worker.loss_fn
    training_worker.loss_fn = collector
    try:
        output = training_worker.infer_batch(request)
    finally:
        training_worker.loss_fn = saved
    if output is None:
        return None
    topk = collector.assemble(len(request))
    output["topk_ids"], output["topk_log_probs"] = topk.ids, topk.log_probs
    return output


def topk_log_probs_from_request(training_worker, data: TensorDict):
    """:func:`topk_log_probs` with ``k`` (non-tensor :data:`TOPK_K`) and the optional ids (:data:`TOPK_IDS`) read
    from the request, as the worker methods of ``treetune_verl.reference_refresh`` receive them."""
    k = tu.get_non_tensor_data(data=data, key=TOPK_K, default=None)
    ids = data.get(TOPK_IDS, None)
    if k is None and ids is None:
        raise ValueError(f"a top-k request needs the non-tensor {TOPK_K!r} or the tensor {TOPK_IDS!r}")
    request = data.exclude(TOPK_IDS) if ids is not None else data
    return topk_log_probs(training_worker, request, k=int(k or 0), ids=ids)


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
    with :func:`gather_response_log_probs` and :func:`scatter_response_values`). The worker group's method is
    restored on exit.
    """
    check_distribution_support()
    # SYNC WARNING: verl/trainer/ppo/ray_trainer.py:RayPPOTrainer._update_actor (0.9.1 l.1327-1375: the request's
    # distillation_use_topk comes from verl's distillation config, then actor_rollout_wg.update_actor(batch_td))

    def update_actor(original, data, *args, **kwargs):
        tu.assign_non_tensor(data, distillation_use_topk=True)
        return original(data, *args, **kwargs)

    with _rerouted(worker_group, "update_actor", update_actor):
        yield worker_group


@contextlib.contextmanager
def topk_in_log_prob_pass(worker_group, k: int):
    """Within the block, ``worker_group.compute_log_prob`` (verl's old-log-prob pass) runs as the worker's
    ``compute_topk_log_prob`` with ``k``: the same forward returns the log-probs and entropy verl reads and each
    response token's top-k ids and log-probs, which verl's pass would drop. Yields a dict that holds, after the call,
    :class:`TopK` ``"topk"`` (``[B, T, k]``, the request's row order; 0 or the vocabulary size: every id)."""
    check_distribution_support()
    # SYNC WARNING: verl/trainer/ppo/ray_trainer.py:RayPPOTrainer._compute_old_log_prob (0.9.1 l.1290-1325: one
    # actor_rollout_wg.compute_log_prob(batch_td) call, of which it keeps log_probs, entropy and metrics)
    captured: dict[str, TopK] = {}

    def compute_log_prob(original, data, *args, **kwargs):
        tu.assign_non_tensor(data, **{TOPK_K: int(k)})
        output = worker_group.compute_topk_log_prob(data, *args, **kwargs)
        captured["topk"] = TopK(output["topk_ids"].long(), output["topk_log_probs"].float())
        return output

    with _rerouted(worker_group, "compute_log_prob", compute_log_prob):
        yield captured
