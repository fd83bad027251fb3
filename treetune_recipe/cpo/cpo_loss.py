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
"""The CPO actor loss for verl's engine workers (0.9.1 and 0.7.1): shape the advantages, then run upstream ``ppo_loss``.

Installed once by the trainer with
``actor_rollout_wg.set_loss_fn(functools.partial(cpo_ppo_loss, config=<ActorConfig>, cpo=<CPOConfig>))``; the
partial is pickled by reference, so this module imports verl's worker modules only inside the function.
"""

import torch

from treetune_recipe.cpo.cpo_advantage_wrappers import get_cpo_wrapper
from treetune_recipe.cpo.cpo_core_algos import apply_loss_position

# Batch keys the CPO loss reads; the trainer adds the first three (names fixed) before the actor update.
CPO_BATCH_KEYS = ("gw_log_probs", "seq_rewards", "difficulty", "old_log_probs", "advantages", "response_mask")


def cpo_ppo_loss(config, model_output: dict, data, dp_group=None, *, cpo):
    """Upstream ``ppo_loss`` on a copy of the micro-batch whose advantages and response mask are CPO-shaped.

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
    correct = valid & (data["seq_rewards"] == success_value).unsqueeze(-1)
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
