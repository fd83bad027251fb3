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
"""The recipe's actor loss for verl's engine workers: the selected method's terms, composed as it declares them.

Installed by the trainer with
``actor_rollout_wg.set_loss_fn(functools.partial(cpo_ppo_loss, config=<ActorConfig>, cpo=<CPOConfig>))``; the
partial is pickled by reference, so this module imports verl's worker modules only inside the function. A method
(``cpo.method``, :class:`treetune_recipe.cpo.methods.method.Method`) declares up to three terms, each with its
own mask, and their weights at the step's knobs (``Method.weights``); :func:`cpo_ppo_loss` adds them:

- the **policy term**: upstream ``ppo_loss`` (clipped PG, plus verl's KL and entropy terms) on a copy of the
  micro-batch whose advantages are the verifier's, the method's shaped ones (its wrapper; ``cpo.loss_position``
  restricts the tokens), or 0, times the term's weight; its mask is every response token (verl 0.9.1 and 0.7.1);
- the **distillation term** (verl 0.9.1): the update runs with ``distillation_use_topk`` (the trainer's
  ``student_logits_in_update``), so the engine first calls this loss with the student's logits of each micro-batch
  (:func:`method_token_loss`); the worker bound the teacher's forward to the loss (``teacher=``,
  ``TeacherWorker.set_loss_fn_with_teacher``), which scores the micro-batch's teacher rows (the context's prompt and
  the same response) on the same worker, and the per-token divergence is taken there, at the top-k ids the method
  names (:func:`distribution_token_loss`); nothing of shape ``[B, T, k]`` leaves the worker. The loss call weighs it
  (the method's token weight and verl's rollout correction) and averages it over the tokens of the rows with a
  teacher context (:func:`distillation_term`);
- the **reference term**: a penalty on the sampled tokens' log-ratio to verl's reference log-probs
  (:func:`reference_term`).
"""

import torch

from treetune_recipe.cpo.methods.advantage_terms import succeeded
from treetune_recipe.cpo.methods.core_algos import apply_loss_position

# Batch keys the CPO loss reads; the trainer adds the first three (names fixed) before the actor update.
CPO_BATCH_KEYS = ("teacher_log_probs", "seq_rewards", "difficulty", "old_log_probs", "advantages", "response_mask")
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


def teacher_top_keys(i: int) -> tuple[str, str]:
    """Model-output keys of the teacher's ``i``-th most likely id and its log-probability (credit dump)."""
    return f"cpo_teacher_top{i}_id", f"cpo_teacher_top{i}_log_prob"


def cpo_ppo_loss(config, model_output=None, data=None, dp_group=None, *, cpo, teacher=None, student_logits=None):
    """The selected method's loss: policy term + distillation term + reference term (see the module docstring). The
    engine's logits call (``student_logits=``) goes to :func:`method_token_loss`.

    Args:
        config: the actor's ``ActorConfig`` (as for upstream ``ppo_loss``).
        model_output: engine output; ``log_probs`` (and ``entropy`` for a shaped policy term), nested, no padding; a
            distillation term's per-token loss (:data:`TOKEN_LOSS`).
        data: the micro-batch ``TensorDict`` in the engine's no-padding format: verl's keys plus the recipe's
            (:data:`CPO_BATCH_KEYS` for a shaped policy term, :data:`DISTRIBUTION_BATCH_KEYS` for a distillation term,
            ``ref_log_prob`` for a reference term).
        dp_group: data-parallel group, passed through.
        cpo: a ``CPOConfig`` (the step's knobs).

    Returns:
        ``(loss, metrics)``: upstream's, plus ``cpo/*`` of a shaped policy term (:func:`_cpo_metrics`),
        ``actor/distill_loss``, ``cpo/token_loss``, ``cpo/token_weight`` of a distillation term and
        ``actor/reference_loss`` of a reference term. The caller's micro-batch is never modified (safe for
        ``ppo_epochs > 1``).
    """
    from verl.utils import tensordict_utils as tu

    if student_logits is not None:
        return method_token_loss(student_logits, data, cpo, teacher)
    if tu.get_non_tensor_data(data=data, key=DUMP_TEACHER_TOP, default=0):
        return torch.zeros((), device=data["response_mask"].device), {}  # the credit dump's forward-only pass
    method = cpo.selected_method
    weights = method.weights(cpo.knobs)
    loss, metrics = policy_term(config, model_output, data, dp_group, cpo, weights.policy)
    aggregation = metrics["actor/pg_loss"].aggregation  # how verl sums this micro-batch's losses into the step's
    if method.distillation is not None and weights.distillation:
        distill_loss, distill_metrics = distillation_term(config, model_output, data, cpo, aggregation)
        loss = loss + weights.distillation * distill_loss
        metrics.update(distill_metrics)
    if method.reference is not None:
        reference_loss, reference_metrics = reference_term(config, model_output, data, cpo, aggregation)
        loss = loss + reference_loss
        metrics.update(reference_metrics)
    return loss, metrics


def policy_term(config, model_output, data, dp_group, cpo, weight: float):
    """Upstream ``ppo_loss`` on a shallow copy of ``data`` whose advantages are the policy term's, times ``weight``
    (the clipped surrogate is linear in the advantages, so this is the term times ``weight``; verl's KL and entropy
    terms keep their own coefficients): the verifier's, or the method's wrapper applied to them (``shaped``, with the
    response mask restricted by ``cpo.loss_position``: the policy, entropy and KL terms then read only those tokens, as
    in the reference), or 0 (``none``)."""
    # SYNC WARNING: verl/workers/utils/losses.py:ppo_loss
    # SYNC WARNING: verl/workers/utils/padding.py:no_padding_2_padding
    # SYNC WARNING: verl/utils/metric/utils.py:Metric
    from verl.utils.metric import AggregationType, Metric
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import no_padding_2_padding

    method = cpo.selected_method
    advantages, response_mask = data["advantages"], data["response_mask"]
    shaped_metrics = {}
    if method.policy == "shaped":
        if model_output.get("entropy") is None:
            raise ValueError(
                "cpo_ppo_loss needs the current-policy entropy, but model_output has no 'entropy'. The update request "
                "must carry calculate_entropy=True: verl 0.9.1's trainer sends actor.calculate_entropy (the recipe "
                "sets it), verl 0.7.1's only when actor.entropy_coeff != 0 (the CPO trainer then requests it itself)."
            )
        missing = [key for key in CPO_BATCH_KEYS if key not in data.keys()]
        if missing:
            raise KeyError(
                f"cpo_ppo_loss: the batch lacks {missing}. The CPO trainer adds teacher_log_probs (the teacher's "
                "log-probs of the response), seq_rewards and difficulty before the actor update; is the CPO trainer in "
                "use?"
            )
        with torch.no_grad():
            entropy = no_padding_2_padding(model_output["entropy"], data).detach().to(advantages.dtype)
            new_advantages = method.advantage(
                advantages,
                teacher_log_probs=data["teacher_log_probs"],
                old_log_probs=data["old_log_probs"],
                entropy=entropy,
                response_mask=response_mask,
                seq_rewards=data["seq_rewards"],
                difficulty=data["difficulty"],
                cfg=cpo,
            )
            response_mask = apply_loss_position(response_mask, entropy, cpo.loss_position)
            shaped_metrics = _cpo_metrics(data, advantages, new_advantages, response_mask, cpo.success_value)
        advantages = new_advantages
    elif method.policy == "none":
        advantages = torch.zeros_like(advantages)
    shaped = data.copy()
    shaped["advantages"] = advantages * weight if weight != 1 else advantages
    shaped["response_mask"] = response_mask
    loss, metrics = ppo_loss(config, model_output, shaped, dp_group)
    metrics.update({key: Metric(AggregationType.MEAN, value) for key, value in shaped_metrics.items()})
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
            f"cpo_ppo_loss: cpo.method={cpo.method} needs the teacher's forward in the update; install the "
            "loss with the worker's set_loss_fn_with_teacher (the CPO trainer does)."
        )
    missing = [key for key in DISTRIBUTION_BATCH_KEYS if key not in data.keys()]
    if missing:
        raise KeyError(
            f"cpo_ppo_loss: cpo.method={cpo.method}: the batch lacks {missing} (the CPO trainer "
            "adds them with the teacher's columns)."
        )
    shown = int(tu.get_non_tensor_data(data=data, key=DUMP_TEACHER_TOP, default=0) or 0)
    packed, index, valid = response_index(student_logits, data)
    if (
        not shown and not cpo.selected_method.weights(cpo.knobs).distillation
    ):  # the term is off at these knobs: no teacher
        return {TOKEN_LOSS: scatter_response_values(packed.new_zeros(index.shape[0], dtype=torch.float32), data)}
    teacher_rows = teacher(data)
    if not torch.equal(valid.cpu(), teacher_rows.valid.cpu()):
        raise ValueError("the teacher's rows and the student's hold different response tokens")
    per_token = distribution_token_loss(cpo.selected_method, cpo.knobs, cpo.topk, packed, index, teacher_rows.logits)
    outputs = {TOKEN_LOSS: scatter_response_values(per_token, data)}
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
    """The method's distillation loss (``method.distillation.token_loss``) per response token, from the student's packed
    logits ``[nnz, V]`` at the rows ``index`` ``[M]`` and the teacher's logits ``[M, V]``: both turned into float32
    log-distributions, then, with ``0 < k < V``, gathered at the teacher's top-k ids (``teacher_topk``, OPSD) or at the
    student's (``student_topk``, SDPO; the ids carry no gradient); else the loss sees the whole vocabulary. ``-> [M]``,
    differentiable in ``student_logits``.

    Computed in pieces of ``chunk`` tokens (default: :data:`CHUNK_VALUES` values per copy), each recomputed in the
    backward pass (activation checkpointing): only one piece's float32 copies are alive at a time, not the
    micro-batch's.
    """

    def piece(student_logits: torch.Tensor, index: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
        student, teacher = _log_softmax(student_logits.index_select(0, index)), _log_softmax(teacher_logits)
        if k and k < student.shape[-1]:
            source = teacher if method.distillation.ids == "teacher_topk" else student.detach()
            ids = source.topk(k, dim=-1).indices
            student, teacher = student.gather(-1, ids), teacher.gather(-1, ids)
        return method.distillation.token_loss(student, teacher, knobs)

    chunk = chunk or _piece_tokens(student_logits.shape[-1])
    if index.shape[0] <= chunk:
        return piece(student_logits, index, teacher_logits)
    from torch.utils.checkpoint import checkpoint

    pieces = zip(_chunks(index, chunk), _chunks(teacher_logits, chunk), strict=True)
    return torch.cat([checkpoint(piece, student_logits, i, t, use_reentrant=False) for i, t in pieces])


def distillation_term(config, model_output: dict, data, cpo, aggregation):
    """``agg(c · g · w · ℓ)``: ``ℓ`` the logits call's per-token loss, ``w`` the method's detached token weight (1
    without one) times verl's rollout-correction weight when there is one, ``g`` the method's gate (1 without one),
    ``c`` = 1 on the tokens of a row with a teacher context, 0 elsewhere. ``cpo.token_loss_agg`` (null: the method's
    published one):

    - ``seq_mean``: Σ_rows [mean over row i's tokens of c·g·w·ℓ] / rows, over the mini-batch's rows on every DP rank
      (verl's ``seq-mean-token-mean``): the official SDPO and OPSD codes' per-sequence mean (a micro-batch of one
      row), where a row without a context counts as 0;
    - ``token_mean``: Σ c·g·w·ℓ / the mini-batch's response tokens on every DP rank (verl's ``token-mean``, SDPG's
      form, where a token without a context counts as 0).

    The term's mask never touches the policy term's, which keeps every row.
    """
    # SYNC WARNING: verl/workers/utils/losses.py:ppo_loss (sets config.global_batch_info, read by agg_loss) and
    # verl/trainer/ppo/core_algos.py:agg_loss (token-mean: masked sum / batch_num_tokens * dp_size; seq-mean-token-mean:
    # row means summed / global_batch_size * dp_size) and verl/workers/engine/fsdp/transformer_impl.py:
    # forward_backward_batch (batch_num_tokens = the mini-batch's loss_mask sum over DP ranks, loss_mask =
    # response_mask)
    from verl.trainer.ppo.core_algos import agg_loss
    from verl.utils.metric import AggregationType, Metric
    from verl.workers.utils.padding import no_padding_2_padding

    if TOKEN_LOSS not in model_output:
        raise KeyError(
            f"cpo_ppo_loss: cpo.method={cpo.method} needs the student's logits in the update, but the engine "
            f"returned no {TOKEN_LOSS!r}: the update must run with distillation_use_topk (the CPO trainer's "
            "student_logits_in_update) on verl 0.9.1's FSDP engine without fused kernels."
        )
    distillation = cpo.selected_method.distillation
    response_mask = data["response_mask"]
    context = data[CONTEXT_MASK].to(response_mask.dtype)[:, None]
    if distillation.gate is not None:
        context = context * distillation.gate(data["advantages"], cpo.knobs).to(response_mask.dtype)
    per_token = no_padding_2_padding(model_output[TOKEN_LOSS], data)
    if distillation.token_weight is not None:
        log_probs = no_padding_2_padding(model_output["log_probs"], data).detach()
        weight = distillation.token_weight(log_probs, data["old_log_probs"], cpo.knobs)
    else:
        weight = torch.ones_like(per_token)
    if "rollout_is_weights" in data.keys():  # verl's rollout correction, when on: the token loss is weighted too
        weight = weight * data["rollout_is_weights"]
    mode = {"seq_mean": "seq-mean-token-mean", "token_mean": "token-mean"}[cpo.distillation_agg]
    token_loss = agg_loss(
        loss_mat=per_token * weight * context, loss_mask=response_mask, loss_agg_mode=mode, **config.global_batch_info
    )
    metrics = {"actor/distill_loss": Metric(value=token_loss, aggregation=aggregation)}
    kept = (response_mask * context).bool()
    if kept.any():  # a micro-batch without a context token has no token loss to average (not a loss of 0)
        with torch.no_grad():
            for key, values in (("cpo/token_loss", per_token), ("cpo/token_weight", weight)):
                metrics[key] = Metric(AggregationType.MEAN, values.float()[kept].mean().item())
    return token_loss, metrics


def reference_term(config, model_output: dict, data, cpo, aggregation):
    """``weight · agg(penalty(log π(y_t) - log π_ref(y_t)))`` over every response token with the actor's
    ``loss_agg_mode`` (as verl's KL loss): ``log π`` the update's log-probs (with gradient), ``log π_ref`` verl's
    reference pass (``ref_log_prob``; the trainer keeps that pass for a method with a reference term)."""
    from verl.trainer.ppo.core_algos import agg_loss
    from verl.utils.metric import Metric
    from verl.workers.utils.padding import no_padding_2_padding

    if "ref_log_prob" not in data.keys():
        raise KeyError(
            f"cpo_ppo_loss: cpo.method={cpo.method} has a reference term but the batch has no ref_log_prob "
            "(verl's reference pass; the CPO trainer runs it for such a method)."
        )
    reference = cpo.selected_method.reference
    log_probs = no_padding_2_padding(model_output["log_probs"], data)
    penalty = reference.penalty(log_probs - data["ref_log_prob"], cpo.knobs)
    loss = agg_loss(
        loss_mat=penalty,
        loss_mask=data["response_mask"],
        loss_agg_mode=config.loss_agg_mode,
        **config.global_batch_info,
    )
    loss = float(getattr(cpo.knobs, reference.weight_knob)) * loss
    return loss, {"actor/reference_loss": Metric(value=loss, aggregation=aggregation)}
