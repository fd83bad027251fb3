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
"""The terms CPO's advantage wrappers are written in: primitives of the hint's log-ratio, the per-response row
predicates (:class:`CPORows`), the per-call quantities (:class:`CPOTerms`), the hint-row rules and :func:`as_wrapper`,
which gives a ``formula(terms, cfg)`` the public wrapper signature. Shared by the 18 CPO wrappers
(:mod:`treetune_recipe.cpo.methods.cpo_wrappers`) and the peers' advantage forms
(:mod:`treetune_recipe.cpo.methods.registry`).

Notation (all ``[B, T]`` unless noted; B responses, T padded response width):
    A      advantages (GRPO, already 0 on padding)
    V      valid response tokens (``response_mask`` as bool)
    g, o   log-probs of the response tokens with / without the hint in the prompt (``teacher_log_probs``,
           ``old_log_probs``)
    H      current-policy token entropy (detached)
    r      sequence reward ``[B]``; D difficulty ``[B]`` (-1 all wrong, +1 all correct, 0 mixed)
    s      ``cfg.success_value``, the reward of a correct response (1 unless configured: the reference's r == 1)
    δ      log-ratio g - o;  ρ̃ = clamp(exp δ, 1/λ, λ);  MI = exp(g)·δ;  MI_c = min(MI, 10);  δ_c = clamp(δ, ±10)
    U      per-sequence min-max entropy over valid tokens, in [0, 1] on V
    K̄, Ū   per-sequence mean of δ and of H over valid tokens (broadcast over T)
    λ, α⁺, α⁻  ``cfg.cpo_lambda``, ``cfg.pos_alpha``, ``cfg.neg_alpha``
"""

from collections.abc import Callable
from functools import cached_property

import torch

# ----------------------------------------------------------------------------------------------------------------------
# Primitives
# ----------------------------------------------------------------------------------------------------------------------

#: The reward of a correct response, ``cpo.success_value``'s default (the reference's ``r == 1``).
DEFAULT_SUCCESS_VALUE = 1.0
MI_CLAMP_MAX = 10.0  # upper clamp of MI in the *_clamp_* wrappers
LOG_RATIO_CLAMP = 10.0  # symmetric clamp of δ in the tok_kl wrappers
_UNCERTAINTY_EPS = 1e-8  # denominator guard of the min-max uncertainty
_SEQ_MEAN_EPS = 1e-10  # denominator guard of the per-sequence means


def succeeded(seq_rewards: torch.Tensor, success_value: float) -> torch.Tensor:
    """Which responses are correct: reward == ``success_value``, exact float equality (the reference's ``r == 1``); any
    other reward is a failure. ``[B] -> bool [B]``. The recipe's one definition of a correct response: the wrappers'
    rows (:class:`CPORows`), the difficulty labels, the teacher contexts, the credit dump and the metrics use it."""
    return seq_rewards == success_value


def success_value_of(cfg) -> float:
    """``cfg.success_value``; :data:`DEFAULT_SUCCESS_VALUE` for a ``cfg`` without one (a wrapper's ``cfg`` needs only
    the knobs its formula reads; the trainer passes its ``CPOConfig``, which always has it)."""
    return getattr(cfg, "success_value", DEFAULT_SUCCESS_VALUE)


def log_ratio(teacher_log_probs: torch.Tensor, old_log_probs: torch.Tensor) -> torch.Tensor:
    """δ = g - o, the per-token log-ratio hint vs no hint (the reference calls it "kl"). ``[B, T]``."""
    return teacher_log_probs - old_log_probs


def mutual_information(teacher_log_probs: torch.Tensor, old_log_probs: torch.Tensor) -> torch.Tensor:
    """MI = exp(g)·(g - o): the log-ratio weighted by the hinted probability of the token. ``[B, T]``."""
    return teacher_log_probs.exp() * log_ratio(teacher_log_probs, old_log_probs)


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
    the rules that say which rows read the hint (:func:`rows_reading_hint`). ``success_value`` is s, the reward of a
    correct response: the reference's conditions r == 1 and r == -1 are r == s and r == -s."""

    def __init__(
        self,
        seq_rewards: torch.Tensor,
        difficulty: torch.Tensor,
        advantages: torch.Tensor | None,
        success_value: float,
    ):
        self._advantages = advantages
        self.correct = succeeded(seq_rewards, success_value)  # r == s
        self.wrong = ~self.correct  # r != s
        self.minus_one = seq_rewards == -success_value  # r == -s (never true with 0/1 rewards)
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

    def __init__(
        self,
        advantages,
        teacher_log_probs,
        old_log_probs,
        entropy,
        response_mask,
        seq_rewards,
        difficulty,
        success_value,
    ):
        self.advantages = advantages
        self.teacher_log_probs = teacher_log_probs
        self.old_log_probs = old_log_probs
        self.entropy = entropy
        self.response_mask = response_mask
        self.rows = CPORows(seq_rewards, difficulty, advantages, success_value)

    @cached_property
    def valid(self) -> torch.Tensor:
        return self.response_mask.bool()

    @cached_property
    def correct_tokens(self) -> torch.Tensor:
        """V ∧ (r == s)."""
        return self.valid & self.rows.correct[:, None]

    @cached_property
    def wrong_tokens(self) -> torch.Tensor:
        """V ∧ (r != s)."""
        return self.valid & self.rows.wrong[:, None]

    @cached_property
    def minus_one_tokens(self) -> torch.Tensor:
        """V ∧ (r == -s) (never true with 0/1 rewards)."""
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
        return log_ratio(self.teacher_log_probs, self.old_log_probs)

    @cached_property
    def mi(self) -> torch.Tensor:
        return mutual_information(self.teacher_log_probs, self.old_log_probs)

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
        hint_favoured = self.valid & (ratio >= cpo_lambda) & (self.teacher_log_probs.exp() > 0.1)
        hint_disfavoured = self.valid & (ratio <= 1.0 / cpo_lambda) & (self.old_log_probs.exp() > 0.1)
        return hint_favoured, hint_disfavoured


# ----------------------------------------------------------------------------------------------------------------------
# Hint-row rules and the wrapper signature
# ----------------------------------------------------------------------------------------------------------------------

CPOWrapper = Callable[..., torch.Tensor]
# A wrapper's hint-row rule: rule(rows, cfg) -> bool [B], the rows whose output depends on teacher_log_probs.
HintRowRule = Callable[[CPORows, object], torch.Tensor]


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


def every_row(rows: CPORows, cfg) -> torch.Tensor:
    """Rule: every row (always correct; scores more rows under the hint than a formula may need)."""
    return rows.every


def as_wrapper(formula: Callable[[CPOTerms, object], torch.Tensor]) -> CPOWrapper:
    """Give a ``formula(terms, cfg)`` the public wrapper signature; never return an input tensor itself."""

    def wrapper(
        advantages: torch.Tensor,
        *,
        teacher_log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        entropy: torch.Tensor,
        response_mask: torch.Tensor,
        seq_rewards: torch.Tensor,
        difficulty: torch.Tensor,
        cfg,
    ) -> torch.Tensor:
        terms = CPOTerms(
            advantages,
            teacher_log_probs,
            old_log_probs,
            entropy,
            response_mask,
            seq_rewards,
            difficulty,
            success_value_of(cfg),
        )
        out = formula(terms, cfg)
        return out.clone() if out is advantages else out

    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(wrapper, name, getattr(formula, name))
    return wrapper
