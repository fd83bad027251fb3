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
"""CPO's 18 advantage wrappers (the reference fork's), registered as methods of the recipe, and the wrapper API.

Each wrapper shapes the GRPO advantages with the hint's log-ratio; its docstring is its formula, its registration says
which rows read δ (the hint-row rule). The terms they are written in (primitives, :class:`CPORows`, :class:`CPOTerms`,
the notation) are in :mod:`treetune_recipe.cpo.methods.advantage_terms`; the registry of all methods, peers included, is
:mod:`treetune_recipe.cpo.methods.method`; :mod:`treetune_recipe.cpo.methods.registry` loads them all, and its
``CPO_WRAPPERS`` (name -> wrapper) holds every method with an advantage wrapper: these 18 and the peers' advantage
forms (``rlsd``, ``opsd_token``). The difficulty mask, the ``loss_position`` masks and the ``cpo`` advantage
estimator are in :mod:`treetune_recipe.cpo.methods.core_algos`. Reference quirks kept on purpose (they are part of each
formula, so each of the reference's wrappers gives its reference function's values, float32 within 1e-5, on any input,
with the default ``success_value`` of 1): "correct" means r == 1 and "wrong" r != 1 with exact float equality, where 1
is ``cfg.success_value`` (``cpo.success_value``, :func:`treetune_recipe.cpo.methods.advantage_terms.succeeded`) and the
r = -1 of some formulas is -``success_value``; an α branch runs only if the α is truthy (0 or None disable it, a
negative α is applied); ``naive*``/``noaccmask`` use the row max of H over all T positions, padding included (harmless
in the engine loss: padded H is 0); the |A|/2 caps of seq_kl/tok_kl; the final sign clamps of the
naive_qwen3/noaccmask/mi/mi_unify families even when both α are 0, and none in the mi3 family or
``mi_clamp_unify_difficulty`` (a wrong response can end with a positive advantage). Every statement updates valid tokens
only; padding is returned as given.

Deliberate differences from the reference: wrappers are functional (a new tensor, never an in-place write);
the never-produced ``yw_rewards`` input is dropped; one name is one wrapper (the reference applied the naive
fallback after ``tok_kl`` and chose ``naive`` vs ``naive_qwen3`` from the backbone class).
"""

import torch

from treetune_recipe.cpo.methods.advantage_terms import (  # noqa: F401  (re-exported: the wrapper API's primitives)
    CPORows,
    CPOTerms,
    CPOWrapper,
    HintRowRule,
    add_where,
    alpha_rows,
    as_wrapper,
    clamp_signs,
    every_row,
    log_ratio,
    minmax_uncertainty,
    mutual_information,
    sequence_mean,
    success_value_of,
)
from treetune_recipe.cpo.methods.method import Method, register_method


def register_cpo_wrapper(name: str, hint_rows: HintRowRule = every_row):
    """Register an advantage wrapper as the CPO-family method ``name`` (``cpo.method``); a name can be
    registered once.

    A wrapper has the signature ``fn(advantages, *, teacher_log_probs, old_log_probs, entropy, response_mask,
    seq_rewards, difficulty, cfg) -> Tensor`` and returns a new ``[B, T]`` tensor without modifying its inputs;
    ``cfg`` carries the knobs and ``success_value`` (the reward of a correct response; 1 when ``cfg`` has none).
    ``hint_rows`` says which rows read ``teacher_log_probs`` (see :func:`rows_reading_hint`); the default, every row, is
    always correct but scores more rows under the hint than a wrapper may need. A CPO wrapper's teacher is the rollout
    policy and it has no knobs of its own (it reads ``cpo.cpo_lambda``, ``cpo.pos_alpha``, ``cpo.neg_alpha``).
    """

    def decorator(fn: CPOWrapper) -> CPOWrapper:
        summary = (fn.__doc__ or name).strip().split("\n")[0]
        register_method(
            Method(name=name, family="cpo", summary=summary, policy="shaped", advantage=fn, hint_rows=hint_rows)
        )
        return fn

    return decorator


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
@as_wrapper
def naive(x: CPOTerms, cfg) -> torch.Tensor:
    """S⁺: A += α⁺·H;  S⁻: A -= α⁻·(max_t H - H) (row max over all T, padding included). No reward condition."""
    hint_favoured, hint_disfavoured = x.hint_ratio_sets(cfg.cpo_lambda)
    return _entropy_credit(x, cfg, hint_favoured, hint_disfavoured)


@register_cpo_wrapper("naive_qwen3", hint_rows=alpha_rows(pos="correct", neg="minus_one"))
@as_wrapper
def naive_qwen3(x: CPOTerms, cfg) -> torch.Tensor:
    """S⁺∧(r=1): A += α⁺·H;  S⁻∧(r=-1): A -= α⁻·(max_t H - H);  then A ≥ 0 on r=1, A ≤ 0 on r=-1."""
    hint_favoured, hint_disfavoured = x.hint_ratio_sets(cfg.cpo_lambda)
    adv = _entropy_credit(x, cfg, hint_favoured & x.correct_tokens, hint_disfavoured & x.minus_one_tokens)
    return clamp_signs(adv, x.correct_tokens, x.minus_one_tokens)


@register_cpo_wrapper("noaccmask", hint_rows=alpha_rows(pos="every", neg="every"))
@as_wrapper
def noaccmask(x: CPOTerms, cfg) -> torch.Tensor:
    """``naive`` (no reward condition on S±), then A ≥ 0 on r=1, A ≤ 0 on r=-1."""
    hint_favoured, hint_disfavoured = x.hint_ratio_sets(cfg.cpo_lambda)
    adv = _entropy_credit(x, cfg, hint_favoured, hint_disfavoured)
    return clamp_signs(adv, x.correct_tokens, x.minus_one_tokens)


@register_cpo_wrapper("mi", hint_rows=alpha_rows(pos="every", neg="every"))
@as_wrapper
def mi(x: CPOTerms, cfg) -> torch.Tensor:
    """MI ≥ 0: A += α⁺·MI·U;  MI < 0: A += α⁻·MI·(1-U) (any reward);  then A ≥ 0 on r=1, A ≤ 0 on r=-1."""
    adv = x.advantages
    if cfg.pos_alpha:
        adv = add_where(adv, x.valid & (x.mi >= 0), cfg.pos_alpha * x.mi * x.uncertainty)
    if cfg.neg_alpha:
        adv = add_where(adv, x.valid & (x.mi < 0), cfg.neg_alpha * x.mi * (1 - x.uncertainty))
    return clamp_signs(adv, x.correct_tokens, x.minus_one_tokens)


@register_cpo_wrapper("mi_accmask", hint_rows=alpha_rows(pos="correct", neg="minus_one"))
@as_wrapper
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
@as_wrapper
def mi_unify(x: CPOTerms, cfg) -> torch.Tensor:
    """r=1: A += α⁺·MI·(1-U);  r=-1: A += α⁻·MI·(1-U);  then A ≥ 0 on r=1, A ≤ 0 on r=-1."""
    return _mi_unify(x, cfg, x.mi)


@register_cpo_wrapper("mi_clamp_unify", hint_rows=alpha_rows(pos="correct", neg="minus_one"))
@as_wrapper
def mi_clamp_unify(x: CPOTerms, cfg) -> torch.Tensor:
    """``mi_unify`` with MI_c = min(MI, 10) in place of MI."""
    return _mi_unify(x, cfg, x.mi_clamped)


@register_cpo_wrapper("mi_clamp_unify_difficulty", hint_rows=alpha_rows(pos="decided_group", neg="mixed_group"))
@as_wrapper
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
@as_wrapper
def mi3(x: CPOTerms, cfg) -> torch.Tensor:
    """r=1: A += α⁺·U;  r≠1: A += α⁻·MI·U where MI ≥ 0, A += α⁻·MI·(1-U) where MI < 0. No sign clamp."""
    return _mi3(x, cfg, x.wrong_tokens, sign=1.0, with_negative_mi=True)


@register_cpo_wrapper("negonly_mi3", hint_rows=alpha_rows(neg="wrong_in_all_wrong_group"))
@as_wrapper
def negonly_mi3(x: CPOTerms, cfg) -> torch.Tensor:
    """``mi3`` with the wrong-response updates restricted to all-wrong groups (D = -1)."""
    return _mi3(x, cfg, x.wrong_tokens & x.all_wrong_group, sign=1.0, with_negative_mi=True)


@register_cpo_wrapper("reverse_mi3", hint_rows=alpha_rows(neg="wrong"))
@as_wrapper
def reverse_mi3(x: CPOTerms, cfg) -> torch.Tensor:
    """``mi3`` with both wrong-response updates subtracted: A -= α⁻·MI·U (MI ≥ 0), A -= α⁻·MI·(1-U) (MI < 0)."""
    return _mi3(x, cfg, x.wrong_tokens, sign=-1.0, with_negative_mi=True)


@register_cpo_wrapper("addition_mi3", hint_rows=alpha_rows(neg="wrong"))
@as_wrapper
def addition_mi3(x: CPOTerms, cfg) -> torch.Tensor:
    """``mi3`` without the MI < 0 update: r=1: A += α⁺·U;  r≠1 ∧ MI ≥ 0: A += α⁻·MI·U."""
    return _mi3(x, cfg, x.wrong_tokens, sign=1.0, with_negative_mi=False)


@register_cpo_wrapper("negonly_mi", hint_rows=alpha_rows(neg="wrong_in_all_wrong_group"))
@as_wrapper
def negonly_mi(x: CPOTerms, cfg) -> torch.Tensor:
    """r=1: A += α⁺·U;  r≠1 ∧ D=-1: A += α⁻·MI (raw MI, no uncertainty factor, no clamp)."""
    adv = _uncertainty_bonus(x, cfg)
    if cfg.neg_alpha:
        adv = add_where(adv, x.wrong_tokens & x.all_wrong_group, cfg.neg_alpha * x.mi)
    return adv


@register_cpo_wrapper("mi2", hint_rows=alpha_rows(neg="wrong"))
@as_wrapper
def mi2(x: CPOTerms, cfg) -> torch.Tensor:
    """r=1: A += α⁺·U;  r≠1: A += α⁻·MI (raw MI). (The reference also returned MI; only A was ever used.)"""
    adv = _uncertainty_bonus(x, cfg)
    if cfg.neg_alpha:
        adv = add_where(adv, x.wrong_tokens, cfg.neg_alpha * x.mi)
    return adv


@register_cpo_wrapper("negonly_seq_kl", hint_rows=alpha_rows(pos="correct", neg="wrong_in_all_wrong_group"))
@as_wrapper
def negonly_seq_kl(x: CPOTerms, cfg) -> torch.Tensor:
    """r=1: A += α⁺·K̄;  r≠1 ∧ D=-1: A += α⁻·K̄. K̄ = the sequence's mean log-ratio; no entropy, no clamp."""
    adv = x.advantages
    if cfg.pos_alpha:
        adv = add_where(adv, x.correct_tokens, cfg.pos_alpha * x.seq_log_ratio)
    if cfg.neg_alpha:
        adv = add_where(adv, x.wrong_tokens & x.all_wrong_group, cfg.neg_alpha * x.seq_log_ratio)
    return adv


@register_cpo_wrapper("seq_kl", hint_rows=alpha_rows(neg="wrong"))
@as_wrapper
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
@as_wrapper
def negonly_tok_kl(x: CPOTerms, cfg) -> torch.Tensor:
    """r=1: A += α⁺·U;  r≠1 ∧ D=-1: A += α⁻·δ_c, δ_c = clamp(g - o, -10, 10)."""
    adv = _uncertainty_bonus(x, cfg)
    if cfg.neg_alpha:
        adv = add_where(adv, x.wrong_tokens & x.all_wrong_group, cfg.neg_alpha * x.log_ratio_clamped)
    return adv


@register_cpo_wrapper("tok_kl", hint_rows=alpha_rows(neg="wrong"))
@as_wrapper
def tok_kl(x: CPOTerms, cfg) -> torch.Tensor:
    """r=1: A += α⁺·U;  r≠1: A += α⁻·δ_c if D=-1 else min(α⁻·δ_c, |A|/2). (No naive fallback afterwards.)"""
    adv = _uncertainty_bonus(x, cfg)
    if cfg.neg_alpha:
        shift = cfg.neg_alpha * x.log_ratio_clamped
        adv = add_where(adv, x.wrong_tokens & x.all_wrong_group, shift)
        adv = add_where(adv, x.wrong_tokens & ~x.all_wrong_group, torch.minimum(shift, adv.abs() / 2))
    return adv
