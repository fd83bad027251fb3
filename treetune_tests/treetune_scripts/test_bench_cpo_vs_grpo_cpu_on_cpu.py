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
"""The GRPO / CPO-all / CPO-needed step benchmark: averaging, the nested table, the target line, failed runs, and the
experiment-shape runs with their peak memory."""

import re
from pathlib import Path

import pytest

from treetune_scripts import bench_cpo_vs_grpo_cpu as bench
from treetune_verl.tiny_run import TrainingRun

GRPO = {"timing_s/step": 4.0, "timing_s/gen": 1.0, "timing_s/old_log_prob": 0.8, "timing_s/update_actor": 1.2}
CPO_ALL = {
    **GRPO,
    "timing_s/step": 5.2,
    "timing_s/update_actor": 2.4,
    "timing_s/cpo_hint_batch": 0.2,
    "timing_s/cpo_gw_log_prob": 0.9,
    "cpo/hint_rows_frac": 1.0,
    "cpo/hint_token_ratio": 2.0,
}
CPO_NEEDED = {**CPO_ALL, "timing_s/cpo_gw_log_prob": 0.4, "cpo/hint_rows_frac": 0.5, "cpo/hint_token_ratio": 1.0}


def test_summary_drops_warmup_counts_a_skipped_part_as_zero_and_averages_the_hint_fractions():
    metrics = {
        1: {"timing_s/step": 100.0, "timing_s/cpo_gw_log_prob": 50.0, "cpo/hint_rows_frac": 1.0},
        2: {"timing_s/step": 4.0, "timing_s/cpo_gw_log_prob": 1.0, "cpo/hint_rows_frac": 0.5},
        3: {"timing_s/step": 2.0, "cpo/hint_rows_frac": 0.0, "timing_s/agent_loop/generate_sequences/max": 9.0},
    }
    means = bench.summarize_steps(metrics, warmup=1)
    assert means == {"timing_s/step": 3.0, "timing_s/cpo_gw_log_prob": 0.5, "cpo/hint_rows_frac": 0.25}
    metrics[2]["cpo/hint_token_ratio"], metrics[3]["cpo/hint_token_ratio"] = 1.5, 0.0
    assert bench.summarize_steps(metrics, warmup=1)["cpo/hint_token_ratio"] == 0.75
    with pytest.raises(ValueError, match="No step after the 3 warm-up"):
        bench.summarize_steps(metrics, warmup=3)


def test_a_stalled_step_does_not_move_the_step_times():
    steps = {step: {"timing_s/old_log_prob": 0.2, "cpo/hint_rows_frac": 0.5} for step in range(1, 6)}
    steps[3] = {"timing_s/old_log_prob": 0.9, "cpo/hint_rows_frac": 1.0}
    summary = bench.summarize_steps(steps, warmup=0)
    assert summary["timing_s/old_log_prob"] == 0.2
    assert summary["cpo/hint_rows_frac"] == pytest.approx(0.6)  # a workload share: every step counts


def test_table_nests_the_hint_parts_under_update_actor_with_the_remainder():
    table = bench.format_table({"grpo": GRPO, "cpo_all": CPO_ALL, "cpo_needed": CPO_NEEDED}).splitlines()
    labels = [line[:40].rstrip() for line in table[1:-1]]
    assert labels == [
        "timing_s/step",
        "  timing_s/gen",
        "  timing_s/old_log_prob",
        "  timing_s/update_actor",
        "    timing_s/cpo_gw_log_prob",
        "    timing_s/cpo_hint_batch",
        "    rest of update_actor",
    ]
    rest = table[labels.index("    rest of update_actor") + 1].split()
    assert rest[3:6] == ["1.200", "1.300", "1.800"]  # update_actor minus the two hint parts
    step = table[1].split()
    assert step[1:] == ["4.000", "5.200", "5.200", "1.30x", "1.30x"]


def test_summary_reports_ratio_fractions_and_the_targets():
    summary = bench.format_summary({"grpo": GRPO, "cpo_all": CPO_ALL, "cpo_needed": CPO_NEEDED})
    assert re.search(r"cpo_all\s+5\.200\s+1\.30x\s+-\s+-\s+1\.12\s+1\.00\s+2\.00", summary)
    assert re.search(r"cpo_needed\s+5\.200\s+1\.30x\s+-\s+-\s+0\.50\s+0\.50\s+1\.00", summary)
    assert re.search(r"grpo\s+4\.000\s+1\.00x\s+-\s+-\s+-\s+-\s+-", summary)
    lines = summary.splitlines()
    assert lines[-3].endswith("gw_log_prob/old_log_prob 0.50 <= hint_rows_frac 0.50 + 0.1: met")
    assert lines[-2].endswith("gw_log_prob/old_log_prob 0.50 <= hint_token_ratio 1.00 + 0.1: met")
    assert lines[-1].endswith("cpo_gw_log_prob needed/all 0.44 <= hint_rows_frac 0.50 + 0.1: met")
    slow = {**CPO_NEEDED, "timing_s/cpo_gw_log_prob": 1.2}
    lines = bench.format_summary({"cpo_all": CPO_ALL, "cpo_needed": slow}).splitlines()
    assert lines[-3].endswith("1.50 <= hint_rows_frac 0.50 + 0.1: NOT met")
    assert lines[-2].endswith("1.50 <= hint_token_ratio 1.00 + 0.1: NOT met")
    assert lines[-1].endswith("needed/all 1.33 <= hint_rows_frac 0.50 + 0.1: NOT met")
    # Without a cpo_all run there is nothing to compare the selective pass with.
    assert "needed/all" not in bench.format_summary({"cpo_needed": CPO_NEEDED})


def test_a_failed_run_keeps_its_folder_and_names_an_existing_log(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bench, "build_tiny_assets", lambda: tmp_path / "assets")
    monkeypatch.setattr(bench.tempfile, "mkdtemp", lambda prefix: str(tmp_path / "work"))
    launched = []

    def failing_launch(overrides, log_path, **kwargs):
        launched.append(overrides)
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        Path(log_path).write_text("Traceback: boom\n")
        return TrainingRun(returncode=1, wall_s=1.0, peak_rss_bytes=0, timed_out=False, log_path=Path(log_path))

    monkeypatch.setattr(bench, "launch_cpo_on_cpu", failing_launch)
    with pytest.raises(SystemExit, match=r"grpo run failed \(exit 1\); its folder is kept, log: (\S+)") as info:
        bench.main(["--steps", "1", "trainer.seed=3"])
    log_path = Path(re.search(r"log: (\S+)", str(info.value)).group(1))
    assert log_path.read_text() == "Traceback: boom\n"
    assert launched[0][-1] == "trainer.seed=3" and "algorithm.adv_estimator=grpo" in launched[0]
    assert "reward.custom_reward_function.name=compute_score_half_correct" in launched[0]


def test_runs_selects_the_teacher_runs_in_order_and_refuses_an_unknown_one(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bench, "build_tiny_assets", lambda: tmp_path / "assets")
    launched = []

    def fake_run(name, steps, work_dir, overrides, assets_dir):
        launched.append(overrides)
        return {step: CPO_NEEDED for step in range(1, steps + 1)}, 2**30

    monkeypatch.setattr(bench, "run_once", fake_run)
    bench.main(["--runs", "cpo_initial,cpo_refreshed", "--work-dir", str(tmp_path / "work")])
    assert [run[-1] for run in launched] == ["cpo.teacher=initial", "cpo.teacher_refresh_steps=2"]
    assert "cpo.teacher=refreshed" in launched[1]
    assert "cpo_refreshed/cpo_initial" in capsys.readouterr().out

    launched.clear()
    with pytest.raises(SystemExit):
        bench.main(["--runs", "grpo,cpo_fixed"])
    assert launched == [] and "unknown ['cpo_fixed']" in capsys.readouterr().err


def test_summary_gives_each_runs_step_time_and_peak_memory_relative_to_the_first_run():
    summary = bench.format_summary(
        {"grpo": {**GRPO, bench.PEAK_RSS_KEY: 4.0}, "cpo:sdpo": {**CPO_ALL, bench.PEAK_RSS_KEY: 5.0}}
    )
    assert re.search(r"grpo\s+4\.000\s+1\.00x\s+4\.00\s+1\.00x", summary)
    assert re.search(r"cpo:sdpo\s+5\.200\s+1\.30x\s+5\.00\s+1\.25x\s+1\.12", summary)
    # A run without a measured peak (an older metrics file) shows dashes, not a ratio of nothing.
    assert re.search(r"cpo:sdpo\s+5\.200\s+1\.30x\s+-\s+-", bench.format_summary({"grpo": GRPO, "cpo:sdpo": CPO_ALL}))


def test_experiment_shape_runs_the_regimes_methods_on_its_warm_start_and_prompts_without_validation(
    monkeypatch, tmp_path, capsys
):
    from treetune_recipe.cpo.experiments import cpo_vs_grpo

    warm = tmp_path / "warm"
    data = ["data.train_files=/hard/train.parquet", "data.val_files=/hard/val.parquet"]
    monkeypatch.setattr(
        cpo_vs_grpo,
        "prepare_regime",
        lambda name: cpo_vs_grpo.RegimeInputs(warm, {}, data, "", "hard", {}),
    )
    launched = {}

    def fake_run(name, steps, work_dir, overrides, assets_dir):
        launched[name] = (steps, overrides, assets_dir)
        return {step: GRPO for step in range(1, steps + 1)}, (3 if name == "grpo" else 6) * 2**30

    monkeypatch.setattr(bench, "run_once", fake_run)
    bench.main(["--experiment", "hard", "--steps", "2", "--work-dir", str(tmp_path / "work"), "trainer.seed=7"])
    assert list(launched) == cpo_vs_grpo.parse_methods(cpo_vs_grpo.DEFAULT_METHODS)
    for method, (steps, overrides, assets_dir) in launched.items():
        assert steps == 3 and assets_dir == warm
        assert overrides[-1] == "trainer.seed=7"  # the user's overrides win
        assert set(data) <= set(overrides) and "trainer.val_before_train=false" in overrides
        assert "trainer.test_freq=-1" in overrides
        assert not any("compute_score_half_correct" in o for o in overrides)  # the task's own reward
        assert overrides[: -len(data) - 2] == cpo_vs_grpo.run_overrides(
            tmp_path, method, 0, cpo_vs_grpo.Schedule(3, -1, ()), False
        )
    assert "cpo.method=sdpo" in launched["cpo:sdpo"][1]
    out = capsys.readouterr().out
    assert "at the hard experiment's shape, 2 steps after 1 warm-up" in out
    header = next(line for line in out.splitlines() if line.startswith("seconds per step"))
    assert " cpo:seq_kl/grpo " in header and " cpo:seq_kl@teacher=initial/grpo " in header  # ratio columns apart
    assert re.search(r"cpo:sdpo\s+4\.000\s+1\.00x\s+6\.00\s+2\.00x", out)

    with pytest.raises(SystemExit):
        bench.main(["--experiment", "hard", "--runs", "grpo,cpo:nonesuch"])
    assert "unknown method 'cpo:nonesuch'" in capsys.readouterr().err
