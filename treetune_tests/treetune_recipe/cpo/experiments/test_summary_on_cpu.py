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
"""The experiment summary's arithmetic (``treetune_recipe/cpo/experiments/summary.py``) on a hand-made
``results.csv``."""

import csv
import statistics

import pytest

from treetune_recipe.cpo.experiments import cpo_vs_grpo, summary


def _write_csv(path, rows):
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=cpo_vs_grpo.RESULT_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({column: row.get(column, "") for column in cpo_vs_grpo.RESULT_COLUMNS})


def test_summary_numbers_by_hand(tmp_path):
    rows = []
    # grpo: val 0.2 -> 0.4 (seed 0), 0.2 -> 0.2 (seed 1); cpo: 0.2 -> 0.6 (both seeds). Steps 0 and 2.
    for method, finals, times in (("grpo", (0.4, 0.2), (2.0, 4.0)), ("cpo:seq_kl", (0.6, 0.6), (3.0, 3.0))):
        for seed, (final, time_s) in enumerate(zip(finals, times)):
            rows += [
                {"method": method, "seed": seed, "step": 0, "val_acc": 0.2},
                {"method": method, "seed": seed, "step": 1, "train_reward": -0.5, "step_time_s": 100.0},
                {"method": method, "seed": seed, "step": 2, "val_acc": final, "train_reward": 0, "step_time_s": time_s},
            ]
    # all-wrong shares of grpo at steps 1, 2: seed 0 0.5, 0.25; seed 1 0.75, 0.75; KL at step 2: 0.1, 0.3
    for row, (all_wrong, kl) in zip(rows[1:6:1], [(0.5, None), (0.25, 0.1), (None, None), (0.75, None), (0.75, 0.3)]):
        row.update({"all_wrong_frac": all_wrong, "kl": kl} if all_wrong is not None else {})
    _write_csv(tmp_path / "results.csv", rows)
    stats = summary.summarize(summary.read_results(tmp_path / "results.csv"))
    assert stats["threshold"] == pytest.approx(0.3)
    grpo, cpo = stats["methods"]["grpo"], stats["methods"]["cpo:seq_kl"]
    assert grpo["final"] == pytest.approx((0.3, statistics.stdev([0.4, 0.2])))
    assert grpo["auc"] == pytest.approx((0.25, statistics.stdev([0.3, 0.2])))  # (0.2+0.4)/2, (0.2+0.2)/2
    assert (grpo["steps_to_threshold"], grpo["reached"]) == (2, 1)
    assert grpo["step_time_s"] == pytest.approx(3.0)  # step 1 (warm-up) left out
    assert cpo["final"] == pytest.approx((0.6, 0.0)) and cpo["step_time_ratio"] == pytest.approx(1.0)
    assert grpo["first"] == pytest.approx((0.2, 0.0))
    assert grpo["all_wrong_first"] == pytest.approx((0.5 + 0.75) / 2)  # step 1 of each seed
    assert grpo["all_wrong_mean"] == pytest.approx((0.375 + 0.75) / 2)  # each seed's mean over its steps
    assert grpo["final_kl"] == pytest.approx((0.1, 0.3))
    assert cpo["all_wrong_first"] is None and cpo["final_kl"] is None  # not logged: "-" in the table
    # Paired by seed: cpo - grpo final = 0.2 (seed 0), 0.4 (seed 1): mean 0.3, sd √0.02, 95 % half-width
    # t(0.975, 1) · sd / √2 = 12.706 · 0.1 (the printed quantile, to its 5 digits).
    assert cpo["final_vs_grpo"] == pytest.approx((0.3, 12.706 * 0.1, 2), rel=1e-4)
    assert cpo["auc_vs_grpo"] == pytest.approx((0.15, 12.706 * 0.05, 2), rel=1e-4)  # AUCs 0.4 vs 0.3 and 0.4 vs 0.2
    assert grpo["final_vs_grpo"] == pytest.approx((0.0, 0.0, 2))
    # Drift: each seed's last logged value (step 2 for seed 0, step 1 for seed 1), mean ± sd.
    rows[2]["drift"], rows[4]["drift"] = 0.5, 0.25
    _write_csv(tmp_path / "results.csv", rows)
    stats = summary.summarize(summary.read_results(tmp_path / "results.csv"))
    assert stats["methods"]["grpo"]["last_drift"] == pytest.approx((0.375, statistics.stdev([0.5, 0.25])))
    table = summary.summary_table(stats)
    assert "| 0.625 / 0.562 | 0.3750 ± 0.1768 | 0.100-0.300 |" in table
    assert "| +0.3000 [-0.9706, +1.5706] (n=2) |" in table and "| baseline |" in table
    assert stats["methods"]["cpo:seq_kl"]["context_share"] is None  # not logged: "-"
    # Context token share (SDPO's masked rows): per seed the mean over its steps, then mean ± sd over seeds.
    for row, share in zip(rows[6:12], [None, 0.5, 0.7, None, 0.9, 0.9]):  # cpo's steps 0-2, seeds 0 and 1
        row["context_token_frac"] = share
    _write_csv(tmp_path / "results.csv", rows)
    stats = summary.summarize(summary.read_results(tmp_path / "results.csv"))
    assert stats["methods"]["cpo:seq_kl"]["context_share"] == pytest.approx((0.75, statistics.stdev([0.6, 0.9])))
    assert stats["methods"]["grpo"]["context_share"] is None
    assert "| 0.7500 ± 0.2121 |" in summary.summary_table(stats)


def test_rollout_agreement_is_the_largest_disagreement_over_every_step_of_every_seed(tmp_path):
    rows = [{"method": "grpo", "seed": seed, "step": 0, "val_acc": 0.1} for seed in (0, 1)]
    rows += [
        {"method": "grpo", "seed": 0, "step": 1, "rollout_kl": -0.004, "rollout_probs_diff": 0.002},
        {"method": "grpo", "seed": 1, "step": 1, "rollout_kl": 0.001, "rollout_probs_diff": 0.005},
        {"method": "grpo", "seed": 1, "step": 2, "rollout_kl": 0.003, "rollout_probs_diff": 0.001, "val_acc": 0.2},
        {"method": "cpo:seq_kl", "seed": 0, "step": 0, "val_acc": 0.1},
        {"method": "cpo:seq_kl", "seed": 0, "step": 2, "val_acc": 0.2},
    ]
    _write_csv(tmp_path / "results.csv", rows)
    stats = summary.summarize(summary.read_results(tmp_path / "results.csv"))
    # A negative k1 estimate counts by its size: -0.004 is the largest disagreement, not 0.003.
    assert stats["methods"]["grpo"]["rollout_agreement"] == pytest.approx((0.004, 0.005))
    assert stats["methods"]["cpo:seq_kl"]["rollout_agreement"] is None  # not logged: "-"
    assert "| 0.0040 / 0.0050 |" in summary.summary_table(stats)


@pytest.mark.parametrize(
    ("seeds", "published_t"),
    # Two-sided 95 % quantiles of Student's t from printed tables: df = 2, 4 and 12 (beyond the old hand table's 10).
    [(3, 4.303), (5, 2.776), (13, 2.179)],
)
def test_paired_interval_uses_the_student_t_quantile_of_its_seed_count(seeds, published_t):
    baseline = {seed: 0.1 for seed in range(seeds)}
    values = {seed: 0.1 + 0.01 * seed for seed in range(seeds)}
    mean, half_width, n = summary.paired_difference(values, baseline)
    diffs = [0.01 * seed for seed in range(seeds)]
    assert n == seeds and mean == pytest.approx(statistics.fmean(diffs))
    sem = statistics.stdev(diffs) / seeds**0.5
    assert half_width == pytest.approx(published_t * sem, rel=2e-4)
    assert half_width != pytest.approx(1.96 * sem, rel=2e-4)  # the normal quantile would be too narrow here


def _write_experiment(directory, runs):
    import json

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "experiment.json").write_text(json.dumps({"warm_start": "6828801826999ec1"}))
    for name, record in runs:
        (directory / "runs" / name).mkdir(parents=True)
        (directory / "runs" / name / "run.json").write_text(json.dumps({"wall_s": 1.0, **record}))


def test_provenance_names_the_runs_commits_and_the_warm_start(tmp_path):
    _write_experiment(tmp_path, [("grpo__seed0", {"commit": "0123456789abcdef-dirty"}), ("sdpo__seed0", {})])
    line = summary.provenance([tmp_path], "hard", {"weights_sha256": "2445a529638f5531"})
    assert line == (
        "hard regime, 2 runs at commit 0123456789-dirty, unknown; warm start 6828801826999ec1 "
        "(weights sha256 2445a529638f…)"
    )


def test_provenance_of_several_folders_counts_their_runs_once_each(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    _write_experiment(first, [("grpo__seed0", {"commit": "0123456789abcdef"})])
    _write_experiment(second, [("sdpo__seed0", {"commit": "0123456789abcdef"}), ("sdpo__seed1", {"commit": "fe"})])
    line = summary.provenance([first, second], "long", {"weights_sha256": "2445a529638f5531"})
    assert line == (
        "long regime, 3 runs in 2 folders at commit 0123456789, fe; warm start 6828801826999ec1 "
        "(weights sha256 2445a529638f…)"
    )
