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
"""The power analysis: the paired t-test's power against a simulation of the test itself, the inverse functions
against it, and the variance fit against data drawn from a known model."""

import math

import numpy as np
import pytest
from scipy.stats import ttest_1samp

from treetune_recipe.cpo.experiments.power import (
    RESULTS_58AA441,
    MeasuredRegime,
    VarianceModel,
    fit_variance,
    minimum_detectable_effect,
    paired_differences,
    paired_t_power,
    seeds_needed,
)


def _simulated_power(effect, sd, seeds, trials=20_000, seed=0):
    """The share of simulated experiments (normal per-seed differences) whose two-sided paired t-test rejects."""
    rng = np.random.default_rng(seed)
    diffs = rng.normal(effect, sd, size=(trials, seeds))
    return float((ttest_1samp(diffs, 0.0, axis=1).pvalue < 0.05).mean())


@pytest.mark.parametrize("effect, sd, seeds", [(0.02, 0.03, 5), (0.05, 0.03, 3), (0.02, 0.025, 12), (0.0, 0.03, 6)])
def test_power_matches_a_simulation_of_the_paired_t_test(effect, sd, seeds):
    simulated = _simulated_power(effect, sd, seeds)
    # 20,000 trials: binomial standard error <= 0.0036
    assert paired_t_power(effect, sd, seeds) == pytest.approx(simulated, abs=0.012)


def test_a_wrong_degrees_of_freedom_fails_the_same_comparison():
    """Control: the power of a test with one pair more is not the simulated power of 4 pairs."""
    simulated = _simulated_power(0.03, 0.03, 4)
    assert paired_t_power(0.03, 0.03, 5) != pytest.approx(simulated, abs=0.012)


def test_seeds_needed_is_the_fewest_that_reach_the_power():
    seeds = seeds_needed(0.02, 0.03)
    assert paired_t_power(0.02, 0.03, seeds) >= 0.8 > paired_t_power(0.02, 0.03, seeds - 1)
    # the large-sample formula ((z_0.975 + z_0.8) sd / effect)^2 = 17.7 is a lower bound at small n
    assert seeds >= math.ceil((1.959964 + 0.841621) ** 2 * (0.03 / 0.02) ** 2)


def test_the_minimum_detectable_effect_has_the_stated_power():
    effect = minimum_detectable_effect(0.03, 6)
    assert paired_t_power(effect, 0.03, 6) == pytest.approx(0.8, abs=1e-6)
    assert minimum_detectable_effect(0.03, 12) < effect  # more seeds, smaller effects
    assert minimum_detectable_effect(0.03, 1) == math.inf


def test_paired_differences_subtract_the_baseline_of_the_same_seed():
    diffs = paired_differences({"grpo": (0.1, 0.2), "m": (0.15, 0.1)})
    assert diffs == {"m": [pytest.approx(0.05), pytest.approx(-0.1)]}


def test_fit_variance_recovers_the_training_variance_of_simulated_runs():
    """Runs drawn from the model: a method's final accuracy = p + seed effect + Bernoulli mean of P x S samples."""
    rng = np.random.default_rng(1)
    train_sd, p, prompts, samples = 0.02, 0.15, 64, 8
    regimes = []
    for k in range(60):
        final = {}
        for method in ("grpo", "a", "b"):
            accuracy = np.clip(p + rng.normal(0, train_sd / math.sqrt(2), size=5), 0, 1)
            final[method] = tuple(rng.binomial(prompts * samples, accuracy) / (prompts * samples))
        regimes.append(MeasuredRegime(f"r{k}", prompts, samples, final))
    model = fit_variance(regimes)
    # 480 degrees of freedom: the pooled variance is within about 10 % (the methods share GRPO's value per seed)
    assert math.sqrt(model.train_var) == pytest.approx(train_sd, rel=0.15)
    # control: without subtracting the evaluation part, the estimate is the whole variance, measurably larger
    whole = math.sqrt(model.train_var + model.eval_var(prompts, samples))
    assert whole > train_sd * 1.15


def test_excluding_a_method_drops_its_differences():
    spread = MeasuredRegime("x", 1000, 100, {"grpo": (0.1, 0.1, 0.1), "a": (0.1, 0.2, 0.0), "b": (0.1, 0.1, 0.1)})
    assert fit_variance([spread]).train_var > 0
    assert fit_variance([spread], exclude=["a"]).train_var == 0.0


def test_the_page_runs_give_a_training_spread_larger_than_their_evaluation_noise():
    """The reason more seeds, not more prompts, are what a paired comparison needs here."""
    model = fit_variance(RESULTS_58AA441, exclude=["cpo:sdpo"])
    assert model.dof == 20
    assert model.train_var > 2 * model.eval_var(103, 8)
    assert isinstance(model, VarianceModel)
