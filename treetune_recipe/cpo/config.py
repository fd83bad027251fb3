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
"""``CPOConfig``: the top-level ``cpo:`` block of the recipe config as one typed object, validated at start-up.

The block is top level because verl's ``ActorConfig`` rejects unknown keys. Defaults are the reference's main run
(``seq_kl``, λ = 2, α⁺ = 0, α⁻ = 1, all tokens). Its nested blocks are typed too: ``hint`` (``HintConfig``,
``cpo.hint.*``) and ``credit_dump`` (``CreditDumpConfig``, ``cpo.credit_dump.*``); ``teacher_config``
(``TeacherConfig``) is the teacher resolved from ``cpo.teacher``, ``cpo.teacher_refresh_steps`` and the wrapper.
:meth:`CPOConfig.from_config` builds the whole object with ``treetune_verl.config_block.dataclass_from_block`` (an
unknown key at any level is one error naming the valid ones); the recipe's preflight builds it on the driver before
Ray starts and the trainer once in its ``__init__``. The object is sent to the workers inside the loss partial, so
it stays a plain picklable dataclass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from treetune_recipe.cpo.cpo_advantage_wrappers import CPO_WRAPPERS
from treetune_recipe.cpo.cpo_core_algos import DIFFICULTY_MODES, LOSS_POSITIONS
from treetune_recipe.cpo.cpo_credit_dump import CreditDumpConfig
from treetune_recipe.cpo.cpo_hint import HintConfig
from treetune_verl.config_block import check_block_overrides, dataclass_from_block

#: Teachers of the hinted pass, i.e. whose log-probs of the response under the hint prompt ``gw_log_probs`` are:
#: ``policy``: the rollout policy, scored by the actor (moves with the student every step; CPO's own reference);
#: ``initial``: the model the run started from, held fixed (verl's reference-policy worker, or the actor without its
#: LoRA adapter when the reference lives in the actor); ``refreshed``: the reference worker, overwritten with the
#: actor's weights after every ``teacher_refresh_steps`` steps.
TEACHERS = ("policy", "initial", "refreshed")
#: The teacher each published peer runs with in its authors' code (``cpo.teacher: null``); every other wrapper: policy.
#: RLSD (``iie-ycx/RLSD``): a frozen reference refreshed from the actor every 20 steps. OPSD (``siyan-zhao/OPSD``): the
#: fixed initial policy, the setting its README recommends.
PUBLISHED_TEACHERS = {"rlsd": "refreshed", "opsd_token": "initial"}
#: Teachers scored by verl's reference-policy worker (it must exist: ``actor_rollout_ref.actor.use_kl_loss=true``).
REFERENCE_TEACHERS = ("initial", "refreshed")


@dataclass(frozen=True)
class TeacherConfig:
    """The teacher of the hinted pass, resolved (built by ``CPOConfig`` from ``cpo.teacher``,
    ``cpo.teacher_refresh_steps`` and ``cpo.wrap_method``; the two keys stay top-level ``cpo`` keys).

    Attributes:
        name: ``policy``, ``initial`` or ``refreshed`` (see :data:`TEACHERS`).
        source: ``cpo.teacher`` when set, else ``published setting of <wrap_method>``.
        refresh_steps: ``refreshed``: the reference takes the actor's weights after every this many updates.
    """

    name: str
    source: str
    refresh_steps: int

    @property
    def on_reference_worker(self) -> bool:
        """Whether verl's reference-policy worker scores this teacher (else the actor does)."""
        return self.name in REFERENCE_TEACHERS

    def refresh_due(self, step: int) -> bool:
        """Whether a ``refreshed`` teacher takes the actor's weights before step ``step`` (1-based) reads it: after
        every ``refresh_steps``-th update, i.e. at steps N+1, 2N+1, ..."""
        return self.name == "refreshed" and step > 1 and (step - 1) % self.refresh_steps == 0

    def describe(self) -> str:
        """One line for the start-up log: where the teacher comes from and what scores it."""
        scorer = {
            "policy": "the actor, with the rollout policy's weights",
            "initial": "the reference worker, the starting model held fixed",
            "refreshed": f"the reference worker, given the actor's weights every {self.refresh_steps} steps",
        }[self.name]
        return f"{self.source}; scored by {scorer}"


@dataclass
class CPOConfig:
    """CPO knobs (``cpo.*``). Each wrapper's docstring (``cpo_advantage_wrappers.py``) is its formula."""

    wrap_method: str = field(
        default="seq_kl",
        metadata={"help": f"Advantage wrapper applied in the actor loss. One of: {', '.join(CPO_WRAPPERS)}."},
    )
    cpo_lambda: float = field(
        default=2.0,
        metadata={"help": "λ > 1: band [1/λ, λ] of the hint/no-hint token probability ratio (naive* and noaccmask)."},
    )
    pos_alpha: float | None = field(
        default=0.0,
        metadata={"help": "α⁺, scale of the update on correct responses. 0 or null disables it; negative is applied."},
    )
    neg_alpha: float | None = field(
        default=1.0,
        metadata={"help": "α⁻, scale of the update on wrong responses. 0 or null disables it; negative is applied."},
    )
    loss_position: str = field(
        default="all",
        metadata={
            "help": "Tokens that enter the policy/entropy/KL losses: all; entropy, first (reference: top-20 % "
            "entropy over the micro-batch incl. padding / first 20 % of the padded width); entropy_valid, "
            "first_seq (per-sequence fixes)."
        },
    )
    difficulty_mode: str = field(
        default="group",
        metadata={
            "help": "group: per prompt group -1 all wrong, +1 all correct, 0 mixed. reference: all zeros, as "
            "the reference fork computed (reproduces its runs)."
        },
    )
    rlsd_lambda: float = field(
        default=0.5,
        metadata={"help": "λ of rlsd, in [0, 1]: Â = A·((1-λ) + λ·clip(exp(sign(A)·δ), 1-ε, 1+ε)); 0 gives GRPO."},
    )
    rlsd_clip: float = field(
        default=0.2,
        metadata={"help": "ε of rlsd, in [0, 1): the token weight exp(sign(A)·δ) is clipped to [1-ε, 1+ε]."},
    )
    rlsd_lambda_decay_steps: int = field(
        default=60,
        metadata={
            "help": "rlsd's λ falls linearly from rlsd_lambda at step 0 to 0 at this step (λ_t = λ·max(0, 1 - t/D), "
            "as RLSD's official trainer); 0 keeps λ constant."
        },
    )
    teacher: str | None = field(
        default=None,
        metadata={
            "help": f"Whose log-probs the hinted pass reads (gw_log_probs): one of {', '.join(TEACHERS)}; null = the "
            "method's published setting (PUBLISHED_TEACHERS; policy for the CPO wrappers)."
        },
    )
    teacher_refresh_steps: int = field(
        default=20,
        metadata={
            "help": "teacher=refreshed: the reference weights are overwritten with the actor's after every this many "
            "steps (RLSD's official interval)."
        },
    )
    success_value: float = field(
        default=1.0,
        metadata={"help": "Sequence reward of a correct response (difficulty mask and correct/wrong metrics)."},
    )
    hint: HintConfig = field(
        default_factory=HintConfig,
        metadata={"help": "The hint-guided prompt (cpo.hint.*, cpo_hint.HintConfig)."},
    )
    credit_dump: CreditDumpConfig = field(
        default_factory=CreditDumpConfig,
        metadata={"help": "Token-credit dump (cpo.credit_dump.*, cpo_credit_dump.CreditDumpConfig); off by default."},
    )
    teacher_config: TeacherConfig = field(
        init=False,
        repr=False,
        compare=False,
        metadata={"help": "The resolved teacher (from teacher, teacher_refresh_steps and wrap_method); not a key."},
    )

    def __post_init__(self):
        _check_choice("wrap_method", self.wrap_method, CPO_WRAPPERS)
        _check_choice("loss_position", self.loss_position, LOSS_POSITIONS)
        _check_choice("difficulty_mode", self.difficulty_mode, DIFFICULTY_MODES)
        for name in ("cpo_lambda", "pos_alpha", "neg_alpha", "rlsd_lambda", "rlsd_clip", "success_value"):
            nullable = name in ("pos_alpha", "neg_alpha")
            setattr(self, name, _finite_float(name, getattr(self, name), nullable=nullable))
        if self.cpo_lambda <= 1:
            raise ValueError(f"cpo.cpo_lambda must be > 1 (ratio band [1/λ, λ]), got {self.cpo_lambda}.")
        if not 0 <= self.rlsd_lambda <= 1:
            raise ValueError(
                f"cpo.rlsd_lambda must lie in [0, 1] (a mix of 1 and the clipped weight), got {self.rlsd_lambda}."
            )
        if not 0 <= self.rlsd_clip < 1:
            raise ValueError(
                f"cpo.rlsd_clip must lie in [0, 1) (weights in [1-ε, 1+ε] stay positive), got {self.rlsd_clip}."
            )
        if self.teacher is not None:
            _check_choice("teacher", self.teacher, TEACHERS)
        for name, low in (("rlsd_lambda_decay_steps", 0), ("teacher_refresh_steps", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"cpo.{name} must be an integer >= {low}, got {value!r}.")
        for name, block in (("hint", HintConfig), ("credit_dump", CreditDumpConfig)):
            if not isinstance(getattr(self, name), block):
                raise ValueError(
                    f"cpo.{name} must be a {block.__name__}, got {getattr(self, name)!r}; build the whole block with "
                    "CPOConfig.from_config."
                )
        # cpo.teacher, or the wrapper's published teacher when it is null (PUBLISHED_TEACHERS, else policy).
        self.teacher_config = TeacherConfig(
            name=self.teacher or PUBLISHED_TEACHERS.get(self.wrap_method, "policy"),
            source="cpo.teacher" if self.teacher else f"published setting of {self.wrap_method}",
            refresh_steps=self.teacher_refresh_steps,
        )

    def rlsd_lambda_at(self, step: int) -> float:
        """λ of ``rlsd`` at trainer step ``step`` (1-based): λ_t = λ·max(0, 1 - t/D), D = ``rlsd_lambda_decay_steps``;
        D = 0: λ_t = λ. RLSD's official trainer decays it the same way (no warm-up)."""
        if self.rlsd_lambda_decay_steps == 0:
            return self.rlsd_lambda
        return self.rlsd_lambda * max(0.0, 1.0 - step / self.rlsd_lambda_decay_steps)

    @classmethod
    def from_config(cls, config: Any = None) -> CPOConfig:
        """Build from the ``cpo`` block and its nested blocks: an OmegaConf node (interpolations resolved), a plain
        mapping, or None (all defaults).

        Raises:
            ValueError: one line, on an unknown key at any level (naming the valid ones) or an invalid value.
        """
        return dataclass_from_block(cls, config, "cpo")


def check_cpo_overrides(overrides: list[str]) -> None:
    """Stop with one line on a command-line override of the ``cpo`` block that ``CPOConfig`` would refuse, before
    Hydra composes: an unknown key (Hydra's own answer to ``cpo.x=1`` is a struct error, and ``+cpo.x=1`` composes
    silently) or an invalid value (``cpo.teacher=x``). Arguments that are no overrides (``-m``, ``--config-name``)
    and overrides of other blocks are ignored.

    Raises:
        PreflightError: naming the override and the block's valid keys, or the key's valid values.
    """
    check_block_overrides([arg for arg in overrides if not arg.startswith("-")], "cpo", CPOConfig)


def _check_choice(name: str, value: str, valid) -> None:
    if value not in valid:
        raise ValueError(f"Unknown cpo.{name} {value!r}. Valid values: {', '.join(valid)}.")


def _finite_float(name: str, value: Any, nullable: bool) -> float | None:
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"cpo.{name} must be a number, got {value!r}.")
    if not math.isfinite(value):
        raise ValueError(f"cpo.{name} must be finite, got {value}.")
    return float(value)
