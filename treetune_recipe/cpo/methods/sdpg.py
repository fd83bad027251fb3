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
"""SDPG, self-distilled policy gradient (arXiv 2606.04036; official code ``yifanzhang-pro/SDPG`` @ 0c818c0a, on verl):
GRPO's clipped loss on the verifier's advantages, plus β times the exact full-vocabulary KL(π_θ(·|x) ‖ π_θ(·|c, x))
between the current policy without and with an answer-only context (the teacher is the current policy itself, no
gradient through it), plus α times a regulariser toward the frozen reference on the sampled tokens. The whole method
is declared here; agent-docs page: ``agent-docs/methods/sdpg.md``.

Official code read: ``verl/trainer/ppo/core_algos.py`` (``compute_sdpg_loss``, ``_compute_effective_beta``) and
``verl/workers/actor/dp_actor.py`` (``_compute_kl_distill_micro_batch``: per micro-batch, a no-grad teacher forward of
the same actor, then the student's, then one backward), and the Qwen3-4B script ``run_qwen3_4b_sdpg_boxed.sh``, whose
values are the defaults here. Remaining differences (listed on the method's page): the teacher's logits are divided by
the rollout temperature as the student's (the official divides only the student's; the published τ is 1, where the
two agree); the reference term is aggregated on its own with the actor's ``loss_agg_mode`` (the official adds it to
the same token matrix: the same value with token-mean); the context is put by the recipe's ``answer_only`` context
rather than a sentinel in the dataset's prompt.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from treetune_recipe.cpo.methods.method import Distillation, Method, ReferenceTerm, register_method
from treetune_verl.config_block import check_field_types

#: The official reference-regulariser modes: the penalty per sampled token of logw = log π_θ - log π_ref.
REFERENCE_MODES = ("fkl", "rkl", "ufkl", "urkl")
#: The official per-token cap of the distillation KL (``dp_actor.py``: ``kl.clamp(max=20)``).
KL_CAP = 20.0

#: ``run_qwen3_4b_sdpg_boxed.sh``: DAPO's asymmetric clip with dual clip c = 10, token-mean aggregation (the recipe's
#: distillation term follows ``cpo.token_loss_agg``, whose SDPG default is token_mean), no verl KL loss (the reference
#: worker that the α term reads exists only with the KL loss on: it stays on with weight 0).
SDPG_RUN_SETTINGS = (
    "actor_rollout_ref.actor.kl_loss_coef=0",
    "actor_rollout_ref.actor.clip_ratio_low=0.2",
    "actor_rollout_ref.actor.clip_ratio_high=0.28",
    "actor_rollout_ref.actor.clip_ratio_c=10.0",
    "actor_rollout_ref.actor.loss_agg_mode=token-mean",
)


@dataclass(frozen=True)
class SDPGKnobs:
    """``cpo.sdpg.*``: the official script's values (the paper's differ where noted in the help)."""

    beta: float = field(
        default=1e-3,
        metadata={"help": "β >= 0, the weight of KL(π(·|x) ‖ π(·|c, x)) (script and paper: 1e-3)."},
    )
    beta_warmup_steps: int = field(
        default=0,
        metadata={"help": "β rises linearly over the first this many steps (script: 0, off; paper: 50)."},
    )
    beta_decay_steps: int = field(
        default=0,
        metadata={"help": "β falls linearly to 0 over the last this many steps (script: 0, off; paper: 350)."},
    )
    positive_advantage_only: bool = field(
        default=False,
        metadata={"help": "Distil only the tokens of responses with advantage > 0 (script: false; paper: true)."},
    )
    alpha: float = field(
        default=1e-3,
        metadata={"help": "α >= 0, the weight of the reference regulariser (script and paper: 1e-3)."},
    )
    kl_mode: str = field(
        default="urkl",
        metadata={
            "help": "The reference regulariser per sampled token of logw = log π - log π_ref: fkl: π_ref/π; rkl: "
            "(logw + 1)²/2; ufkl: π_ref/π + logw; urkl: logw²/2 (script: urkl)."
        },
    )

    def __post_init__(self):
        check_field_types(self, "cpo.sdpg")
        for name in ("beta", "alpha", "beta_warmup_steps", "beta_decay_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"cpo.sdpg.{name} must be >= 0, got {getattr(self, name)!r}.")
        if self.kl_mode not in REFERENCE_MODES:
            raise ValueError(f"cpo.sdpg.kl_mode must be one of {', '.join(REFERENCE_MODES)}, got {self.kl_mode!r}.")


def sdpg_kl(student: torch.Tensor, teacher: torch.Tensor, knobs: SDPGKnobs) -> torch.Tensor:
    """Per token: min(KL(S ‖ T), 20) = min(Σ_v s_v·(S_v - T_v), 20), over the whole vocabulary, ``[M, V] -> [M]``.

    S the student's log-distribution (no context), T the teacher's (the current policy under the answer-only
    context, no gradient). The official ``_kl_entropy_fn`` and its cap; a capped token has no gradient, as there.
    """
    return (student.exp() * (student - teacher)).sum(-1).clamp(max=KL_CAP)


def positive_advantages(advantages: torch.Tensor, knobs: SDPGKnobs) -> torch.Tensor:
    """g = [A > 0] per token with ``positive_advantage_only``, else 1 (the official gating; GRPO's A is one value per
    response, so the gate keeps whole responses; an all-equal group, A = 0, is gated off)."""
    if not knobs.positive_advantage_only:
        return torch.ones_like(advantages)
    return (advantages > 0).to(advantages.dtype)


def reference_penalty(log_ratio: torch.Tensor, knobs: SDPGKnobs) -> torch.Tensor:
    """Per sampled token, logw = log π_θ - log π_ref: fkl: e^{-logw}; rkl: (logw + 1)²/2; ufkl: e^{-logw} + logw;
    urkl: logw²/2 (the official ``compute_sdpg_loss``; the expected gradient of each is that of its KL of π_θ and
    π_ref, the paper's §3.4)."""
    if knobs.kl_mode == "fkl":
        return torch.exp(-log_ratio)
    if knobs.kl_mode == "rkl":
        return 0.5 * (log_ratio + 1.0) ** 2
    if knobs.kl_mode == "ufkl":
        return torch.exp(-log_ratio) + log_ratio
    return 0.5 * log_ratio**2


def beta_schedule(knobs: SDPGKnobs, step: int, total_steps: int) -> tuple[SDPGKnobs, dict[str, float]]:
    """β_t = β·min(1, t/W)·min(1, (T - t)/D) at training step t (1-based) of T, W = ``beta_warmup_steps`` and D =
    ``beta_decay_steps`` (a factor is 1 when its knob is 0): the official ``_compute_effective_beta``, which counts
    trainer steps (one per rollout batch), as here."""
    beta = knobs.beta
    if knobs.beta_warmup_steps and step < knobs.beta_warmup_steps:
        beta *= step / knobs.beta_warmup_steps
    if knobs.beta_decay_steps and total_steps and step >= total_steps - knobs.beta_decay_steps:
        beta *= max(total_steps - step, 0) / knobs.beta_decay_steps
    return dataclasses.replace(knobs, beta=beta), {"cpo/sdpg_beta": beta}


register_method(
    Method(
        name="sdpg",
        family="sdpg",
        summary="GRPO's dual-clip loss + β·KL(π(·|x) ‖ π(·|answer, x)) over the vocabulary + α·regulariser to π_ref",
        policy="verifier",
        distillation=Distillation(sdpg_kl, weight_knob="beta", gate=positive_advantages),
        reference=ReferenceTerm(reference_penalty, weight_knob="alpha"),
        context="answer_only",
        published_teacher="policy",
        token_loss_agg="token_mean",
        knobs=SDPGKnobs,
        run_settings=SDPG_RUN_SETTINGS,
        schedule=beta_schedule,
    )
)
