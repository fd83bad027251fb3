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
"""The method registry: every method the recipe runs (``cpo.wrap_method``) is one :class:`Method`, declared once.

A method says what it computes and what it needs; the config, the preflight, the trainer, the loss and the experiment
read these declarations and never name a method:

- ``advantage``: a wrapper that reshapes GRPO's per-token advantages from the hinted pass (the 18 CPO wrappers, RLSD,
  OPSD's sampled-token form), with ``hint_rows``, the rows whose shaped advantages read the hinted log-probs; or
- ``token_loss``: a distribution-level loss per response token (OPSD's JSD, SDPO) computed inside the actor update
  from the student's and the teacher's distributions, both computed there, at the top-k ids ``teacher_pass`` names.

Each method module registers itself on import (:func:`register_method`): the 18 CPO wrappers in
:mod:`treetune_recipe.cpo.methods.cpo_wrappers`, which then imports the peers
(:mod:`treetune_recipe.cpo.methods.registry`). This module imports none of them;
:mod:`treetune_recipe.cpo.methods.registry` loads them all and is where the rest of the recipe looks a method up
(``get_method``, ``all_methods``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from treetune_recipe.cpo.teacher import contexts as teacher_contexts
from treetune_verl.config_block import override_key

#: What a method reads of its teacher at every response token: ``token``: the sampled token's log-prob
#: (``gw_log_probs``, a pass before the update); ``teacher_topk``: the teacher's distribution at its own top-k ids;
#: ``student_topk``: at the student's top-k ids (the student in the update). Both top-k kinds run the teacher inside the
#: update, beside the student (``treetune_verl.update_teacher``).
TEACHER_PASSES = ("token", "teacher_topk", "student_topk")
#: The privileged contexts of the teacher's prompt, by name: the registry of ``treetune_recipe.cpo.teacher.contexts``
#: (the gold solution, the answer, a successful sibling, the environment's feedback).
CONTEXTS = tuple(teacher_contexts.CONTEXTS)
#: Method families, one documentation page each (``agent-docs/methods/<family>.md``).
FAMILIES = ("cpo", "rlsd", "opsd", "sdpo")


@dataclass(frozen=True)
class Method:
    """One method of the recipe, selected by ``cpo.wrap_method=<name>``.

    Attributes:
        name: the selector value.
        family: its documentation page (:data:`FAMILIES`).
        summary: its formula or loss in one line (the start-up log prints it).
        advantage: advantage wrapper ``fn(advantages, *, gw_log_probs, old_log_probs, entropy, response_mask,
            seq_rewards, difficulty, cfg) -> [B, T]``; None for a distribution-level method.
        hint_rows: ``rule(rows, cfg) -> bool [B]``, the rows whose output reads the teacher pass (advantage
            methods; a distribution-level method reads every row that has a context).
        token_loss: ``fn(student_log_probs [B, T, k], teacher_log_probs [B, T, k], knobs) -> [B, T]`` per-token loss
            on full-vocabulary log-probs gathered at the top-k ids; None for an advantage method.
        token_weight: ``fn(log_probs [B, T], old_log_probs [B, T], knobs) -> [B, T]``, a detached per-token weight of
            the token loss (SDPO's clipped importance ratio), or None.
        replaces_policy_loss: the token loss is the whole loss (the policy-gradient term is dropped); False adds it
            to verl's PPO loss.
        teacher_pass: what the teacher pass returns (:data:`TEACHER_PASSES`).
        topk: k of the top-k ids: the name of the knob that holds it (0 or the vocabulary size: all ids).
        context: the teacher's privileged context as published (:data:`CONTEXTS`); ``cpo.context`` selects another.
        published_teacher: the teacher the authors' code runs with (``cpo.teacher: null`` selects it).
        knobs: the dataclass of the method's own block ``cpo.<name>.*`` (typed, with help text), or None.
        run_settings: Hydra overrides outside ``cpo.*`` the authors' scripts use (sampling, updates per rollout, KL),
            applied when the method is selected unless the user sets the same key.
        schedule: ``fn(knobs, step) -> (knobs, metrics)``: the knobs of training step ``step`` (1-based) and metrics
            to log, or None for knobs constant over the run.
        aliases: former top-level ``cpo.<key>`` names of this method's knobs -> the knob that replaced them.
        needs_entropy: the advantage wrapper reads the current-policy entropy.
    """

    name: str
    family: str
    summary: str
    advantage: Callable[..., Any] | None = None
    hint_rows: Callable[..., Any] | None = None
    token_loss: Callable[..., Any] | None = None
    token_weight: Callable[..., Any] | None = None
    replaces_policy_loss: bool = False
    teacher_pass: str = "token"
    topk: str | None = None
    context: str = "gold_solution"
    published_teacher: str = "policy"
    knobs: type | None = None
    run_settings: tuple[str, ...] = ()
    schedule: Callable[[Any, int], tuple[Any, dict[str, float]]] | None = None
    aliases: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if (self.advantage is None) == (self.token_loss is None):
            raise ValueError(f"method {self.name!r}: give exactly one of advantage= and token_loss=.")
        if self.teacher_pass not in TEACHER_PASSES:
            raise ValueError(f"method {self.name!r}: teacher_pass must be one of {TEACHER_PASSES}.")
        if (self.teacher_pass == "token") != (self.token_loss is None):
            raise ValueError(f"method {self.name!r}: a token loss needs a top-k teacher pass and only it does.")
        if self.token_loss is not None and (self.knobs is None or self.topk not in _field_names(self.knobs)):
            raise ValueError(f"method {self.name!r}: topk= must name a knob of its block holding k.")
        if self.context not in CONTEXTS:
            raise ValueError(f"method {self.name!r}: context must be one of {CONTEXTS}.")
        if self.context == "successful_sibling" and "exclude_self" not in _field_names(self.knobs or _NoKnobs):
            raise ValueError(f"method {self.name!r}: a sibling context needs the knob exclude_self.")
        if self.family not in FAMILIES:
            raise ValueError(f"method {self.name!r}: family must be one of {FAMILIES}.")
        if self.knobs is not None and not dataclasses.is_dataclass(self.knobs):
            raise ValueError(f"method {self.name!r}: knobs must be a dataclass (the block cpo.{self.name}.*).")
        for old, new in self.aliases.items():
            if self.knobs is None or new not in _field_names(self.knobs):
                raise ValueError(f"method {self.name!r}: alias {old!r} names no knob {new!r}.")

    @property
    def module(self) -> str:
        """The module that declares the method (where its advantage wrapper or token loss is written)."""
        return (self.advantage or self.token_loss).__module__

    @property
    def run_setting_keys(self) -> set[str]:
        """The config keys :attr:`run_settings` set."""
        return {override_key(setting) for setting in self.run_settings}

    @property
    def distribution_level(self) -> bool:
        """Its loss reads top-k distributions, which only verl 0.9.1's update hook hands to the loss."""
        return self.token_loss is not None

    def step_knobs(self, knobs: Any, step: int) -> tuple[Any, dict[str, float]]:
        """The knobs of training step ``step`` and the schedule's metrics (the knobs as given without a schedule)."""
        if self.schedule is None:
            return knobs, {}
        return self.schedule(knobs, step)

    def describe(self, context: str | None = None) -> str:
        """One line for the start-up log, under ``context`` (the run's ``cpo.context``; None: the published one)."""
        needs = {
            "token": "the sampled token's log-prob",
            "teacher_topk": "the teacher's top-k",
            "student_topk": "the teacher at the student's top-k",
        }[self.teacher_pass]
        context = teacher_contexts.get_context(context or self.context).describe
        return f"{self.name} ({self.family}): {self.summary}; teacher pass: {needs} under {context}"


@dataclass(frozen=True)
class _NoKnobs:
    pass


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


METHODS: dict[str, Method] = {}
#: name -> advantage wrapper of the registered methods that have one (``methods.cpo_wrappers.CPO_WRAPPERS``).
ADVANTAGE_WRAPPERS: dict[str, Callable[..., Any]] = {}


def register_method(method: Method) -> Method:
    """Add ``method`` to the registry; a name can be registered once."""
    if method.name in METHODS:
        raise ValueError(f"method {method.name!r} is already registered.")
    METHODS[method.name] = method
    if method.advantage is not None:
        ADVANTAGE_WRAPPERS[method.name] = method.advantage
    return method


def registered_method(name: str) -> Method:
    """The method registered as ``name`` so far; ValueError listing the valid names otherwise."""
    if name not in METHODS:
        raise ValueError(f"Unknown cpo.wrap_method {name!r}. Valid names: {', '.join(METHODS)}.")
    return METHODS[name]
