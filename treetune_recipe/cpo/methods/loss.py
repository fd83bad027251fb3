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
"""The recipe's actor loss for verl's engine workers: every method's loss, then upstream ``ppo_loss``.

Installed by the trainer with
``actor_rollout_wg.set_loss_fn(functools.partial(cpo_ppo_loss, config=<ActorConfig>, cpo=<CPOConfig>))``; the
partial is pickled by reference, so this module imports verl's worker modules only inside the function. What it
computes is the selected method's (``cpo.wrap_method``, :mod:`treetune_recipe.cpo.methods.method`):

- an advantage method (verl 0.9.1 and 0.7.1): its wrapper shapes the advantages, ``cpo.loss_position`` restricts the
  tokens, upstream ``ppo_loss`` does the rest;
- a distribution-level method (verl 0.9.1): the update runs with ``distillation_use_topk`` (the trainer's
  ``student_logits_in_update``), so the engine first calls this loss with the student's logits of each micro-batch
  (:func:`method_token_loss`); the worker bound the teacher's forward to the loss (``teacher=``,
  ``RefreshableReferenceWorker.set_loss_fn_with_teacher``), which scores the micro-batch's teacher rows (the context's
  prompt and the same response) on the same worker. The method's per-token loss is taken from the two
  distributions there, at the top-k ids it names (:func:`distribution_token_loss`); nothing of shape
  ``[B, T, k]`` leaves the worker. The loss call then weighs it (``Method.token_weight`` and verl's rollout
  correction), aggregates it (``cpo.token_loss_agg``: a per-sequence mean over every row, rows without a teacher
  context counting as 0, or a token mean over the context rows' tokens) and adds upstream ``ppo_loss``, with the
  advantages set to 0 when the method replaces the policy-gradient loss (its KL and entropy terms stay verl's).
"""

import torch

from treetune_recipe.cpo.methods.advantage_terms import succeeded
from treetune_recipe.cpo.methods.core_algos import apply_loss_position
from treetune_recipe.cpo.methods.registry import get_cpo_wrapper

# Batch keys the CPO loss reads; the trainer adds the first three (names fixed) before the actor update.
CPO_BATCH_KEYS = ("gw_log_probs", "seq_rewards", "difficulty", "old_log_probs", "advantages", "response_mask")
#: Batch key of a distribution-level method (the trainer adds it beside the teacher's token columns,
#: ``treetune_verl.update_teacher.TEACHER_COLUMNS``): 1/0 per row, has a teacher context (0: the row has no teacher).
CONTEXT_MASK = "cpo_context_mask"
DISTRIBUTION_BATCH_KEYS = (CONTEXT_MASK, "old_log_probs", "response_mask")
#: The model-output key of the per-token loss the logits call returns.
TOKEN_LOSS = "cpo_token_loss"
#: Non-tensor request flag of the credit dump's forward-only pass: n > 0 makes the logits call also return the teacher's
#: n most likely ids and their log-probs per response token (model outputs :func:`teacher_top_keys`), and the loss
#: call a zero loss.
DUMP_TEACHER_TOP = "cpo_dump_teacher_top"
#: How a distribution-level token loss is averaged (``cpo.token_loss_agg``).
TOKEN_LOSS_AGGS = ("seq_mean", "token_mean")


def teacher_top_keys(i: int) -> tuple[str, str]:
    """Model-output keys of the teacher's ``i``-th most likely id and its log-probability (credit dump)."""
    return f"cpo_teacher_top{i}_id", f"cpo_teacher_top{i}_log_prob"


def cpo_ppo_loss(config, model_output=None, data=None, dp_group=None, *, cpo, teacher=None, student_logits=None):
    """The selected method's loss (see the module docstring); the engine's logits call (``student_logits=``) goes to
    :func:`method_token_loss`, a distribution-level method's loss call to :func:`distribution_loss`, and an advantage
    method's to the CPO-shaped ``ppo_loss`` below.

    Upstream ``ppo_loss`` on a copy of the micro-batch whose advantages and response mask are CPO-shaped.

    Steps: pad the current-policy entropy back to ``[B, T]`` (detached); apply the ``cpo.wrap_method`` wrapper to
    the advantages; restrict the response mask with ``cpo.loss_position`` (it then applies to the policy loss,
    the entropy term and the KL loss, as in the reference); call upstream ``ppo_loss`` on a shallow copy of
    ``data`` holding the two new tensors, so the caller's micro-batch is never modified (safe for
    ``ppo_epochs > 1``).

    Args:
        config: the actor's ``ActorConfig`` (as for upstream ``ppo_loss``).
        model_output: engine output; needs ``log_probs`` and ``entropy`` (nested, no padding).
        data: the micro-batch ``TensorDict`` in the engine's no-padding format with the CPO keys
            ``gw_log_probs [B, T]``, ``seq_rewards [B]``, ``difficulty [B]``.
        dp_group: data-parallel group, passed through.
        cpo: a ``CPOConfig`` (any object with ``wrap_method, loss_position, cpo_lambda, pos_alpha, neg_alpha,
            success_value``).

    Returns:
        (loss, metrics): upstream's, plus ``cpo/*`` metrics (micro-batch means, aggregated like verl's
        ``pg_clipfrac``) over the valid tokens of the original mask: ``adv_delta_mean``, ``adv_delta_absmean``,
        ``adv_delta_absmean/{correct,wrong}`` (0 for a micro-batch without such responses), ``changed_token_frac``,
        ``loss_token_frac`` (share kept by ``loss_position``). Statistics of the hint log-ratio itself do not
        depend on the update and are logged exactly by the trainer instead.
    """
    if student_logits is not None:
        return method_token_loss(student_logits, data, cpo, teacher)
    if cpo.method.distribution_level:
        return distribution_loss(config, model_output, data, dp_group, cpo)
    # SYNC WARNING: verl/workers/utils/losses.py:ppo_loss
    # SYNC WARNING: verl/workers/utils/padding.py:no_padding_2_padding
    # SYNC WARNING: verl/utils/metric/utils.py:Metric
    from verl.utils.metric import AggregationType, Metric
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import no_padding_2_padding

    if model_output.get("entropy") is None:
        raise ValueError(
            "cpo_ppo_loss needs the current-policy entropy, but model_output has no 'entropy'. The update request "
            "must carry calculate_entropy=True: verl 0.9.1's trainer sends actor.calculate_entropy (the recipe sets "
            "it), verl 0.7.1's only when actor.entropy_coeff != 0 (the CPO trainer then requests it itself)."
        )
    missing = [key for key in CPO_BATCH_KEYS if key not in data.keys()]
    if missing:
        raise KeyError(
            f"cpo_ppo_loss: the batch lacks {missing}. The CPO trainer adds gw_log_probs (hint-guided log-probs of "
            "the response), seq_rewards and difficulty before the actor update; is the CPO trainer in use?"
        )

    advantages, response_mask = data["advantages"], data["response_mask"]
    with torch.no_grad():
        entropy = no_padding_2_padding(model_output["entropy"], data).detach().to(advantages.dtype)
        wrapper = get_cpo_wrapper(cpo.wrap_method)
        new_advantages = wrapper(
            advantages,
            gw_log_probs=data["gw_log_probs"],
            old_log_probs=data["old_log_probs"],
            entropy=entropy,
            response_mask=response_mask,
            seq_rewards=data["seq_rewards"],
            difficulty=data["difficulty"],
            cfg=cpo,
        )
        loss_mask = apply_loss_position(response_mask, entropy, cpo.loss_position)
        cpo_metrics = _cpo_metrics(data, advantages, new_advantages, loss_mask, cpo.success_value)

    data = data.copy()
    data["advantages"] = new_advantages
    data["response_mask"] = loss_mask
    loss, metrics = ppo_loss(config, model_output, data, dp_group)
    metrics.update({key: Metric(AggregationType.MEAN, value) for key, value in cpo_metrics.items()})
    return loss, metrics


def _cpo_metrics(data, advantages, new_advantages, loss_mask, success_value: float) -> dict[str, float]:
    """Masked means over the valid tokens of the original response mask (one host sync for all of them)."""
    valid = data["response_mask"].bool()
    correct = valid & succeeded(data["seq_rewards"], success_value).unsqueeze(-1)
    wrong = valid & ~correct
    delta = new_advantages - advantages
    terms = {
        "cpo/adv_delta_mean": (delta, valid),
        "cpo/adv_delta_absmean": (delta.abs(), valid),
        "cpo/adv_delta_absmean/correct": (delta.abs(), correct),
        "cpo/adv_delta_absmean/wrong": (delta.abs(), wrong),
        "cpo/changed_token_frac": (delta != 0, valid),
        "cpo/loss_token_frac": (loss_mask.bool(), valid),
    }
    means = torch.stack(
        [torch.where(mask, values.float(), 0.0).sum() / mask.sum().clamp(min=1) for values, mask in terms.values()]
    )
    return dict(zip(terms, means.tolist(), strict=True))


def method_token_loss(student_logits: torch.Tensor, data, cpo, teacher) -> dict[str, torch.Tensor]:
    """The engine's logits call: the method's per-token loss ``[1, nnz]`` (packed layout; 0 off the response) from the
    student's logits of the micro-batch and the teacher's, whose forward ``teacher`` runs here
    (``treetune_verl.update_teacher.UpdateTeacher``); with :data:`DUMP_TEACHER_TOP` also the teacher's top ids."""
    from verl.utils import tensordict_utils as tu

    from treetune_verl.logits_hook import response_index, scatter_response_values

    if teacher is None:
        raise RuntimeError(
            f"cpo_ppo_loss: cpo.wrap_method={cpo.wrap_method} needs the teacher's forward in the update; install the "
            "loss with the worker's set_loss_fn_with_teacher (the CPO trainer does)."
        )
    missing = [key for key in DISTRIBUTION_BATCH_KEYS if key not in data.keys()]
    if missing:
        raise KeyError(
            f"cpo_ppo_loss: cpo.wrap_method={cpo.wrap_method}: the batch lacks {missing} (the CPO trainer "
            "adds them with the teacher's columns)."
        )
    teacher_rows = teacher(data)
    packed, index, valid = response_index(student_logits, data)
    if not torch.equal(valid.cpu(), teacher_rows.valid.cpu()):
        raise ValueError("the teacher's rows and the student's hold different response tokens")
    per_token = distribution_token_loss(cpo.method, cpo.knobs, cpo.topk, packed, index, teacher_rows.logits)
    outputs = {TOKEN_LOSS: scatter_response_values(per_token, data)}
    shown = int(tu.get_non_tensor_data(data=data, key=DUMP_TEACHER_TOP, default=0) or 0)
    if shown:
        with torch.no_grad():
            chunks = [
                _log_softmax(rows).topk(min(shown, rows.shape[-1]), dim=-1)
                for rows in _chunks(teacher_rows.logits, _piece_tokens(teacher_rows.logits.shape[-1]))
            ]
        ids, log_probs = torch.cat([c.indices for c in chunks]), torch.cat([c.values for c in chunks])
        for i in range(ids.shape[-1]):
            id_key, log_prob_key = teacher_top_keys(i)
            outputs[id_key] = scatter_response_values(ids[:, i].to(per_token.dtype), data)
            outputs[log_prob_key] = scatter_response_values(log_probs[:, i].to(per_token.dtype), data)
    return outputs


#: Response tokens per piece of a distribution-level loss: about this many float32 values per ``[tokens, V]`` copy
#: (2^26: 256 MB; 441 tokens of Qwen3's 151,936 ids), whatever the micro-batch's size.
CHUNK_VALUES = 2**26


def _log_softmax(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1)


def _piece_tokens(vocab: int) -> int:
    """Response tokens per piece: :data:`CHUNK_VALUES` float32 values per ``[tokens, vocab]`` copy, at least one."""
    return max(1, CHUNK_VALUES // vocab)


def _chunks(rows: torch.Tensor, chunk: int) -> list[torch.Tensor]:
    return [rows[start : start + chunk] for start in range(0, rows.shape[0], chunk)]


def distribution_token_loss(
    method, knobs, k: int, student_logits: torch.Tensor, index: torch.Tensor, teacher_logits: torch.Tensor, chunk=None
) -> torch.Tensor:
    """``method.token_loss`` per response token, from the student's packed logits ``[nnz, V]`` at the rows ``index``
    ``[M]`` and the teacher's logits ``[M, V]``: both turned into float32 log-distributions, then, with ``0 < k < V``,
    gathered at the teacher's top-k ids (``teacher_topk``, OPSD) or at the student's (``student_topk``, SDPO; the ids
    carry no gradient); else the loss sees the whole vocabulary. ``-> [M]``, differentiable in ``student_logits``.

    Computed in pieces of ``chunk`` tokens (default: :data:`CHUNK_VALUES` values per copy), each recomputed in the
    backward pass (activation checkpointing): only one piece's float32 copies are alive at a time, not the
    micro-batch's.
    """

    def piece(student_logits: torch.Tensor, index: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
        student, teacher = _log_softmax(student_logits.index_select(0, index)), _log_softmax(teacher_logits)
        if k and k < student.shape[-1]:
            source = teacher if method.teacher_pass == "teacher_topk" else student.detach()
            ids = source.topk(k, dim=-1).indices
            student, teacher = student.gather(-1, ids), teacher.gather(-1, ids)
        return method.token_loss(student, teacher, knobs)

    chunk = chunk or _piece_tokens(student_logits.shape[-1])
    if index.shape[0] <= chunk:
        return piece(student_logits, index, teacher_logits)
    from torch.utils.checkpoint import checkpoint

    pieces = zip(_chunks(index, chunk), _chunks(teacher_logits, chunk), strict=True)
    return torch.cat([checkpoint(piece, student_logits, i, t, use_reentrant=False) for i, t in pieces])


def context_rows_only(response_mask: torch.Tensor, context_mask: torch.Tensor) -> torch.Tensor:
    """The response mask of a distribution-level method's update: the tokens of rows with a teacher context.

    The trainer sends it as the update's ``response_mask``, so verl's engine counts the loss's tokens (its
    ``batch_num_tokens``, per mini-batch and over the DP ranks) over exactly these, and ``token-mean`` is the mean over
    the tokens that have a teacher, as SDPO's official loss normalises."""
    return response_mask * context_mask.to(response_mask.dtype)[:, None]


def distribution_loss(config, model_output: dict, data, dp_group, cpo):
    """The distribution term ``agg(w·ℓ)`` plus upstream ``ppo_loss`` (advantages 0 when the method replaces the
    policy-gradient loss). ``ℓ`` is the logits call's per-token loss, ``w`` the method's detached token weight (1
    without one) times verl's rollout-correction weight when there is one. ``cpo.token_loss_agg``:

    - ``seq_mean``: Σ_rows [c_i · mean over row i's tokens of w·ℓ] / rows, over the mini-batch's rows on every DP rank
      (verl's ``seq-mean-token-mean``), c_i = 1 for a row with a teacher context, 0 without: the official codes'
      per-sequence mean (a micro-batch of one row), where a row without a context counts as 0;
    - ``token_mean``: Σ w·ℓ over the tokens of rows with a context / their number; the update's response mask is then
      :func:`context_rows_only` (the trainer sends it), so verl's token count is theirs.
    """
    # SYNC WARNING: verl/workers/utils/losses.py:ppo_loss (sets config.global_batch_info, read by agg_loss) and
    # verl/trainer/ppo/core_algos.py:agg_loss (token-mean: masked sum / batch_num_tokens * dp_size; seq-mean-token-mean:
    # row means summed / global_batch_size * dp_size) and verl/workers/engine/fsdp/transformer_impl.py:
    # forward_backward_batch (batch_num_tokens = the mini-batch's loss_mask sum over DP ranks, loss_mask =
    # response_mask)
    from verl.trainer.ppo.core_algos import agg_loss
    from verl.utils import tensordict_utils as tu
    from verl.utils.metric import AggregationType, Metric
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import no_padding_2_padding

    if tu.get_non_tensor_data(data=data, key=DUMP_TEACHER_TOP, default=0):
        return torch.zeros((), device=data["response_mask"].device), {}  # the credit dump's forward-only pass
    if TOKEN_LOSS not in model_output:
        raise KeyError(
            f"cpo_ppo_loss: cpo.wrap_method={cpo.wrap_method} needs the student's logits in the update, but the engine "
            f"returned no {TOKEN_LOSS!r}: the update must run with distillation_use_topk (the CPO trainer's "
            "student_logits_in_update) on verl 0.9.1's FSDP engine without fused kernels."
        )
    context = data[CONTEXT_MASK].to(data["response_mask"].dtype)[:, None]
    per_token = no_padding_2_padding(model_output[TOKEN_LOSS], data)
    if cpo.method.token_weight is not None:
        log_probs = no_padding_2_padding(model_output["log_probs"], data).detach()
        weight = cpo.method.token_weight(log_probs, data["old_log_probs"], cpo.knobs)
    else:
        weight = torch.ones_like(per_token)
    if "rollout_is_weights" in data.keys():  # verl's rollout correction, when on: the token loss is weighted too
        weight = weight * data["rollout_is_weights"]
    shaped = data.copy()
    if cpo.method.replaces_policy_loss:
        shaped["advantages"] = torch.zeros_like(data["advantages"])
    if cpo.token_loss_agg == "token_mean":
        # The context mask is applied again, so that a batch sent without the trainer's mask never trains such a row.
        shaped["response_mask"] = context_rows_only(data["response_mask"], data[CONTEXT_MASK])
        if not tu.get_non_tensor_data(data=shaped, key="batch_num_tokens", default=1):
            # A mini-batch without a single context token: every term is 0 (not 0/0).
            tu.assign_non_tensor(shaped, batch_num_tokens=1)
    loss, metrics = ppo_loss(config, model_output, shaped, dp_group)
    if cpo.token_loss_agg == "token_mean":
        loss_mat, loss_mask, mode = per_token * weight, shaped["response_mask"], "token-mean"
    else:
        loss_mat, loss_mask, mode = per_token * weight * context, data["response_mask"], "seq-mean-token-mean"
    token_loss = agg_loss(loss_mat=loss_mat, loss_mask=loss_mask, loss_agg_mode=mode, **config.global_batch_info)
    aggregation = metrics["actor/pg_loss"].aggregation
    metrics["actor/distill_loss"] = Metric(value=token_loss, aggregation=aggregation)
    kept = (data["response_mask"] * context).bool()
    if kept.any():  # a micro-batch without a context row has no token loss to average (not a loss of 0)
        with torch.no_grad():
            for key, values in (("cpo/token_loss", per_token), ("cpo/token_weight", weight)):
                metrics[key] = Metric(AggregationType.MEAN, values.float()[kept].mean().item())
    return loss + token_loss, metrics
