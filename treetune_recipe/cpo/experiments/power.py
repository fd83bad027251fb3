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
"""How many seeds, held-out prompts and samples a paired comparison needs: the power analysis stated before the runs.

The quantity compared is a method's final validation accuracy minus GRPO's, per seed (same data order, same
validation prompts). Its variance across seeds has two parts:

- **training**, σ²_train: two RL runs of 40 steps from one warm start end at different policies;
- **evaluation**, 2·p(1−p)/(P·S): each final accuracy is the mean of P held-out prompts × S samples of a policy whose
  accuracy is about p. This is the Bernoulli noise of the samples with the prompts held fixed (both methods are
  validated on the same prompts, so the prompts' own difficulty cancels in the difference).

:func:`fit_variance` estimates σ²_train from measured per-seed differences (pooled over methods, each method's
sample variance about its own mean) minus the evaluation part of the design they were measured with.
:func:`seeds_needed` and :func:`minimum_detectable_effect` use the paired t-test's exact power (noncentral t,
two-sided, α = 0.05): the test the results page reports.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

ALPHA = 0.05
POWER = 0.8


@dataclasses.dataclass(frozen=True)
class MeasuredRegime:
    """Final validation accuracies of one regime's paired runs: method -> one value per seed (``grpo`` included),
    measured with ``prompts`` held-out prompts × ``samples`` samples each."""

    name: str
    prompts: int
    samples: int
    final_acc: Mapping[str, Sequence[float]]


@dataclasses.dataclass(frozen=True)
class VarianceModel:
    """Var(final acc − GRPO's, per seed) = σ²_train + 2·p(1−p)/(P·S)."""

    train_var: float
    accuracy: float
    #: Degrees of freedom of the pooled estimate (sum over methods of seeds − 1).
    dof: int

    def eval_var(self, prompts: int, samples: int) -> float:
        return 2 * self.accuracy * (1 - self.accuracy) / (prompts * samples)

    def diff_sd(self, prompts: int, samples: int) -> float:
        return math.sqrt(self.train_var + self.eval_var(prompts, samples))


def paired_differences(final_acc: Mapping[str, Sequence[float]], baseline: str = "grpo") -> dict[str, list[float]]:
    """Method -> per-seed ``value − baseline's value of the same seed``, for every method but the baseline."""
    base = final_acc[baseline]
    return {
        method: [value - base[seed] for seed, value in enumerate(values)]
        for method, values in final_acc.items()
        if method != baseline
    }


def fit_variance(regimes: Sequence[MeasuredRegime], exclude: Sequence[str] = ()) -> VarianceModel:
    """σ²_train pooled over every (regime, method) not in ``exclude``: the pooled sample variance of the paired
    differences, less each regime's evaluation part (floored at 0); p is the mean accuracy of all the runs used."""
    squares, dof, eval_var, accuracies = 0.0, 0, 0.0, []
    for regime in regimes:
        for method, diffs in paired_differences(regime.final_acc).items():
            if method in exclude or len(diffs) < 2:
                continue
            mean = sum(diffs) / len(diffs)
            squares += sum((d - mean) ** 2 for d in diffs)
            dof += len(diffs) - 1
            p = (sum(regime.final_acc[method]) + sum(regime.final_acc["grpo"])) / (2 * len(diffs))
            eval_var += (len(diffs) - 1) * 2 * p * (1 - p) / (regime.prompts * regime.samples)
            accuracies += [*regime.final_acc[method], *regime.final_acc["grpo"]]
    if dof == 0:
        raise ValueError("fit_variance needs at least one method with two or more paired seeds.")
    train_var = max(squares / dof - eval_var / dof, 0.0)
    return VarianceModel(train_var=train_var, accuracy=sum(accuracies) / len(accuracies), dof=dof)


def paired_t_power(effect: float, sd: float, seeds: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t-test with ``seeds`` pairs to detect a true mean difference ``effect`` when the
    per-seed differences are normal with standard deviation ``sd``.

    With ν = seeds − 1, δ = effect·√seeds / sd and c the test's critical value, t = (Z + δ) / √(V/ν) for Z standard
    normal and V ~ χ²_ν, so power = E_V[Φ(δ − c·√(V/ν)) + Φ(−δ − c·√(V/ν))], integrated over V (scipy's noncentral t
    returns nan for large δ)."""
    from scipy.integrate import quad
    from scipy.stats import chi2, norm
    from scipy.stats import t as student_t

    if seeds < 2:
        return 0.0
    dof = seeds - 1
    critical = student_t.ppf(1 - alpha / 2, dof)
    shift = effect * math.sqrt(seeds) / sd

    def integrand(v: float) -> float:
        scale = critical * math.sqrt(v / dof)
        return (norm.cdf(shift - scale) + norm.cdf(-shift - scale)) * chi2.pdf(v, dof)

    return float(min(quad(integrand, 0, math.inf, limit=200)[0], 1.0))


def seeds_needed(effect: float, sd: float, power: float = POWER, alpha: float = ALPHA, limit: int = 10_000) -> int:
    """The fewest paired seeds whose t-test reaches ``power`` for ``effect``."""
    for seeds in range(2, limit + 1):
        if paired_t_power(effect, sd, seeds, alpha) >= power:
            return seeds
    raise ValueError(f"more than {limit} seeds needed for an effect of {effect} at sd {sd}.")


def minimum_detectable_effect(sd: float, seeds: int, power: float = POWER, alpha: float = ALPHA) -> float:
    """The smallest true difference the paired t-test with ``seeds`` pairs detects with ``power``."""
    from scipy.optimize import brentq

    if seeds < 2:
        return math.inf
    return float(brentq(lambda effect: paired_t_power(effect, sd, seeds, alpha) - power, 1e-9, 20 * sd))


@dataclasses.dataclass(frozen=True)
class Design:
    """One experiment design: paired seeds × held-out prompts × samples per prompt at each validation."""

    seeds: int
    prompts: int
    samples: int

    def mde(self, model: VarianceModel) -> float:
        return minimum_detectable_effect(model.diff_sd(self.prompts, self.samples), self.seeds)


def required_designs(
    model: VarianceModel, effect: float, prompt_choices: Sequence[int], sample_choices: Sequence[int]
) -> list[Design]:
    """For each (prompts, samples), the seeds the paired t-test needs to detect ``effect`` with power 0.8."""
    return [
        Design(seeds_needed(effect, model.diff_sd(prompts, samples)), prompts, samples)
        for prompts in prompt_choices
        for samples in sample_choices
    ]


#: The final validation accuracies of the results page's runs (commit 58aa441; three seeds a method, 40 steps, the
#: paired GRPO run of each seed): the hard regime on 103 held-out prompts × 8 samples, the default on 64 × 8.
RESULTS_58AA441 = (
    MeasuredRegime(
        "hard",
        prompts=103,
        samples=8,
        final_acc={
            "grpo": (0.062, 0.108, 0.114),
            "cpo:seq_kl": (0.056, 0.089, 0.074),
            "cpo:seq_kl@teacher=initial": (0.072, 0.081, 0.093),
            "cpo:rlsd": (0.073, 0.086, 0.076),
            "cpo:opsd": (0.070, 0.074, 0.075),
            "cpo:opsd_token": (0.064, 0.090, 0.080),
            "cpo:sdpo": (0.047, 0.033, 0.052),
        },
    ),
    MeasuredRegime(
        "default",
        prompts=64,
        samples=8,
        final_acc={
            "grpo": (0.209, 0.133, 0.158),
            "cpo:seq_kl": (0.176, 0.146, 0.154),
            "cpo:seq_kl@teacher=initial": (0.154, 0.168, 0.137),
            "cpo:rlsd": (0.207, 0.176, 0.137),
            "cpo:opsd": (0.127, 0.137, 0.088),
            "cpo:opsd_token": (0.125, 0.123, 0.094),
            "cpo:sdpo": (0.041, 0.088, 0.070),
        },
    ),
)
