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
"""CPO advantage wrappers: the functions that shape the GRPO advantages with the hint's log-ratio, and their registry.

Read top to bottom: primitives, the wrapper registry with :func:`rows_reading_hint` (which rows read the hint), then
the advantage wrappers (each docstring is its formula, each registration says which rows read δ). The math of the
reference's 18 wrappers is the reference fork's; the differences from it are listed below and noted where they
apply. The difficulty mask, the ``loss_position`` masks and the ``cpo`` advantage estimator are in
:mod:`treetune_recipe.cpo.cpo_core_algos`.

Notation (all ``[B, T]`` unless noted; B responses, T padded response width):
    A      advantages (GRPO, already 0 on padding)
    V      valid response tokens (``response_mask`` as bool)
    g, o   log-probs of the response tokens with / without the hint in the prompt (``gw_log_probs``,
           ``old_log_probs``)
    H      current-policy token entropy (detached)
    r      sequence reward ``[B]``; D difficulty ``[B]`` (-1 all wrong, +1 all correct, 0 mixed)
    δ      log-ratio g - o;  ρ̃ = clamp(exp δ, 1/λ, λ);  MI = exp(g)·δ;  MI_c = min(MI, 10);  δ_c = clamp(δ, ±10)
    U      per-sequence min-max entropy over valid tokens, in [0, 1] on V
    K̄, Ū   per-sequence mean of δ and of H over valid tokens (broadcast over T)
    λ, α⁺, α⁻  ``cfg.cpo_lambda``, ``cfg.pos_alpha``, ``cfg.neg_alpha``

After the reference's wrappers come two privileged-context peers on the same hinted pass, RLSD (``rlsd``) and OPSD's
sampled-token form (``opsd_token``); their docstrings give the paper, the code they follow and where they differ.

Reference quirks kept on purpose (they are part of each formula, so each of the reference's wrappers gives its
reference function's values, float32 within 1e-5, on any input): "correct" means r == 1 and "wrong" r != 1 with exact
float equality; an α branch runs only if the α is truthy (0 or None disable it, a negative α is applied);
``naive*``/``noaccmask`` use the row max of H over all T positions, padding included (harmless in the engine loss:
padded H is 0); the |A|/2 caps of seq_kl/tok_kl; the final sign clamps of the naive_qwen3/noaccmask/mi/mi_unify
families even when both α are 0, and none in the mi3 family or ``mi_clamp_unify_difficulty`` (a wrong response can
end with a positive advantage). Every statement updates valid tokens only; padding is returned as given.

Deliberate differences from the reference: wrappers are functional (a new tensor, never an in-place write);
the never-produced ``yw_rewards`` input is dropped; one name is one wrapper (the reference applied the naive
fallback after ``tok_kl`` and chose ``naive`` vs ``naive_qwen3`` from the backbone class).
"""

from collections.abc import Callable
from functools import cached_property

import torch

# ----------------------------------------------------------------------------------------------------------------------
# Primitives
# ----------------------------------------------------------------------------------------------------------------------

MI_CLAMP_MAX = 10.0  # upper clamp of MI in the *_clamp_* wrappers
LOG_RATIO_CLAMP = 10.0  # symmetric clamp of δ in the tok_kl wrappers
_UNCERTAINTY_EPS = 1e-8  # denominator guard of the min-max uncertainty
_SEQ_MEAN_EPS = 1e-10  # denominator guard of the per-sequence means


def log_ratio(gw_log_probs: torch.Tensor, old_log_probs: torch.Tensor) -> torch.Tensor:
    """δ = g - o, the per-token log-ratio hint vs no hint (the reference calls it "kl"). ``[B, T]``."""
    return gw_log_probs - old_log_probs


def mutual_information(gw_log_probs: torch.Tensor, old_log_probs: torch.Tensor) -> torch.Tensor:
    """MI = exp(g)·(g - o): the log-ratio weighted by the hinted probability of the token. ``[B, T]``."""
    return gw_log_probs.exp() * log_ratio(gw_log_probs, old_log_probs)


def minmax_uncertainty(entropy: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """U = (H - min_V H) / (max_V H - min_V H + 1e-8), min and max per sequence over valid tokens only.

    Args:
        entropy: ``[B, T]`` token entropies H.
        valid: ``[B, T]`` bool mask V.

    Returns:
        ``[B, T]``; in [0, 1] on valid tokens, 0 for a sequence whose valid entropies are all equal. Values on
        padding are meaningless (never read); a sequence without valid tokens gives NaN there, also never read.
    """
    row_min = entropy.masked_fill(~valid, float("inf")).amin(dim=-1, keepdim=True)
    row_max = entropy.masked_fill(~valid, float("-inf")).amax(dim=-1, keepdim=True)
    return (entropy - row_min) / (row_max - row_min + _UNCERTAINTY_EPS)


def sequence_mean(values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Σ_t m·x / (Σ_t m + 1e-10) per sequence, shape ``[B, 1]`` (broadcasts over T). 0 for an empty sequence."""
    mask = response_mask.to(values.dtype)
    return (values * mask).sum(dim=-1, keepdim=True) / (mask.sum(dim=-1, keepdim=True) + _SEQ_MEAN_EPS)


def add_where(advantages: torch.Tensor, where: torch.Tensor, delta: torch.Tensor | float) -> torch.Tensor:
    """A + delta on the positions ``where`` is True, A elsewhere (a new tensor)."""
    return torch.where(where, advantages + delta, advantages)


def clamp_signs(advantages: torch.Tensor, nonneg_where: torch.Tensor, nonpos_where: torch.Tensor) -> torch.Tensor:
    """max(A, 0) on ``nonneg_where``, then min(A, 0) on ``nonpos_where``."""
    advantages = torch.where(nonneg_where, advantages.clamp(min=0), advantages)
    return torch.where(nonpos_where, advantages.clamp(max=0), advantages)


class CPORows:
    """Per-response predicates ``[B]`` (bool) of the reward r and the difficulty D, shared by the wrappers and by
    the rules that say which rows read the hint (:func:`rows_reading_hint`)."""

    def __init__(self, seq_rewards: torch.Tensor, difficulty: torch.Tensor, advantages: torch.Tensor | None = None):
        self._advantages = advantages
        self.correct = seq_rewards == 1  # r == 1
        self.wrong = seq_rewards != 1  # r != 1
        self.minus_one = seq_rewards == -1  # r == -1 (never true with 0/1 rewards)
        self.all_correct_group = difficulty == 1
        self.all_wrong_group = difficulty == -1
        self.mixed_group = difficulty == 0
        self.decided_group = ~self.mixed_group  # D != 0
        self.wrong_in_all_wrong_group = self.wrong & self.all_wrong_group
        self.every = torch.ones_like(self.correct)

    @cached_property
    def nonzero_advantage(self) -> torch.Tensor:
        """Some token of the row has A != 0 (GRPO's A is 0 on every token of a group whose rewards are all equal)."""
        if self._advantages is None:
            raise ValueError(
                "This wrapper's hint rows depend on the advantages: pass advantages= to rows_reading_hint."
            )
        return self._advantages.ne(0).any(dim=-1)


class CPOTerms:
    """The inputs of one wrapper call and the derived quantities, computed once on first use.

    Reward predicates are combined with V (``*_tokens``, ``[B, T]``); difficulty predicates are per sequence
    (``[B, 1]``) and combined with a token set by the formulas. Both come from :class:`CPORows`.
    """

    def __init__(self, advantages, gw_log_probs, old_log_probs, entropy, response_mask, seq_rewards, difficulty):
        self.advantages = advantages
        self.gw_log_probs = gw_log_probs
        self.old_log_probs = old_log_probs
        self.entropy = entropy
        self.response_mask = response_mask
        self.rows = CPORows(seq_rewards, difficulty, advantages)

    @cached_property
    def valid(self) -> torch.Tensor:
        return self.response_mask.bool()

    @cached_property
    def correct_tokens(self) -> torch.Tensor:
        """V ∧ (r == 1)."""
        return self.valid & self.rows.correct[:, None]

    @cached_property
    def wrong_tokens(self) -> torch.Tensor:
        """V ∧ (r != 1)."""
        return self.valid & self.rows.wrong[:, None]

    @cached_property
    def minus_one_tokens(self) -> torch.Tensor:
        """V ∧ (r == -1) (never true with 0/1 rewards)."""
        return self.valid & self.rows.minus_one[:, None]

    @cached_property
    def all_correct_group(self) -> torch.Tensor:
        return self.rows.all_correct_group[:, None]

    @cached_property
    def all_wrong_group(self) -> torch.Tensor:
        return self.rows.all_wrong_group[:, None]

    @cached_property
    def mixed_group(self) -> torch.Tensor:
        return self.rows.mixed_group[:, None]

    @cached_property
    def log_ratio(self) -> torch.Tensor:
        return log_ratio(self.gw_log_probs, self.old_log_probs)

    @cached_property
    def mi(self) -> torch.Tensor:
        return mutual_information(self.gw_log_probs, self.old_log_probs)

    @cached_property
    def mi_clamped(self) -> torch.Tensor:
        return self.mi.clamp(max=MI_CLAMP_MAX)

    @cached_property
    def log_ratio_clamped(self) -> torch.Tensor:
        return self.log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)

    @cached_property
    def uncertainty(self) -> torch.Tensor:
        return minmax_uncertainty(self.entropy, self.valid)

    @cached_property
    def seq_log_ratio(self) -> torch.Tensor:
        return sequence_mean(self.log_ratio, self.response_mask)

    @cached_property
    def seq_entropy(self) -> torch.Tensor:
        return sequence_mean(self.entropy, self.response_mask)

    @cached_property
    def padded_row_max_entropy(self) -> torch.Tensor:
        """max_t H over all T positions, padding included (reference quirk of the naive wrappers). ``[B, 1]``."""
        return self.entropy.amax(dim=-1, keepdim=True)

    def hint_ratio_sets(self, cpo_lambda: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(S⁺, S⁻) = (V ∧ ρ̃ ≥ λ ∧ exp(g) > 0.1,  V ∧ ρ̃ ≤ 1/λ ∧ exp(o) > 0.1), ρ̃ = clamp(exp δ, 1/λ, λ)."""
        ratio = self.log_ratio.exp().clamp(1.0 / cpo_lambda, cpo_lambda)
        hint_favoured = self.valid & (ratio >= cpo_lambda) & (self.gw_log_probs.exp() > 0.1)
        hint_disfavoured = self.valid & (ratio <= 1.0 / cpo_lambda) & (self.old_log_probs.exp() > 0.1)
        return hint_favoured, hint_disfavoured


# ----------------------------------------------------------------------------------------------------------------------
# Wrapper registry
# ----------------------------------------------------------------------------------------------------------------------

CPOWrapper = Callable[..., torch.Tensor]
CPO_WRAPPERS: dict[str, CPOWrapper] = {}
# A wrapper's hint-row rule: rule(rows, cfg) -> bool [B], the rows whose output depends on gw_log_probs.
HintRowRule = Callable[[CPORows, object], torch.Tensor]
CPO_HINT_ROW_RULES: dict[str, HintRowRule] = {}


def alpha_rows(pos: str | None = None, neg: str | None = None) -> HintRowRule:
    """Rule: the :class:`CPORows` set named ``pos`` when α⁺ is truthy, united with the set ``neg`` when α⁻ is truthy.

    Written next to each wrapper from its formula: ``pos``/``neg`` are the rows where the α⁺/α⁻ statements read
    δ = g - o (directly, or through MI, K̄, ρ̃ or a set defined by them). Statements that read only H, U, r or D
    (e.g. the ``A += α⁺·U`` bonus of the mi3/tok_kl families) and the final sign clamps are not counted.
    """

    def rule(rows: CPORows, cfg) -> torch.Tensor:
        selected = torch.zeros_like(rows.every)
        if pos is not None and cfg.pos_alpha:
            selected = selected | getattr(rows, pos)
        if neg is not None and cfg.neg_alpha:
            selected = selected | getattr(rows, neg)
        return selected

    return rule


def _every_row(rows: CPORows, cfg) -> torch.Tensor:
    return rows.every


def register_cpo_wrapper(name: str, hint_rows: HintRowRule = _every_row) -> Callable[[CPOWrapper], CPOWrapper]:
    """Register an advantage wrapper under ``name`` (``cpo.wrap_method``); a name can be registered once.

    A wrapper has the signature ``fn(advantages, *, gw_log_probs, old_log_probs, entropy, response_mask,
    seq_rewards, difficulty, cfg) -> Tensor`` and returns a new ``[B, T]`` tensor without modifying its inputs.
    ``hint_rows`` says which rows read ``gw_log_probs`` (see :func:`rows_reading_hint`); the default, every row, is
    always correct but scores more rows under the hint than a wrapper may need.
    """

    def decorator(fn: CPOWrapper) -> CPOWrapper:
        if name in CPO_WRAPPERS:
            raise ValueError(f"CPO wrapper {name!r} is already registered ({CPO_WRAPPERS[name].__qualname__}).")
        CPO_WRAPPERS[name] = fn
        CPO_HINT_ROW_RULES[name] = hint_rows
        return fn

    return decorator


def rows_reading_hint(
    wrap_method: str,
    *,
    seq_rewards: torch.Tensor,
    difficulty: torch.Tensor,
    cfg,
    advantages: torch.Tensor | None = None,
) -> torch.Tensor:
    """The rows whose shaped advantages depend on ``gw_log_probs`` under ``wrap_method`` and ``cfg``.

    On every other row the wrapper's output is bit-for-bit the same whatever ``gw_log_probs`` holds there, so the
    trainer scores only these rows under the hint prompt (``cpo.hint.rescore=needed``) and gives the others
    ``gw_log_probs = old_log_probs``. Each wrapper's rule is registered with it (``hint_rows=`` below).

    Args:
        wrap_method: a registered wrapper name.
        seq_rewards: ``[B]`` sequence rewards (correct means r == 1, as in the wrappers).
        difficulty: ``[B]`` difficulty labels (-1, 0, +1).
        cfg: any object with ``pos_alpha``, ``neg_alpha`` (and ``cpo_lambda``), as for the wrappers.
        advantages: ``[B, T]`` advantages, for the wrappers whose rows depend on them (``rlsd``: rows with A != 0).

    Returns:
        bool ``[B]``.
    """
    get_cpo_wrapper(wrap_method)  # a clear error for an unknown name
    return CPO_HINT_ROW_RULES[wrap_method](CPORows(seq_rewards, difficulty, advantages), cfg)


def get_cpo_wrapper(name: str) -> CPOWrapper:
    """The wrapper registered as ``name``; ValueError listing the valid names otherwise."""
    if name not in CPO_WRAPPERS:
        raise ValueError(f"Unknown CPO wrap_method {name!r}. Valid names: {', '.join(CPO_WRAPPERS)}.")
    return CPO_WRAPPERS[name]


def _formula(formula: Callable[[CPOTerms, object], torch.Tensor]) -> CPOWrapper:
    """Give a ``formula(terms, cfg)`` the public wrapper signature; never return an input tensor itself."""

    def wrapper(
        advantages: torch.Tensor,
        *,
        gw_log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        entropy: torch.Tensor,
        response_mask: torch.Tensor,
        seq_rewards: torch.Tensor,
        difficulty: torch.Tensor,
        cfg,
    ) -> torch.Tensor:
        terms = CPOTerms(advantages, gw_log_probs, old_log_probs, entropy, response_mask, seq_rewards, difficulty)
        out = formula(terms, cfg)
        return out.clone() if out is advantages else out

    wrapper.__name__, wrapper.__qualname__, wrapper.__doc__ = formula.__name__, formula.__qualname__, formula.__doc__
    return wrapper


# ----------------------------------------------------------------------------------------------------------------------
# The reference's 18 advantage wrappers. Statements apply in the order written.
# ----------------------------------------------------------------------------------------------------------------------


def _entropy_credit(x: CPOTerms, cfg, favoured: torch.Tensor, disfavoured: torch.Tensor) -> torch.Tensor:
    """favoured: A += α⁺·H;  disfavoured: A -= α⁻·(max_t H - H), the row max over all T (padding included)."""
    adv = x.advantages
    if cfg.pos_alpha:
        adv = add_where(adv, favoured, cfg.pos_alpha * x.entropy)
    if cfg.neg_alpha:
        adv = add_where(adv, disfavoured, -cfg.neg_alpha * (x.padded_row_max_entropy - x.entropy))
    return adv


@register_cpo_wrapper("naive", hint_rows=alpha_rows(pos="every", neg="every"))
@_formula
def naive(x: CPOTerms, cfg) -> torch.Tensor:
    """S⁺: A += α⁺·H;  S⁻: A -= α⁻·(max_t H - H) (row max over all T, padding included). No reward condition."""
    hint_favoured, hint_disfavoured = x.hint_ratio_sets(cfg.cpo_lambda)
    return _entropy_credit(x, cfg, hint_favoured, hint_disfavoured)


@register_cpo_wrapper("naive_qwen3", hint_rows=alpha_rows(pos="correct", neg="minus_one"))
@_formula
def naive_qwen3(x: CPOTerms, cfg) -> torch.Tensor:
    """S⁺∧(r=1): A += α⁺·H;  S⁻∧(r=-1): A -= α⁻·(max_t H - H);  then A ≥ 0 on r=1, A ≤ 0 on r=-1."""
    hint_favoured, hint_disfavoured = x.hint_ratio_sets(cfg.cpo_lambda)
    adv = _entropy_credit(x, cfg, hint_favoured & x.correct_tokens, hint_disfavoured & x.minus_one_tokens)
    return clamp_signs(adv, x.correct_tokens, x.minus_one_tokens)


@register_cpo_wrapper("noaccmask", hint_rows=alpha_rows(pos="every", neg="every"))
@_formula
def noaccmask(x: CPOTerms, cfg) -> torch.Tensor:
    """``naive`` (no reward condition on S±), then A ≥ 0 on r=1, A ≤ 0 on r=-1."""
    hint_favoured, hint_disfavoured = x.hint_ratio_sets(cfg.cpo_lambda)
    adv = _entropy_credit(x, cfg, hint_favoured, hint_disfavoured)
    return clamp_signs(adv, x.correct_tokens, x.minus_one_tokens)


@register_cpo_wrapper("mi", hint_rows=alpha_rows(pos="every", neg="every"))
@_formula
def mi(x: CPOTerms, cfg) -> torch.Tensor:
    """MI ≥ 0: A += α⁺·MI·U;  MI < 0: A += α⁻·MI·(1-U) (any reward);  then A ≥ 0 on r=1, A ≤ 0 on r=-1."""
    adv = x.advantages
    if cfg.pos_alpha:
        adv = add_where(adv, x.valid & (x.mi >= 0), cfg.pos_alpha * x.mi * x.uncertainty)
    if cfg.neg_alpha:
        adv = add_where(adv, x.valid & (x.mi < 0), cfg.neg_alpha * x.mi * (1 - x.uncertainty))
    return clamp_signs(adv, x.correct_tokens, x.minus_one_tokens)


@register_cpo_wrapper("mi_accmask", hint_rows=alpha_rows(pos="correct", neg="minus_one"))
@_formula
def mi_accmask(x: CPOTerms, cfg) -> torch.Tensor:
    """r=1 ∧ MI ≥ 0: A += α⁺·MI·(1+U);  r=-1 ∧ MI < 0: A += α⁻·MI·(2-U);  then A ≥ 0 on r=1, A ≤ 0 on r=-1."""
    adv = x.advantages
    if cfg.pos_alpha:
        adv = add_where(adv, x.correct_tokens & (x.mi >= 0), cfg.pos_alpha * x.mi * (1 + x.uncertainty))
    if cfg.neg_alpha:
        adv = add_where(adv, x.minus_one_tokens & (x.mi < 0), cfg.neg_alpha * x.mi * (2 - x.uncertainty))
    return clamp_signs(adv, x.correct_tokens, x.minus_one_tokens)


def _mi_unify(x: CPOTerms, cfg, mi: torch.Tensor) -> torch.Tensor:
    adv = x.advantages
    if cfg.pos_alpha:
        adv = add_where(adv, x.correct_tokens, cfg.pos_alpha * mi * (1 - x.uncertainty))
    if cfg.neg_alpha:
        adv = add_where(adv, x.minus_one_tokens, cfg.neg_alpha * mi * (1 - x.uncertainty))
    return clamp_signs(adv, x.correct_tokens, x.minus_one_tokens)


@register_cpo_wrapper("mi_unify", hint_rows=alpha_rows(pos="correct", neg="minus_one"))
@_formula
def mi_unify(x: CPOTerms, cfg) -> torch.Tensor:
    """r=1: A += α⁺·MI·(1-U);  r=-1: A += α⁻·MI·(1-U);  then A ≥ 0 on r=1, A ≤ 0 on r=-1."""
    return _mi_unify(x, cfg, x.mi)


@register_cpo_wrapper("mi_clamp_unify", hint_rows=alpha_rows(pos="correct", neg="minus_one"))
@_formula
def mi_clamp_unify(x: CPOTerms, cfg) -> torch.Tensor:
    """``mi_unify`` with MI_c = min(MI, 10) in place of MI."""
    return _mi_unify(x, cfg, x.mi_clamped)


@register_cpo_wrapper("mi_clamp_unify_difficulty", hint_rows=alpha_rows(pos="decided_group", neg="mixed_group"))
@_formula
def mi_clamp_unify_difficulty(x: CPOTerms, cfg) -> torch.Tensor:
    """D ≠ 0: A += α⁺·MI_c·(1-U);  D = 0 (mixed group): A += α⁻·MI_c·(1-U). Any reward, no sign clamp."""
    adv = x.advantages
    if cfg.pos_alpha:
        adv = add_where(adv, x.valid & ~x.mixed_group, cfg.pos_alpha * x.mi_clamped * (1 - x.uncertainty))
    if cfg.neg_alpha:
        adv = add_where(adv, x.valid & x.mixed_group, cfg.neg_alpha * x.mi_clamped * (1 - x.uncertainty))
    return adv


def _uncertainty_bonus(x: CPOTerms, cfg) -> torch.Tensor:
    """r=1: A += α⁺·U (the correct-response update shared by the mi3 and tok_kl families)."""
    if cfg.pos_alpha:
        return add_where(x.advantages, x.correct_tokens, cfg.pos_alpha * x.uncertainty)
    return x.advantages


def _mi3(x: CPOTerms, cfg, wrong: torch.Tensor, sign: float, with_negative_mi: bool) -> torch.Tensor:
    adv = _uncertainty_bonus(x, cfg)
    if cfg.neg_alpha:
        adv = add_where(adv, wrong & (x.mi >= 0), sign * cfg.neg_alpha * x.mi * x.uncertainty)
        if with_negative_mi:
            adv = add_where(adv, wrong & (x.mi < 0), sign * cfg.neg_alpha * x.mi * (1 - x.uncertainty))
    return adv


@register_cpo_wrapper("mi3", hint_rows=alpha_rows(neg="wrong"))
@_formula
def mi3(x: CPOTerms, cfg) -> torch.Tensor:
    """r=1: A += α⁺·U;  r≠1: A += α⁻·MI·U where MI ≥ 0, A += α⁻·MI·(1-U) where MI < 0. No sign clamp."""
    return _mi3(x, cfg, x.wrong_tokens, sign=1.0, with_negative_mi=True)


@register_cpo_wrapper("negonly_mi3", hint_rows=alpha_rows(neg="wrong_in_all_wrong_group"))
@_formula
def negonly_mi3(x: CPOTerms, cfg) -> torch.Tensor:
    """``mi3`` with the wrong-response updates restricted to all-wrong groups (D = -1)."""
    return _mi3(x, cfg, x.wrong_tokens & x.all_wrong_group, sign=1.0, with_negative_mi=True)


@register_cpo_wrapper("reverse_mi3", hint_rows=alpha_rows(neg="wrong"))
@_formula
def reverse_mi3(x: CPOTerms, cfg) -> torch.Tensor:
    """``mi3`` with both wrong-response updates subtracted: A -= α⁻·MI·U (MI ≥ 0), A -= α⁻·MI·(1-U) (MI < 0)."""
    return _mi3(x, cfg, x.wrong_tokens, sign=-1.0, with_negative_mi=True)


@register_cpo_wrapper("addition_mi3", hint_rows=alpha_rows(neg="wrong"))
@_formula
def addition_mi3(x: CPOTerms, cfg) -> torch.Tensor:
    """``mi3`` without the MI < 0 update: r=1: A += α⁺·U;  r≠1 ∧ MI ≥ 0: A += α⁻·MI·U."""
    return _mi3(x, cfg, x.wrong_tokens, sign=1.0, with_negative_mi=False)


@register_cpo_wrapper("negonly_mi", hint_rows=alpha_rows(neg="wrong_in_all_wrong_group"))
@_formula
def negonly_mi(x: CPOTerms, cfg) -> torch.Tensor:
    """r=1: A += α⁺·U;  r≠1 ∧ D=-1: A += α⁻·MI (raw MI, no uncertainty factor, no clamp)."""
    adv = _uncertainty_bonus(x, cfg)
    if cfg.neg_alpha:
        adv = add_where(adv, x.wrong_tokens & x.all_wrong_group, cfg.neg_alpha * x.mi)
    return adv


@register_cpo_wrapper("mi2", hint_rows=alpha_rows(neg="wrong"))
@_formula
def mi2(x: CPOTerms, cfg) -> torch.Tensor:
    """r=1: A += α⁺·U;  r≠1: A += α⁻·MI (raw MI). (The reference also returned MI; only A was ever used.)"""
    adv = _uncertainty_bonus(x, cfg)
    if cfg.neg_alpha:
        adv = add_where(adv, x.wrong_tokens, cfg.neg_alpha * x.mi)
    return adv


@register_cpo_wrapper("negonly_seq_kl", hint_rows=alpha_rows(pos="correct", neg="wrong_in_all_wrong_group"))
@_formula
def negonly_seq_kl(x: CPOTerms, cfg) -> torch.Tensor:
    """r=1: A += α⁺·K̄;  r≠1 ∧ D=-1: A += α⁻·K̄. K̄ = the sequence's mean log-ratio; no entropy, no clamp."""
    adv = x.advantages
    if cfg.pos_alpha:
        adv = add_where(adv, x.correct_tokens, cfg.pos_alpha * x.seq_log_ratio)
    if cfg.neg_alpha:
        adv = add_where(adv, x.wrong_tokens & x.all_wrong_group, cfg.neg_alpha * x.seq_log_ratio)
    return adv


@register_cpo_wrapper("seq_kl", hint_rows=alpha_rows(neg="wrong"))
@_formula
def seq_kl(x: CPOTerms, cfg) -> torch.Tensor:
    """r=1: A += α⁺·Ū if D=1 else max(α⁺·Ū, -|A|/2);  r≠1: A += α⁻·K̄ if D=-1 else min(α⁻·K̄, |A|/2)."""
    adv = x.advantages
    if cfg.pos_alpha:
        bonus = cfg.pos_alpha * x.seq_entropy
        adv = add_where(adv, x.correct_tokens & x.all_correct_group, bonus)
        adv = add_where(adv, x.correct_tokens & ~x.all_correct_group, torch.maximum(bonus, -adv.abs() / 2))
    if cfg.neg_alpha:
        shift = cfg.neg_alpha * x.seq_log_ratio
        adv = add_where(adv, x.wrong_tokens & x.all_wrong_group, shift)
        adv = add_where(adv, x.wrong_tokens & ~x.all_wrong_group, torch.minimum(shift, adv.abs() / 2))
    return adv


@register_cpo_wrapper("negonly_tok_kl", hint_rows=alpha_rows(neg="wrong_in_all_wrong_group"))
@_formula
def negonly_tok_kl(x: CPOTerms, cfg) -> torch.Tensor:
    """r=1: A += α⁺·U;  r≠1 ∧ D=-1: A += α⁻·δ_c, δ_c = clamp(g - o, -10, 10)."""
    adv = _uncertainty_bonus(x, cfg)
    if cfg.neg_alpha:
        adv = add_where(adv, x.wrong_tokens & x.all_wrong_group, cfg.neg_alpha * x.log_ratio_clamped)
    return adv


@register_cpo_wrapper("tok_kl", hint_rows=alpha_rows(neg="wrong"))
@_formula
def tok_kl(x: CPOTerms, cfg) -> torch.Tensor:
    """r=1: A += α⁺·U;  r≠1: A += α⁻·δ_c if D=-1 else min(α⁻·δ_c, |A|/2). (No naive fallback afterwards.)"""
    adv = _uncertainty_bonus(x, cfg)
    if cfg.neg_alpha:
        shift = cfg.neg_alpha * x.log_ratio_clamped
        adv = add_where(adv, x.wrong_tokens & x.all_wrong_group, shift)
        adv = add_where(adv, x.wrong_tokens & ~x.all_wrong_group, torch.minimum(shift, adv.abs() / 2))
    return adv


# ----------------------------------------------------------------------------------------------------------------------
# Privileged-context peers on the same hinted pass: the teacher is the policy under the hint prompt (g), the student
# the policy under the plain prompt (o), both on the sampled response tokens.
# ----------------------------------------------------------------------------------------------------------------------


def _rows_with_advantage(rows: CPORows, cfg) -> torch.Tensor:
    return rows.nonzero_advantage


@register_cpo_wrapper("rlsd", hint_rows=_rows_with_advantage)
@_formula
def rlsd(x: CPOTerms, cfg) -> torch.Tensor:
    """V: Â = A·((1-λ) + λ·clip(exp(sign(A)·δ), 1-ε, 1+ε)), λ = ``cfg.rlsd_lambda``, ε = ``cfg.rlsd_clip``.

    RLSD, "Self-Distilled RLVR" (Yang et al., arXiv 2604.03128, Eq. 13-15): the verifier's advantage sets the
    direction, the teacher/student log-ratio its size per token. A = 0 gives Â = 0 (an all-wrong group of ±1 rewards
    still gets nothing); with λ = 0, Â = A. Follows the official code (``iie-ycx/RLSD``,
    ``verl/workers/actor/dp_opsd_actor.py``, ``_build_stgca_advantages``: weight, clip and mix as above), run as its
    training script runs it: the trainer passes the step's λ, falling linearly to 0 over
    ``cpo.rlsd_lambda_decay_steps`` = 60 steps (``CPOConfig.rlsd_lambda_at``), and the published teacher
    (``cpo.teacher: null``) is the reference model refreshed from the actor after every 20 updates; the experiment's
    RLSD rows also clip the ratio at 0.2 / 0.28 and weigh the KL term 0. Remaining differences: the student term is
    the rollout policy's ``old_log_probs``, as SDPG's re-implementation (``lauyikfung/SDPG``, ``core_algos.py``)
    takes it, where the official code detaches the current policy's log-probs in each update micro-batch (the same
    values in a step's first mini-batch); the teacher's log-probs are computed once per step, before the update.
    """
    weight = torch.exp(torch.sign(x.advantages) * x.log_ratio).clamp(1.0 - cfg.rlsd_clip, 1.0 + cfg.rlsd_clip)
    shaped = x.advantages * ((1.0 - cfg.rlsd_lambda) + cfg.rlsd_lambda * weight)
    return torch.where(x.valid, shaped, x.advantages)


@register_cpo_wrapper("opsd_token")
@_formula
def opsd_token(x: CPOTerms, cfg) -> torch.Tensor:
    """V: Â = δ = g - o (padding as given). The verifier's advantage is not used.

    OPSD, sampled-token form (Zhao et al., arXiv 2601.18734; official code ``siyan-zhao/OPSD``, ``opsd_trainer.py``,
    ``use_tinker_loss``): the advantage of each sampled token is the teacher's log-prob minus the student's,
    detached. It gives a signal in every group, all-wrong ones included. The published teacher (``cpo.teacher:
    null``) is the fixed initial policy, as the official README recommends (``--fixed_teacher``); the experiment's OPSD
    rows take one optimizer update per rollout batch, temperature 1.1 for sampling and every log-softmax, and weigh
    the KL term 0, as its scripts do. Remaining differences: Â enters verl's clipped PPO surrogate (the official loss
    is the unclipped ``-Â·log π``; with one update per batch the two have the same gradient, Â·∇log π, since the
    policy is then the rollout policy); the student term is ``old_log_probs`` (the code uses the current policy,
    detached: the same values with one update per batch); the paper's main form, full-vocabulary JSD (β = 0.5), is not
    implemented (the recipe's passes return the sampled token's log-prob only).
    """
    return torch.where(x.valid, x.log_ratio, x.advantages)
