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
"""OPSD, on-policy self-distillation (Zhao et al., arXiv 2601.18734; official code ``siyan-zhao/OPSD``): the policy
under a prompt holding the reference solution teaches the same policy under the plain prompt, on the student's own
samples. Two methods: ``opsd``, the paper's loss (JSD_β over the teacher's distribution), and ``opsd_token``, the
repository's sampled-token option. Agent-docs page: ``agent-docs/methods/opsd.md``."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from treetune_recipe.cpo.methods.advantage_terms import CPOTerms, as_wrapper
from treetune_recipe.cpo.methods.distribution_losses import opsd_token_loss
from treetune_recipe.cpo.methods.method import Distillation, Method, register_method
from treetune_verl.config_block import check_field_types

#: ``scripts/run_opsd.sh``: the teacher is the starting model (``--fixed_teacher``), sampling at τ = 1.1 with top-p 0.95
#: and top-k 20 (verl scores the trainer's and the teacher's log-probs at the rollout temperature too), one optimizer
#: update per rollout batch, no KL term (the reference worker that holds the fixed teacher exists only with the KL loss
#: on: it stays on with weight 0).
OPSD_RUN_SETTINGS = (
    "actor_rollout_ref.actor.kl_loss_coef=0",
    "actor_rollout_ref.actor.ppo_mini_batch_size=${data.train_batch_size}",
    "actor_rollout_ref.rollout.temperature=1.1",
    "actor_rollout_ref.rollout.top_p=0.95",
    "actor_rollout_ref.rollout.top_k=20",
)


@dataclass(frozen=True)
class OPSDKnobs:
    """``cpo.opsd.*``: the JSD's β and the teacher's top-k."""

    beta: float = field(
        default=0.5,
        metadata={
            "help": "β in [0, 1] of JSD_β = β·KL(T‖M) + (1-β)·KL(S‖M), M = (1-β)·S + β·T (every published run: 0.5)."
        },
    )
    top_k: int = field(
        default=0,
        metadata={
            "help": "k of the teacher's top-k the JSD is taken over (both sides renormalised there); 0 or the "
            "vocabulary size: the full vocabulary, the main script's setting (its top-k script uses 50)."
        },
    )

    def __post_init__(self):
        check_field_types(self, "cpo.opsd")
        if not 0 <= self.beta <= 1:
            raise ValueError(f"cpo.opsd.beta must lie in [0, 1], got {self.beta!r}.")
        if self.top_k < 0:
            raise ValueError(f"cpo.opsd.top_k must be an integer >= 0 (0: the full vocabulary), got {self.top_k!r}.")


def opsd_jsd(student: torch.Tensor, teacher: torch.Tensor, knobs: OPSDKnobs) -> torch.Tensor:
    """Per token: JSD_β(S, T) over the teacher's top-k ids, both distributions renormalised over them (exact over the
    full vocabulary when k covers it). ``student``/``teacher``: full-vocabulary log-probs at those ids, ``[B, T, k]``.

    The paper's Eq. and the official ``generalized_jsd_loss`` (``opsd_trainer.py``); averaged over response tokens by
    the loss (per sequence by default, as the official micro-batch of one row). The teacher's forward runs inside the
    update, beside the student's, on the same micro-batch, as in the official ``compute_loss``. Remaining differences
    are listed on the method's agent-docs page.
    """
    return opsd_token_loss(student, teacher, knobs.beta)


@as_wrapper
def opsd_token(x: CPOTerms, cfg) -> torch.Tensor:
    """V: Â = δ = g - o (padding as given). The verifier's advantage is not used.

    The repository's sampled-token option (``opsd_trainer.py``, ``use_tinker_loss``): each sampled token's advantage is
    the teacher's log-prob minus the student's, detached; a signal in every group, all-wrong ones included. Remaining
    differences: Â enters verl's clipped PPO surrogate (the official loss is the unclipped ``-Â·log π``; with one
    update per batch the two have the same gradient, Â·∇log π); the student term is ``old_log_probs`` (the code's
    current policy, detached: the same values with one update per batch).
    """
    return torch.where(x.valid, x.log_ratio, x.advantages)


register_method(
    Method(
        name="opsd",
        family="opsd",
        summary="JSD_β(student ‖ teacher) per token over the teacher's top-k, renormalised; replaces the PG loss",
        policy="none",
        distillation=Distillation(opsd_jsd, ids="teacher_topk", topk_knob="top_k"),
        published_teacher="initial",
        knobs=OPSDKnobs,
        run_settings=OPSD_RUN_SETTINGS,
    )
)
register_method(
    Method(
        name="opsd_token",
        family="opsd",
        summary="Â = g - o on every response token (OPSD's sampled-token option)",
        policy="shaped",
        advantage=opsd_token,
        published_teacher="initial",
        run_settings=OPSD_RUN_SETTINGS,
    )
)
