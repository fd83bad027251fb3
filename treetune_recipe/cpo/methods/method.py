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
"""What a method declares: :class:`Method`, one per ``cpo.method``, and the terms its loss is composed of.

A method's loss is the sum of up to three terms, each declared here and each with its own token mask; the config, the
preflight, the trainer, the loss and the experiment read these declarations and never name a method:

- the **policy term** (``policy``): verl's clipped PPO loss on the verifier's advantages (``verifier``), on advantages
  a wrapper reshaped from the teacher's log-prob of each sampled token (``shaped``: the 18 CPO wrappers, RLSD, OPSD's
  sampled-token form; ``advantage`` and ``hint_rows``), or no policy-gradient term (``none``). Its mask is every
  response token (restricted by ``cpo.loss_position`` for a shaped advantage). verl's KL and entropy terms ride with it;
- the **distillation term** (``distillation``, a :class:`Distillation`): a per-token divergence between the student's
  and the teacher's distributions, both computed inside the actor update, times a weight knob. Its mask is the
  response tokens of the rows that have a teacher context (times an optional gate, e.g. SDPG's positive advantages);
- the **reference term** (``reference``, a :class:`ReferenceTerm`): a penalty on the sampled tokens' log-ratio to the
  reference model (SDPG's α regulariser), times a weight knob, over every response token.

``term_weights`` turns a method's knobs into the weights of its policy and distillation terms, so that one knob can
switch between the pure and the hybrid forms (SDPO's ``policy_loss_mode``).

Each method module registers its methods on import (:func:`register_method`);
:mod:`treetune_recipe.cpo.methods.registry` loads them all and is where the rest of the recipe looks a method up
(``get_method``, ``all_methods``). This module imports none of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from treetune_recipe.cpo.teacher import contexts as teacher_contexts
from treetune_verl.config_block import override_key

#: The policy-gradient term: the verifier's advantages, advantages reshaped by the method's wrapper, or none.
POLICY_TERMS = ("verifier", "shaped", "none")
#: Whose top-k ids a distillation term gathers both distributions at (k = 0: the whole vocabulary).
DISTILLATION_IDS = ("teacher_topk", "student_topk")
#: The privileged contexts of the teacher's prompt, by name: the registry of ``treetune_recipe.cpo.teacher.contexts``
#: (the gold solution, the answer, a successful sibling, the environment's feedback).
CONTEXTS = tuple(teacher_contexts.CONTEXTS)
#: How a distillation term is averaged over tokens (``cpo.token_loss_agg``; :func:`.loss.distillation_term`).
TOKEN_LOSS_AGGS = ("seq_mean", "token_mean")


@dataclass(frozen=True)
class Distillation:
    """The distillation term ``weight · agg(gate · w · ℓ)`` over the response tokens of the rows with a teacher context.

    Attributes:
        token_loss: ``fn(student [M, n], teacher [M, n], knobs) -> [M]``, the per-token divergence of full-vocabulary
            log-probs gathered at ``n`` ids (``n`` = k, or the vocabulary).
        ids: whose top-k ids both sides are gathered at (:data:`DISTILLATION_IDS`; the student's carry no gradient).
        topk_knob: the knob holding k (0: every id), or None for a term that always reads the whole vocabulary.
        token_weight: ``fn(log_probs [B, T], old_log_probs [B, T], knobs) -> [B, T]``, a detached per-token weight
            (SDPO's clipped importance ratio), or None.
        weight_knob: the knob holding the term's weight (SDPG's β), or None for 1.
        gate: ``fn(advantages [B, T], knobs) -> [B, T]`` (0/1), the tokens the term keeps (SDPG's positive-advantage
            gating), or None for all.
    """

    token_loss: Callable[..., Any]
    ids: str = "teacher_topk"
    topk_knob: str | None = None
    token_weight: Callable[..., Any] | None = None
    weight_knob: str | None = None
    gate: Callable[..., Any] | None = None


@dataclass(frozen=True)
class ReferenceTerm:
    """The reference term ``weight · agg(penalty(log π(y_t) - log π_ref(y_t)))`` over every response token.

    Attributes:
        penalty: ``fn(log_ratio [B, T], knobs) -> [B, T]``, differentiable in the log-ratio (the current policy's
            log-prob minus verl's reference log-prob of the sampled token).
        weight_knob: the knob holding the term's weight (SDPG's α).
    """

    penalty: Callable[..., Any]
    weight_knob: str


class TermWeights(NamedTuple):
    """The weights of a method's policy and distillation terms at given knobs (0: the term is off)."""

    policy: float
    distillation: float


@dataclass(frozen=True)
class Method:
    """One method of the recipe, selected by ``cpo.method=<name>``.

    Attributes:
        name: the selector value.
        family: its documentation page, ``agent-docs/methods/<family>.md``.
        summary: its formula or loss in one line (the start-up log prints it).
        policy: the policy-gradient term (:data:`POLICY_TERMS`).
        advantage: with ``policy="shaped"``, the wrapper ``fn(advantages, *, teacher_log_probs, old_log_probs, entropy,
            response_mask, seq_rewards, difficulty, cfg) -> [B, T]``; ``teacher_log_probs`` is the teacher's log-prob of
            each sampled token, scored before the update.
        hint_rows: ``rule(rows, cfg) -> bool [B]``, the rows whose shaped advantages read ``teacher_log_probs``.
        distillation: the distillation term, computed inside the update (verl 0.9.1's logits hook), or None.
        reference: the reference term, or None.
        term_weights: ``fn(knobs) -> TermWeights`` when a knob switches the terms on and off (SDPO's
            ``policy_loss_mode``); None: the policy term at 1 unless ``none``, the distillation term at its weight knob.
        context: the teacher's privileged context as published (:data:`CONTEXTS`); ``cpo.context`` selects another.
        published_teacher: the teacher the authors' code runs with (``cpo.teacher: null`` selects it).
        token_loss_agg: how the authors' code averages the distillation term (:data:`TOKEN_LOSS_AGGS`;
            ``cpo.token_loss_agg: null`` selects it).
        knobs: the dataclass of the method's own block ``cpo.<name>.*`` (typed, with help text), or None.
        run_settings: Hydra overrides outside ``cpo.*`` the authors' scripts use (sampling, updates per rollout, KL),
            applied when the method is selected unless the user sets the same key.
        schedule: ``fn(knobs, step, total_steps) -> (knobs, metrics)``: the knobs of training step ``step`` (1-based)
            of ``total_steps`` and metrics to log, or None for knobs constant over the run.
        aliases: former top-level ``cpo.<key>`` names of this method's knobs -> the knob that replaced them.
    """

    name: str
    family: str
    summary: str
    policy: str = "verifier"
    advantage: Callable[..., Any] | None = None
    hint_rows: Callable[..., Any] | None = None
    distillation: Distillation | None = None
    reference: ReferenceTerm | None = None
    term_weights: Callable[[Any], TermWeights] | None = None
    context: str = "gold_solution"
    published_teacher: str = "policy"
    token_loss_agg: str = "seq_mean"
    knobs: type | None = None
    run_settings: tuple[str, ...] = ()
    schedule: Callable[[Any, int, int], tuple[Any, dict[str, float]]] | None = None
    aliases: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if self.policy not in POLICY_TERMS:
            raise ValueError(f"method {self.name!r}: policy must be one of {POLICY_TERMS}.")
        if (self.policy == "shaped") != (self.advantage is not None):
            raise ValueError(f"method {self.name!r}: a shaped policy term needs advantage= and only it does.")
        if self.policy == "none" and self.distillation is None:
            raise ValueError(f"method {self.name!r}: without a policy term it needs a distillation term.")
        if self.knobs is not None and not dataclasses.is_dataclass(self.knobs):
            raise ValueError(f"method {self.name!r}: knobs must be a dataclass (the block cpo.{self.name}.*).")
        knob_names = _field_names(self.knobs or _NoKnobs)
        distillation = self.distillation
        if distillation is not None:
            if distillation.ids not in DISTILLATION_IDS:
                raise ValueError(f"method {self.name!r}: distillation ids must be one of {DISTILLATION_IDS}.")
            for knob in (distillation.topk_knob, distillation.weight_knob):
                if knob is not None and knob not in knob_names:
                    raise ValueError(f"method {self.name!r}: the distillation term names no knob {knob!r}.")
        if self.reference is not None and self.reference.weight_knob not in knob_names:
            raise ValueError(f"method {self.name!r}: the reference term names no knob {self.reference.weight_knob!r}.")
        if self.token_loss_agg not in TOKEN_LOSS_AGGS:
            raise ValueError(f"method {self.name!r}: token_loss_agg must be one of {TOKEN_LOSS_AGGS}.")
        if self.context not in CONTEXTS:
            raise ValueError(f"method {self.name!r}: context must be one of {CONTEXTS}.")
        if self.context == "successful_sibling" and "exclude_self" not in knob_names:
            raise ValueError(f"method {self.name!r}: a sibling context needs the knob exclude_self.")
        for old, new in self.aliases.items():
            if new not in knob_names:
                raise ValueError(f"method {self.name!r}: alias {old!r} names no knob {new!r}.")

    @property
    def module(self) -> str:
        """The module that declares the method (where its wrapper or its distillation loss is written)."""
        return (self.advantage or self.distillation.token_loss).__module__

    @property
    def run_setting_keys(self) -> set[str]:
        """The config keys :attr:`run_settings` set."""
        return {override_key(setting) for setting in self.run_settings}

    @property
    def distribution_level(self) -> bool:
        """It has a distillation term, which reads the student's logits in the update: verl 0.9.1's hook only."""
        return self.distillation is not None

    def weights(self, knobs: Any) -> TermWeights:
        """The weights of the policy and distillation terms at ``knobs`` (:attr:`term_weights`, or the declaration)."""
        if self.term_weights is not None:
            return self.term_weights(knobs)
        distillation = 0.0
        if self.distillation is not None:
            distillation = (
                1.0 if self.distillation.weight_knob is None else float(getattr(knobs, self.distillation.weight_knob))
            )
        return TermWeights(0.0 if self.policy == "none" else 1.0, distillation)

    def topk(self, knobs: Any) -> int | None:
        """k of the distillation term at ``knobs`` (0: every id), or None without a distillation term."""
        if self.distillation is None:
            return None
        return 0 if self.distillation.topk_knob is None else int(getattr(knobs, self.distillation.topk_knob))

    def step_knobs(self, knobs: Any, step: int, total_steps: int) -> tuple[Any, dict[str, float]]:
        """The knobs of training step ``step`` of ``total_steps`` and the schedule's metrics (as given without one)."""
        if self.schedule is None:
            return knobs, {}
        return self.schedule(knobs, step, total_steps)

    def describe(self, context: str | None = None, knobs: Any = None) -> str:
        """One line for the start-up log, under ``context`` (the run's ``cpo.context``; None: the published one) and
        ``knobs`` (the terms they switch off are left out; None: every declared term)."""
        weights = TermWeights(1.0, 1.0) if knobs is None else self.weights(knobs)
        terms = []
        if self.policy != "none" and weights.policy:
            terms.append(
                {"verifier": "PG on the verifier's advantages", "shaped": "PG on shaped advantages"}[self.policy]
            )
        if self.distillation is not None and weights.distillation:
            ids = {"teacher_topk": "the teacher's top-k", "student_topk": "the student's top-k"}[self.distillation.ids]
            support = "the whole vocabulary" if self.distillation.topk_knob is None else ids
            terms.append(f"distillation over {support} (in the update)")
        if self.reference is not None:
            terms.append("a reference term")
        context = teacher_contexts.get_context(context or self.context).describe
        listed = " + ".join(terms)

        return f"{self.name} ({self.family}): {self.summary}; terms: {listed}; teacher context: {context}"


@dataclass(frozen=True)
class _NoKnobs:
    pass


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


METHODS: dict[str, Method] = {}
#: name -> advantage wrapper of the registered methods that have one (``methods.registry.CPO_WRAPPERS``).
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
        raise ValueError(f"Unknown cpo.method {name!r}. Valid names: {', '.join(METHODS)}.")
    return METHODS[name]
