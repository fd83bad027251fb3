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
"""SDPO, self-distillation policy optimisation (arXiv 2601.20802; official code ``lasgroup/SDPO``, a verl fork): the
policy, shown a response of the same prompt group that the verifier accepted, teaches the policy without it; the loss
is an α-mixture JSD over the student's top-k (plus a tail bucket), weighted by a clipped importance ratio, and it
replaces the policy-gradient loss. The teacher is an exponential moving average of the policy. Agent-docs page:
``agent-docs/methods/sdpo.md``. The whole method is declared here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from treetune_recipe.cpo.methods.distribution_losses import clipped_importance_weight, sdpo_token_loss
from treetune_recipe.cpo.methods.method import Distillation, Method, TermWeights, register_method
from treetune_verl.config_block import check_field_types

#: TRL's ``sdpo_policy_loss_mode`` values (``trl/experimental/sdpo``, the version that has the knob).
POLICY_LOSS_MODES = ("distillation_only", "policy_only", "hybrid")


@dataclass(frozen=True)
class SDPOKnobs:
    """``cpo.sdpo.*``: the published defaults of ``sdpo.yaml`` (Qwen3-8B runs)."""

    alpha: float = field(
        default=0.5,
        metadata={"help": "α in [0, 1]: 0 gives KL(T‖S), 1 gives KL(S‖T), between: the α-mixture JSD (default 0.5)."},
    )
    top_k: int = field(
        default=100,
        metadata={"help": "k of the student's top-k (plus one tail bucket for the rest of the mass); 0: all ids."},
    )
    is_clip: float = field(
        default=2.0,
        metadata={"help": "Each token's loss is weighted by the detached ratio π/π_old clipped at this value (> 0)."},
    )
    exclude_self: bool = field(
        default=True,
        metadata={"help": "A correct sample is never its own teacher's context (dont_reprompt_on_self_success)."},
    )
    policy_loss_mode: str = field(
        default="distillation_only",
        metadata={
            "help": "TRL's sdpo_policy_loss_mode: distillation_only (the published SDPO loss), policy_only (GRPO's "
            "clipped loss alone) or hybrid (GRPO's clipped loss + distillation_weight x the distillation loss)."
        },
    )
    distillation_weight: float = field(
        default=1.0,
        metadata={"help": "TRL's distillation_weight (>= 0): the distillation term's weight (TRL's default 1.0)."},
    )

    def __post_init__(self):
        check_field_types(self, "cpo.sdpo")
        if not 0 <= self.alpha <= 1:
            raise ValueError(f"cpo.sdpo.alpha must lie in [0, 1], got {self.alpha!r}.")
        if self.top_k < 0:
            raise ValueError(f"cpo.sdpo.top_k must be an integer >= 0 (0: every id), got {self.top_k!r}.")
        if not self.is_clip > 0:
            raise ValueError(f"cpo.sdpo.is_clip must be a number > 0, got {self.is_clip!r}.")
        if self.policy_loss_mode not in POLICY_LOSS_MODES:
            raise ValueError(
                f"cpo.sdpo.policy_loss_mode must be one of {', '.join(POLICY_LOSS_MODES)}, "
                f"got {self.policy_loss_mode!r}."
            )
        if not self.distillation_weight >= 0:
            raise ValueError(f"cpo.sdpo.distillation_weight must be >= 0, got {self.distillation_weight!r}.")


def sdpo_divergence(student: torch.Tensor, teacher: torch.Tensor, knobs: SDPOKnobs) -> torch.Tensor:
    """Per token: the α-divergence of the (k+1)-way distributions [p(top-k ids), 1 - Σ p] of student and teacher,
    ``student``/``teacher`` being full-vocabulary log-probs at the student's top-k ids ``[B, T, k]``.

    The official ``core_algos.py`` self-distillation loss; the loss multiplies it by :func:`sdpo_weight` and averages
    over the tokens that have a teacher context. Remaining differences are listed on the method's agent-docs page.
    """
    return sdpo_token_loss(student, teacher, knobs.alpha)


def sdpo_weight(log_probs: torch.Tensor, old_log_probs: torch.Tensor, knobs: SDPOKnobs) -> torch.Tensor:
    """w = min(π/π_old, ``is_clip``) per token, detached (π the policy in the update, π_old the rollout policy)."""
    return clipped_importance_weight(log_probs, old_log_probs, max_ratio=knobs.is_clip)


def sdpo_terms(knobs: SDPOKnobs) -> TermWeights:
    """TRL's ``sdpo_policy_loss_mode``: ``distillation_only``: L = w·L_distill (the published SDPO loss, w = 1);
    ``policy_only``: L = L_PG (GRPO's clipped loss, no teacher forward); ``hybrid``: L = L_PG + w·L_distill, w =
    ``distillation_weight``. (TRL's later releases replaced the mode by a convex weight, (1-w)·L_PG + w·L_distill:
    ``hybrid`` with weight w/(1-w) and the learning rate times (1-w) is the same update.)"""
    policy = 0.0 if knobs.policy_loss_mode == "distillation_only" else 1.0
    distillation = 0.0 if knobs.policy_loss_mode == "policy_only" else float(knobs.distillation_weight)
    return TermWeights(policy, distillation)


register_method(
    Method(
        name="sdpo",
        family="sdpo",
        summary="min(π/π_old, 2)·JSD_α over the student's top-k + tail, teacher shown a successful sibling; "
        "replaces the PG loss",
        policy="verifier",
        distillation=Distillation(sdpo_divergence, ids="student_topk", topk_knob="top_k", token_weight=sdpo_weight),
        term_weights=sdpo_terms,
        context="successful_sibling",
        published_teacher="ema",
        knobs=SDPOKnobs,
        # sdpo.yaml / run_sdpo_all.sh: mini-batch = batch (one update per rollout); the loss weighted by verl's
        # token-level rollout importance ratio, clipped at 2 (rollout_correction.rollout_is); no KL loss (the
        # reference worker that holds the EMA teacher exists only with the KL loss on: it stays on with weight 0, and
        # its unread log-prob pass is skipped).
        run_settings=(
            "actor_rollout_ref.actor.kl_loss_coef=0",
            "actor_rollout_ref.actor.ppo_mini_batch_size=${data.train_batch_size}",
            "algorithm.rollout_correction.rollout_is=token",
            "algorithm.rollout_correction.rollout_is_threshold=2.0",
        ),
    )
)
