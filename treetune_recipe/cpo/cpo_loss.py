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
computes is the selected method's (``cpo.wrap_method``, :mod:`treetune_recipe.cpo.methods`):

- an advantage method (verl 0.9.1 and 0.7.1): its wrapper shapes the advantages, ``cpo.loss_position`` restricts the
  tokens, upstream ``ppo_loss`` does the rest;
- a distribution-level method (verl 0.9.1): the update runs with ``distillation_use_topk`` (the trainer's
  ``student_logits_in_update``), so the engine first calls this loss with the student's logits
  (:func:`method_token_loss`): it gathers the student's full-vocabulary log-probs at the top-k ids of the batch and
  returns the method's per-token loss; the loss call then weighs it (``Method.token_weight``), averages it over the
  tokens of rows with a teacher context with verl's ``agg_loss``, and adds upstream ``ppo_loss`` with the advantages
  set to 0 when the method replaces the policy-gradient loss (its KL and entropy terms stay verl's).
"""

import torch

from treetune_recipe.cpo.cpo_advantage_wrappers import get_cpo_wrapper
from treetune_recipe.cpo.cpo_core_algos import apply_loss_position
from treetune_recipe.cpo.cpo_terms import succeeded

# Batch keys the CPO loss reads; the trainer adds the first three (names fixed) before the actor update.
CPO_BATCH_KEYS = ("gw_log_probs", "seq_rewards", "difficulty", "old_log_probs", "advantages", "response_mask")
#: Batch keys of a distribution-level method (the trainer adds them): the top-k ids of every response token, the
#: teacher's full-vocabulary log-probs there, and 1/0 per row: has a teacher context (0 masks the row out).
TOPK_IDS, TEACHER_TOPK_LOG_PROBS, CONTEXT_MASK = "cpo_topk_ids", "cpo_teacher_topk_log_probs", "cpo_context_mask"
DISTRIBUTION_BATCH_KEYS = (TOPK_IDS, TEACHER_TOPK_LOG_PROBS, CONTEXT_MASK, "old_log_probs", "response_mask")
#: The model-output key of the per-token loss the logits call returns.
TOKEN_LOSS = "cpo_token_loss"


def cpo_ppo_loss(config, model_output=None, data=None, dp_group=None, *, cpo, student_logits=None):
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
        return method_token_loss(student_logits, data, cpo)
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


def method_token_loss(student_logits: torch.Tensor, data, cpo) -> dict[str, torch.Tensor]:
    """The engine's logits call: the method's per-token loss ``[1, nnz]`` (packed layout; 0 off the response), from the
    student's full-vocabulary log-probs at the batch's top-k ids and the teacher's there."""
    from treetune_verl.distribution_pass import gather_response_log_probs, scatter_response_values

    missing = [key for key in DISTRIBUTION_BATCH_KEYS if key not in data.keys()]
    if missing:
        raise KeyError(
            f"cpo_ppo_loss: cpo.wrap_method={cpo.wrap_method} reads top-k distributions, but the batch lacks "
            f"{missing}; "
            "the CPO trainer adds them after its teacher pass."
        )
    student = gather_response_log_probs(student_logits, data, data[TOPK_IDS])
    per_token = cpo.method.token_loss(student, data[TEACHER_TOPK_LOG_PROBS].to(student.dtype), cpo.knobs)
    return {TOKEN_LOSS: scatter_response_values(per_token, data)}


def context_rows_only(response_mask: torch.Tensor, context_mask: torch.Tensor) -> torch.Tensor:
    """The response mask of a distribution-level method's update: the tokens of rows with a teacher context.

    The trainer sends it as the update's ``response_mask``, so verl's engine counts the loss's tokens (its
    ``batch_num_tokens``, per mini-batch and over the DP ranks) over exactly these, and ``token-mean`` is the mean over
    the tokens that have a teacher, as SDPO's official loss normalises."""
    return response_mask * context_mask.to(response_mask.dtype)[:, None]


def distribution_loss(config, model_output: dict, data, dp_group, cpo):
    """``agg_loss(w·ℓ, response_mask)`` plus upstream ``ppo_loss`` on the same tokens (advantages 0 when the method
    replaces the policy-gradient loss). ``ℓ`` is the logits call's per-token loss, ``w`` the method's detached token
    weight (1 without one) times verl's rollout-correction weight when there is one; ``response_mask`` is the
    update's, i.e. :func:`context_rows_only` (and the context mask is applied again here, so that a batch sent
    without it still never trains a row without a teacher)."""
    # SYNC WARNING: verl/workers/utils/losses.py:ppo_loss (sets config.global_batch_info, read by agg_loss) and
    # verl/trainer/ppo/core_algos.py:agg_loss (token-mean: masked sum / batch_num_tokens * dp_size) and
    # verl/workers/engine/fsdp/transformer_impl.py:forward_backward_batch (batch_num_tokens = the mini-batch's
    # loss_mask sum over DP ranks, loss_mask = response_mask)
    from verl.trainer.ppo.core_algos import agg_loss
    from verl.utils import tensordict_utils as tu
    from verl.utils.metric import AggregationType, Metric
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import no_padding_2_padding

    if TOKEN_LOSS not in model_output:
        raise KeyError(
            f"cpo_ppo_loss: cpo.wrap_method={cpo.wrap_method} needs the student's logits in the update, but the engine "
            f"returned no {TOKEN_LOSS!r}: the update must run with distillation_use_topk (the CPO trainer's "
            "student_logits_in_update) on verl 0.9.1's FSDP engine without fused kernels."
        )
    loss_mask = context_rows_only(data["response_mask"], data[CONTEXT_MASK])
    per_token = no_padding_2_padding(model_output[TOKEN_LOSS], data)
    if cpo.method.token_weight is not None:
        log_probs = no_padding_2_padding(model_output["log_probs"], data).detach()
        weight = cpo.method.token_weight(log_probs, data["old_log_probs"], cpo.knobs)
    else:
        weight = torch.ones_like(per_token)
    if "rollout_is_weights" in data.keys():  # verl's rollout correction, when on: the token loss is weighted too
        weight = weight * data["rollout_is_weights"]
    shaped = data.copy()
    shaped["response_mask"] = loss_mask
    if cpo.method.replaces_policy_loss:
        shaped["advantages"] = torch.zeros_like(data["advantages"])
    if not tu.get_non_tensor_data(data=shaped, key="batch_num_tokens", default=1):
        # A mini-batch without a single context token: every term is 0 (not 0/0).
        tu.assign_non_tensor(shaped, batch_num_tokens=1)
    loss, metrics = ppo_loss(config, model_output, shaped, dp_group)
    token_loss = agg_loss(
        loss_mat=per_token * weight, loss_mask=loss_mask, loss_agg_mode=config.loss_agg_mode, **config.global_batch_info
    )
    aggregation = metrics["actor/pg_loss"].aggregation
    metrics["actor/distill_loss"] = Metric(value=token_loss, aggregation=aggregation)
    kept = loss_mask.bool()
    if kept.any():  # a micro-batch without a context row has no token loss to average (not a loss of 0)
        with torch.no_grad():
            for key, values in (("cpo/token_loss", per_token), ("cpo/token_weight", weight)):
                metrics[key] = Metric(AggregationType.MEAN, values.float()[kept].mean().item())
    return loss + token_loss, metrics
