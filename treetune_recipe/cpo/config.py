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

The block is top level because verl's ``ActorConfig`` rejects unknown keys. Its defaults are written once, here: the
recipe's Hydra config takes them from the ``cpo_defaults`` node that :func:`register_config_defaults` stores from this
dataclass. The shared knobs are the reference's main run (``seq_kl``, λ = 2, α⁺ = 0, α⁻ = 1, all tokens); nested
typed blocks: ``hint`` (``HintConfig``), ``feedback`` (``FeedbackConfig``), ``credit_dump`` (``CreditDumpConfig``)
and one block per method with knobs
of its own (``cpo.<method>.*``, the method's ``knobs`` dataclass, added from the method registry: this module names no
method). ``teacher_config`` (``treetune_recipe.cpo.teacher.weights.TeacherConfig``) is the teacher resolved from
``cpo.teacher`` and the method; ``context_name`` the teacher's context, from ``cpo.context`` and the method.
:meth:`CPOConfig.from_config` builds the whole object with ``treetune_verl.config_block.dataclass_from_block`` (an
unknown key at any level is one error naming the valid ones; a renamed key is translated, with a note). The driver
builds it once before Ray (``preflight.check_cpo_run``) and writes it back into the run config, which Ray hands to
the trainer; the object travels to the workers inside the loss partial, so it stays a plain picklable dataclass.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from treetune_recipe.cpo.methods.advantage_terms import DEFAULT_SUCCESS_VALUE
from treetune_recipe.cpo.methods.core_algos import DIFFICULTY_MODES, LOSS_POSITIONS
from treetune_recipe.cpo.methods.method import TOKEN_LOSS_AGGS, Method
from treetune_recipe.cpo.methods.registry import all_methods, get_method
from treetune_recipe.cpo.reports.credit_dump import CreditDumpConfig
from treetune_recipe.cpo.teacher.contexts import CONTEXTS, TeacherContext, get_context
from treetune_recipe.cpo.teacher.feedback import FeedbackConfig
from treetune_recipe.cpo.teacher.hint import HintConfig
from treetune_recipe.cpo.teacher.weights import TEACHERS, TeacherConfig
from treetune_verl import rollout_health
from treetune_verl.config_block import (
    block_keys,
    check_block_overrides,
    check_field_types,
    dataclass_from_block,
    override_key,
)


def _method_fields() -> list[tuple[str, type, Any]]:
    """One nested block per registered method with knobs: ``cpo.<method>.*``, typed by its knobs dataclass."""
    return [
        (
            name,
            method.knobs,
            field(default_factory=method.knobs, metadata={"help": f"Knobs of {name} (cpo.{name}.*; {method.family})."}),
        )
        for name, method in all_methods().items()
        if method.knobs is not None
    ]


#: One block per registered method with knobs (``cpo.<method>.*``, its knobs dataclass), in the registry's order: the
#: base of :class:`CPOConfig`, built from the registry so that a new method adds its block from its own module.
MethodBlocks = dataclasses.make_dataclass("MethodBlocks", _method_fields())
MethodBlocks.__module__ = __name__


@dataclass
class CPOConfig(MethodBlocks):
    """The ``cpo`` block: the knobs every method shares (below) and one typed block per registered method with knobs
    of its own (``cpo.<method>.*``, :data:`MethodBlocks`; each method's page lists them). Built once, in the driver
    (:meth:`from_config`, by the start-up checks), and handed to the trainer; only a method's schedule gives a step
    other knobs (:meth:`at_step`). Each CPO wrapper's docstring (``methods/cpo_wrappers.py``) is its formula."""

    method: str = field(
        default="seq_kl",
        metadata={"help": "The method: one of the registered methods (treetune_recipe/cpo/methods/registry.py)."},
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
    teacher: str | None = field(
        default=None,
        metadata={
            "help": f"Whose distribution the hinted pass reads: one of {', '.join(TEACHERS)}; null = the method's "
            "published teacher (Method.published_teacher; policy for the CPO wrappers)."
        },
    )
    context: str | None = field(
        default=None,
        metadata={
            "help": f"The teacher's privileged context: one of {', '.join(CONTEXTS)} (teacher/contexts.py); null = "
            "the method's published context (Method.context). Both teacher passes read it."
        },
    )
    teacher_refresh_steps: int = field(
        default=20,
        metadata={
            "help": "teacher=refreshed: the reference weights are overwritten with the actor's after every this many "
            "updates (RLSD's official interval)."
        },
    )
    teacher_ema_rate: float = field(
        default=0.05,
        metadata={"help": "teacher=ema: τ in (0, 1] of θ_T ← (1-τ)·θ_T + τ·θ after every update (SDPO's default)."},
    )
    teacher_checkpoint: bool = field(
        default=True,
        metadata={
            "help": "teacher=refreshed or ema: save the teacher's state (and its weights when a resume needs them) "
            "with each checkpoint, so a resumed run scores with the uninterrupted run's teacher; false: only the "
            "run's last checkpoint keeps the teacher, and a resume restarts it from the resumed actor."
        },
    )
    drift_metrics: bool = field(
        default=False,
        metadata={
            "help": "Run verl's reference log-prob pass at every step even when nothing reads it (a KL loss of weight "
            "0, the peers' published setting), to log treetune/drift/* (the rollout policy's distance from the "
            "reference); false: the pass is skipped then."
        },
    )
    token_loss_agg: str | None = field(
        default=None,
        metadata={
            "help": "How a distillation term is averaged; null: the method's published way. seq_mean (SDPO's and "
            "OPSD's official "
            "per-sequence mean: each row's token mean, then the mean over every row, a row without a teacher context "
            "counting as 0) or token_mean (SDPG's: the sum over the tokens of rows with a context divided by every "
            "response token)."
        },
    )
    success_value: float = field(
        default=DEFAULT_SUCCESS_VALUE,
        metadata={
            "help": "Sequence reward of a correct response, for everything that tells correct from wrong (the "
            "wrappers' r == 1, the difficulty mask, SDPO's successful siblings, the credit dump and the metrics)."
        },
    )
    hint: HintConfig = field(
        default_factory=HintConfig,
        metadata={"help": "The hint-guided prompt (cpo.hint.*, teacher.hint.HintConfig)."},
    )
    feedback: FeedbackConfig = field(
        default_factory=FeedbackConfig,
        metadata={"help": "The environment_feedback context (cpo.feedback.*, teacher.feedback.FeedbackConfig)."},
    )
    credit_dump: CreditDumpConfig = field(
        default_factory=CreditDumpConfig,
        metadata={
            "help": "Token-credit dump (cpo.credit_dump.*, reports.credit_dump.CreditDumpConfig); off by default."
        },
    )
    teacher_config: TeacherConfig = field(
        init=False,
        repr=False,
        compare=False,
        metadata={"help": "The resolved teacher (from teacher, its rate keys and method); not a key."},
    )

    def __post_init__(self):
        check_field_types(self, "cpo")
        _check_choice("method", self.method, all_methods())
        _check_choice("loss_position", self.loss_position, LOSS_POSITIONS)
        _check_choice("difficulty_mode", self.difficulty_mode, DIFFICULTY_MODES)
        if self.token_loss_agg is not None:
            _check_choice("token_loss_agg", self.token_loss_agg, TOKEN_LOSS_AGGS)
        for name in ("cpo_lambda", "pos_alpha", "neg_alpha", "success_value", "teacher_ema_rate"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"cpo.{name} must be finite, got {value}.")
        if self.cpo_lambda <= 1:
            raise ValueError(f"cpo.cpo_lambda must be > 1 (ratio band [1/λ, λ]), got {self.cpo_lambda}.")
        if not 0 < self.teacher_ema_rate <= 1:
            raise ValueError(f"cpo.teacher_ema_rate must lie in (0, 1], got {self.teacher_ema_rate}.")
        if self.teacher is not None:
            _check_choice("teacher", self.teacher, TEACHERS)
        if self.context is not None:
            _check_choice("context", self.context, CONTEXTS)
        if self.teacher_refresh_steps < 1:
            raise ValueError(f"cpo.teacher_refresh_steps must be an integer >= 1, got {self.teacher_refresh_steps!r}.")
        published = self.selected_method.published_teacher
        self.teacher_config = TeacherConfig(
            name=self.teacher or published,
            source="cpo.teacher" if self.teacher else f"published setting of {self.method}",
            refresh_steps=self.teacher_refresh_steps,
            ema_rate=self.teacher_ema_rate,
        )

    @property
    def selected_method(self) -> Method:
        """The selected method's declaration (``cpo.method``)."""
        return get_method(self.method)

    @property
    def context_name(self) -> str:
        """The teacher's context of the run: ``cpo.context``, or the method's published one when null."""
        return self.context or self.selected_method.context

    @property
    def teacher_context(self) -> TeacherContext:
        """The registered context :attr:`context_name` names (``teacher.contexts.CONTEXTS``)."""
        return get_context(self.context_name)

    @property
    def knobs(self) -> Any:
        """The selected method's own block (``cpo.<method>``), or None when it has no knobs."""
        return getattr(self, self.method) if self.selected_method.knobs is not None else None

    @property
    def distillation_agg(self) -> str:
        """How the distillation term is averaged: ``token_loss_agg``, or the method's published way when null."""
        return self.token_loss_agg or self.selected_method.token_loss_agg

    @property
    def topk(self) -> int | None:
        """k of the selected method's top-k teacher pass (0: every id), or None for a sampled-token method."""
        return self.selected_method.topk(self.knobs)

    def at_step(self, step: int, total_steps: int) -> tuple[CPOConfig, dict[str, float]]:
        """This config with the method's knobs of training step ``step`` of ``total_steps`` (its schedule), and the
        schedule's metrics."""
        if self.selected_method.schedule is None:
            return self, {}
        knobs, metrics = self.selected_method.step_knobs(self.knobs, step, total_steps)
        return dataclasses.replace(self, **{self.method: knobs}), metrics

    def to_block(self) -> dict[str, Any]:
        """The plain ``cpo`` block of this object (every key, nested blocks as mappings): what the driver hands on."""
        return _plain(self)

    @classmethod
    def from_config(cls, config: Any = None) -> CPOConfig:
        """Build from the ``cpo`` block and its nested blocks: an OmegaConf node (interpolations resolved), a plain
        mapping, or None (all defaults). A renamed key (a method's alias) is moved to its new place, with a note.

        Raises:
            ValueError: one line, on an unknown key at any level (naming the valid ones) or an invalid value.
        """
        if config is not None and not isinstance(config, cls):
            from omegaconf import DictConfig, OmegaConf

            if isinstance(config, DictConfig):
                config = OmegaConf.to_container(config, resolve=True)
            if isinstance(config, dict):
                config = _translate_alias_keys(config)
        return dataclass_from_block(cls, config, "cpo")


#: Renamed shared ``cpo.*`` keys: old key -> new key (the table of renames: ``agent-docs/development-guide.md``).
SHARED_ALIASES = {"wrap_method": "method"}


def method_aliases() -> dict[str, str]:
    """Renamed ``cpo.*`` keys: old dotted key -> new dotted key (``wrap_method`` -> ``method``, ``rlsd_lambda`` ->
    ``rlsd.mix_lambda``)."""
    methods = {old: f"{name}.{new}" for name, method in all_methods().items() for old, new in method.aliases.items()}
    return {**SHARED_ALIASES, **methods}


def _translate_alias_keys(block: dict) -> dict:
    block = dict(block)
    for old, new in method_aliases().items():
        if old in block:
            value = block.pop(old)
            print(f"[cpo] cpo.{old} is now cpo.{new}; using {value!r} there.")
            name, _, key = new.rpartition(".")
            if name:
                block[name] = {**dict(block.get(name) or {}), key: value}
            else:
                block[key] = value
    return block


def translate_alias_overrides(overrides: list[str]) -> list[str]:
    """Command-line overrides with every renamed ``cpo.<old>`` key replaced by its new key, each with a note."""
    aliases = method_aliases()
    translated = []
    for text in overrides:
        prefix = text[: len(text) - len(text.lstrip("+~"))]
        key, sep, value = text[len(prefix) :].partition("=")
        old = key.removeprefix("cpo.")
        if key.startswith("cpo.") and old in aliases:
            print(f"[cpo] {key} is now cpo.{aliases[old]}; using the value there.")
            text = f"{prefix}cpo.{aliases[old]}{sep}{value}"
        translated.append(text)
    return translated


def config_defaults() -> dict[str, Any]:
    """The ``cpo`` block of defaults, every key, as the recipe config composes it."""
    return _plain(CPOConfig())


def register_config_defaults() -> None:
    """Store the ``cpo`` defaults in Hydra's ConfigStore as ``cpo_defaults``, and the run-health guard's
    (``treetune.rollout_health``) as ``rollout_health_defaults``; ``cpo_trainer.yaml`` lists both in its defaults: the
    recipe config writes none of them itself."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="cpo_defaults", node={"cpo": config_defaults()})
    rollout_health.register_config_defaults()


class RunSettings(NamedTuple):
    """What :func:`apply_method_run_settings` did with the method's published settings, for the start-up log."""

    applied: list[str]  #: set in the config
    kept: list[str]  #: not set: the user's override of the same key stays


def apply_method_run_settings(config, user_overrides: list[str]) -> RunSettings:
    """Apply the selected method's published run settings outside ``cpo.*`` (``Method.run_settings``) to the composed
    ``config``, except a key the user overrode (the user wins); nothing for another estimator than ``cpo``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf, open_dict

    if config.algorithm.adv_estimator != "cpo":
        return RunSettings([], [])
    user_keys = {override_key(text) for text in user_overrides}
    parser = OverridesParser.create()
    done = RunSettings([], [])
    for text in get_method(config.cpo.method).run_settings:
        override = parser.parse_override(text)
        if override.key_or_group in user_keys:
            done.kept.append(text)
            continue
        with open_dict(config):
            OmegaConf.update(config, override.key_or_group, override.value(), merge=True)
        done.applied.append(text)
    return done


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {name: _plain(getattr(obj, name)) for name in block_keys(type(obj))}
    if isinstance(obj, tuple | list):
        return [_plain(item) for item in obj]
    return obj


def check_cpo_overrides(overrides: list[str]) -> list[str]:
    """Stop with one line on a command-line override of the ``cpo`` block that ``CPOConfig`` would refuse, before
    Hydra composes: an unknown key (Hydra's own answer to ``cpo.x=1`` is a struct error, and ``+cpo.x=1`` composes
    silently) or an invalid value (``cpo.teacher=x``). Arguments that are no overrides (``-m``, ``--config-name``)
    and overrides of other blocks are ignored.

    Returns:
        ``overrides`` with every renamed key translated (:func:`translate_alias_overrides`), to hand to Hydra.

    Raises:
        PreflightError: naming the override and the block's valid keys, or the key's valid values.
    """
    overrides = translate_alias_overrides(list(overrides))
    check_block_overrides([arg for arg in overrides if not arg.startswith("-")], "cpo", CPOConfig)
    return overrides


def _check_choice(name: str, value: str, valid) -> None:
    if value not in valid:
        raise ValueError(f"Unknown cpo.{name} {value!r}. Valid values: {', '.join(valid)}.")


register_config_defaults()
