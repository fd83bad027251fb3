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
"""RLSD, "Self-Distilled RLVR" (Yang et al., arXiv 2604.03128; official code ``iie-ycx/RLSD``): the verifier's
advantage sets each token's direction, the teacher's log-ratio under the answer its size. Agent-docs page:
``agent-docs/methods/rlsd.md``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from treetune_recipe.cpo.methods.advantage_terms import CPORows, CPOTerms, as_wrapper
from treetune_recipe.cpo.methods.method import Method, register_method
from treetune_verl.config_block import check_field_types


@dataclass(frozen=True)
class RLSDKnobs:
    """``cpo.rlsd.*``: RLSD's mix, clip and λ schedule (the paper's and the official script's values)."""

    mix_lambda: float = field(
        default=0.5,
        metadata={"help": "λ in [0, 1] at step 0: Â = A·((1-λ) + λ·clip(exp(sign(A)·δ), 1-ε, 1+ε)); 0 gives GRPO."},
    )
    clip: float = field(
        default=0.2, metadata={"help": "ε in [0, 1): the token weight exp(sign(A)·δ) is clipped to [1-ε, 1+ε]."}
    )
    lambda_decay_steps: int = field(
        default=60,
        metadata={
            "help": "λ falls linearly from mix_lambda at step 0 to 0 at this step (λ_t = λ·max(0, 1 - t/D), as the "
            "official trainer, which makes one update per step); 0 keeps λ constant."
        },
    )

    def __post_init__(self):
        check_field_types(self, "cpo.rlsd")
        if not 0 <= self.mix_lambda <= 1:
            raise ValueError(
                f"cpo.rlsd.mix_lambda must lie in [0, 1] (a mix of 1 and the weight), got {self.mix_lambda}."
            )
        if not 0 <= self.clip < 1:
            raise ValueError(
                f"cpo.rlsd.clip must lie in [0, 1) (weights in [1-ε, 1+ε] stay positive), got {self.clip}."
            )
        if self.lambda_decay_steps < 0:
            raise ValueError(f"cpo.rlsd.lambda_decay_steps must be an integer >= 0, got {self.lambda_decay_steps!r}.")


def lambda_schedule(knobs: RLSDKnobs, step: int, total_steps: int) -> tuple[RLSDKnobs, dict[str, float]]:
    """λ_t = λ·max(0, 1 - t/D) at training step t (1-based), D = ``lambda_decay_steps``; D = 0: λ_t = λ. No warm-up,
    as the official trainer. One update per step (the published run settings), so t counts updates as there."""
    if knobs.lambda_decay_steps == 0:
        step_lambda = knobs.mix_lambda
    else:
        step_lambda = knobs.mix_lambda * max(0.0, 1.0 - step / knobs.lambda_decay_steps)
    return dataclasses.replace(knobs, mix_lambda=step_lambda), {"cpo/rlsd_lambda": step_lambda}


def rows_with_advantage(rows: CPORows, cfg) -> torch.Tensor:
    """Rule: the rows with some A != 0 (Â = 0 wherever A = 0, whatever δ)."""
    return rows.nonzero_advantage


@as_wrapper
def rlsd(x: CPOTerms, cfg) -> torch.Tensor:
    """V: Â = A·((1-λ) + λ·clip(exp(sign(A)·δ), 1-ε, 1+ε)), λ = ``cfg.rlsd.mix_lambda`` (the step's), ε =
    ``cfg.rlsd.clip``.

    Eq. 13-15 of the paper; the official code's ``_build_stgca_advantages`` (``verl/workers/actor/dp_opsd_actor.py``)
    weighs, clips and mixes as above. A = 0 gives Â = 0 (an all-wrong group of ±1 rewards still gets nothing); with
    λ = 0, Â = A. Remaining differences: the student term is the rollout policy's ``old_log_probs`` (SDPG's
    re-implementation, ``lauyikfung/SDPG``, takes it so), where the official code detaches the current policy's
    log-probs in each update micro-batch: the same values with one update per step, the published setting. The
    teacher's context is the dataset's answer, as in the official code (``answer_only``), in SDPG's wording; the
    official template (``examples/visual_rl/format_prompt/teacher_hint_self_distill.jinja``) words it "Here is a
    reference solution:". ``cpo.context=gold_solution`` shows the dataset's worked solution instead.
    """
    knobs = cfg.rlsd
    weight = torch.exp(torch.sign(x.advantages) * x.log_ratio).clamp(1.0 - knobs.clip, 1.0 + knobs.clip)
    shaped = x.advantages * ((1.0 - knobs.mix_lambda) + knobs.mix_lambda * weight)
    return torch.where(x.valid, shaped, x.advantages)


register_method(
    Method(
        name="rlsd",
        family="rlsd",
        summary="Â = A·((1-λ_t) + λ_t·clip(exp(sign(A)·(g-o)), 1-ε, 1+ε)), λ_t decaying to 0",
        policy="shaped",
        advantage=rlsd,
        hint_rows=rows_with_advantage,
        context="answer_only",  # the official code shows the teacher the dataset's answer
        # The official trainer's teacher: the reference model, overwritten by the actor every 20 updates.
        published_teacher="refreshed",
        knobs=RLSDKnobs,
        # rlsd_train.sh: ratio clipped asymmetrically (0.2 below, 0.28 above), no KL term in the loss (the reference
        # worker the teacher needs exists only with the KL loss on: it stays on with weight 0), and one optimizer
        # update per step (mini-batch = batch), so the refresh and λ count updates as the official trainer does.
        run_settings=(
            "actor_rollout_ref.actor.kl_loss_coef=0",
            "actor_rollout_ref.actor.clip_ratio_low=0.2",
            "actor_rollout_ref.actor.clip_ratio_high=0.28",
            "actor_rollout_ref.actor.ppo_mini_batch_size=${data.train_batch_size}",
        ),
        schedule=lambda_schedule,
        aliases={"rlsd_lambda": "mix_lambda", "rlsd_clip": "clip", "rlsd_lambda_decay_steps": "lambda_decay_steps"},
    )
)
