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
"""The demo's command line: overrides pass-through, the preflight stop (no training), the resumed demo's history and the
prompt set (its console lines: ``treetune_tests/treetune_recipe/cpo/experiments/test_console_on_cpu.py``; its step
times: ``treetune_tests/treetune_verl/test_metrics_history_on_cpu.py``)."""

import json

import pytest
from verl_cpu.host import accelerator_available

from treetune_scripts import run_demo
from treetune_verl.metrics_history import step_times
from treetune_verl.tiny_assets import build_tiny_assets
from treetune_verl.tiny_run import TrainingRun


def test_extra_arguments_are_hydra_overrides():
    args = run_demo.parse_args(["--steps", "3", "trainer.total_training_steps=5", "data.train_batch_size=8"])
    assert args.steps == 3
    assert args.overrides == ["trainer.total_training_steps=5", "data.train_batch_size=8"]
    # The demo runs the CPO recipe by default; the CPU profile is added as an override.
    assert args.entry_module == "treetune_recipe.cpo.main_cpo" and args.config_name == "cpo_trainer"
    assert "platform=cpu" in run_demo.DEMO_OVERRIDES


@pytest.mark.skipif(accelerator_available(), reason="FSDP1 is only refused without an accelerator")
def test_bad_override_stops_at_the_preflight_before_any_training(tmp_path, capsys, monkeypatch):
    def no_training(*args, **kwargs):
        raise AssertionError("training must not start")

    monkeypatch.setattr(run_demo, "launch_training", no_training)
    # The preflight needs a real model folder and data; the tiny assets stand in for the (minutes to build) warm start.
    monkeypatch.setattr(run_demo, "demo_start", build_tiny_assets)
    code = run_demo.main(["--output-dir", str(tmp_path), "actor_rollout_ref.actor.fsdp_config.strategy=fsdp"])
    assert code == 2
    assert "set actor_rollout_ref.actor.fsdp_config.strategy=fsdp2" in capsys.readouterr().err


def test_row3_a_resumed_demo_keeps_the_earlier_metrics_and_plots_the_whole_history(tmp_path, capsys, monkeypatch):
    metrics_path = tmp_path / "metrics.jsonl"
    earlier = [
        {"step": step, "data": {"timing_s/step": 1.0, "critic/score/mean": -1.0, "training/global_step": step}}
        for step in (1, 2)
    ]
    metrics_path.write_text("".join(json.dumps(record) + "\n" for record in earlier))
    (tmp_path / "train.log").write_text("step:2 - earlier run\n")
    seen = {}

    def resumed_training(overrides, log_path, **kwargs):  # stands in for a run that resumed at step 3
        seen["append_log"] = kwargs.get("append_log")
        with open(metrics_path, "a") as handle:
            record = {"step": 3, "data": {"timing_s/step": 1.0, "critic/score/mean": 0.0, "training/global_step": 3}}
            handle.write(json.dumps(record) + "\n")
        return TrainingRun(returncode=0, wall_s=1.0, peak_rss_bytes=0, timed_out=False, log_path=log_path)

    monkeypatch.setattr(run_demo, "launch_training", resumed_training)
    monkeypatch.setattr(run_demo, "demo_start", build_tiny_assets)  # the warm start is not what this test is about
    assert run_demo.main(["--output-dir", str(tmp_path), "--steps", "3"]) == 0
    assert [step for step, _ in step_times(metrics_path)] == [1, 2, 3]
    assert seen["append_log"] is True  # the earlier run's log lines stay in train.log
    assert (tmp_path / "learning_curve.png").stat().st_size > 0


@pytest.mark.parametrize("prompts", [16, 0])
def test_the_demo_fits_a_fixed_prompt_set_unless_asked_for_the_whole_task(tmp_path, monkeypatch, prompts):
    import pandas as pd

    seen = {}

    def no_training(overrides, log_path, **kwargs):
        seen["overrides"] = overrides
        return TrainingRun(returncode=1, wall_s=0.0, peak_rss_bytes=0, timed_out=False, log_path=log_path)

    (tmp_path / "train.log").write_text("")
    monkeypatch.setattr(run_demo, "launch_training", no_training)
    monkeypatch.setattr(run_demo, "demo_start", build_tiny_assets)
    run_demo.main(["--output-dir", str(tmp_path), "--prompts", str(prompts)])
    files = {key: value for key, _, value in (o.partition("=") for o in seen["overrides"]) if key.startswith("data.")}
    if prompts:
        # the last value of each key wins in Hydra: the fixed set is both the training and the validation data
        assert files["data.train_files"] == files["data.val_files"] == str(tmp_path / "prompts.parquet")
        expected = pd.read_parquet(build_tiny_assets() / "data" / "train.parquet").head(prompts)
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "prompts.parquet"), expected)
    else:
        assert files["data.train_files"] == str(build_tiny_assets() / "data" / "train.parquet")
        assert not (tmp_path / "prompts.parquet").exists()
