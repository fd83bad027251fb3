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
"""End to end on CPU: the CPO recipe (``python -m treetune_recipe.cpo.main_cpo platform=cpu``) with real Ray and the
real verl 0.7.1 trainer on the tiny assets, checked from each run's own outputs (exit status, logged metrics,
checkpoints). Start-up errors of bad configs are checked through the same entry point.
"""

import math
import subprocess
import sys

import pandas as pd
import pytest
from safetensors.torch import load_file

from treetune_recipe.cpo import ENTRY_MODULE
from treetune_recipe.cpo.cpu_run import launch_cpo_on_cpu
from treetune_scripts.make_tiny_assets import build_tiny_assets
from treetune_verl.cpu_backend.tiny_run import METRICS_FILE, read_metrics, tiny_run_overrides

RUN_TIMEOUT_S = 480
# Metrics the trainer logs on the driver, and the ones the CPO loss returns from the workers.
DRIVER_METRICS = (
    "cpo/gw_minus_old_absmean",
    "cpo/log_ratio_mean/wrong",
    "cpo/mi_mean/wrong",
    "cpo/hint_prompt_len_mean",
    "cpo/group_all_wrong_frac",
)
LOSS_METRICS = ("actor/cpo/adv_delta_absmean", "actor/cpo/adv_delta_absmean/wrong", "actor/cpo/changed_token_frac")


@pytest.fixture(scope="module")
def assets_dir():
    return build_tiny_assets()


def run_cpo(assets_dir, run_dir, *, steps, extra=(), timeout_s=RUN_TIMEOUT_S):
    """Train with the CPO recipe on the CPU profile; returns (run, metrics by step). Asserts a clean exit."""
    run = launch_cpo_on_cpu(
        ["actor_rollout_ref.rollout.n=4", *extra],
        run_dir / "train.log",
        assets_dir=assets_dir,
        run_dir=run_dir,
        total_training_steps=steps,
        experiment_name="e2e_cpo",
        timeout_s=timeout_s,
    )
    log_tail = "\n".join(run.log_path.read_text().splitlines()[-60:])
    assert not run.timed_out, f"run exceeded {timeout_s} s:\n{log_tail}"
    assert run.returncode == 0, log_tail
    return run, read_metrics(run_dir / METRICS_FILE)


@pytest.mark.e2e
@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_cpo_two_steps_shape_advantages_with_the_hint_prompt(assets_dir, tmp_path):
    steps = 2
    run, metrics = run_cpo(
        assets_dir,
        tmp_path,
        steps=steps,
        extra=[
            "actor_rollout_ref.actor.optim.lr=1e-2",  # a visible weight change after two steps
            f"trainer.save_freq={steps}",
            "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]",
            # About half the responses count as correct (the tiny model never answers right), so the steps have
            # correct responses, whose hinted log-probs seq_kl (alpha+ = 0) never reads.
            "reward.custom_reward_function.name=compute_score_half_correct",
        ],
    )
    assert sorted(metrics) == list(range(1, steps + 1))
    for step, values in metrics.items():
        for key in (*DRIVER_METRICS, *LOSS_METRICS, "timing_s/cpo_hint_batch", "actor/pg_loss", "actor/kl_loss"):
            assert key in values and math.isfinite(values[key]), (step, key)
        # The hint prompt really changes the response log-probs: gw_log_probs != old_log_probs on some tokens.
        assert values["cpo/gw_minus_old_absmean"] > 1e-3, step
        assert values["cpo/hint_missing_frac"] == 0 and values["cpo/hint_truncated_frac"] == 0
        # cpo.hint.rescore=needed (the default): seq_kl with alpha+ = 0 scores the wrong responses only.
        assert values["cpo/hint_rows_frac"] == pytest.approx(1 - values["cpo/success_frac"]), step
        # seq_kl with neg_alpha=1 moves the advantages of wrong responses.
        assert 0 < values["cpo/success_frac"] < 1, step
        assert values["cpo/hint_rows_frac"] < 1, step
        # Those rows' hint prompts are longer than their plain prompts: more tokens than their share of the batch.
        assert values["cpo/hint_rows_frac"] < values["cpo/hint_token_ratio"], step
        assert values["actor/cpo/adv_delta_absmean/wrong"] > 0, step
        assert values["actor/cpo/changed_token_frac"] > 0, step
        assert values["training/rollout_probs_diff_max"] < 0.1
    assert metrics[steps]["actor/kl_loss"] > 0  # reference model on, and the policy moved away from it

    initial = load_file(assets_dir / "model" / "model.safetensors")
    trained = load_file(
        tmp_path / "checkpoints" / f"global_step_{steps}" / "actor" / "huggingface" / "model.safetensors"
    )
    assert sorted(trained) == sorted(initial)
    max_change = max((trained[name].float() - initial[name].float()).abs().max().item() for name in initial)
    assert math.isfinite(max_change) and max_change > 1e-3


@pytest.mark.e2e
@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_grpo_estimator_with_the_cpo_config_is_plain_grpo(assets_dir, tmp_path):
    run, metrics = run_cpo(assets_dir, tmp_path, steps=1, extra=["algorithm.adv_estimator=grpo"])
    values = metrics[1]
    assert "actor/pg_loss" in values and "actor/kl_loss" in values
    assert not [key for key in values if "cpo/" in key]


def start_cpo(assets_dir, tmp_path, *overrides, timeout_s=180):
    """Run the entry point expecting it to stop at start-up; returns its combined output."""
    command = [
        sys.executable,
        "-m",
        ENTRY_MODULE,
        "platform=cpu",
        *tiny_run_overrides(assets_dir, tmp_path, total_training_steps=1),
        f"hydra.run.dir={tmp_path / 'hydra'}",
        *overrides,
    ]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=tmp_path)
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "ray.init" not in output and "Started a local Ray instance" not in output  # stopped before Ray
    return output


@pytest.mark.e2e
def test_unknown_wrap_method_stops_at_start_up_listing_valid_names(assets_dir, tmp_path):
    output = start_cpo(assets_dir, tmp_path, "cpo.wrap_method=seq_kll")
    assert "Unknown cpo.wrap_method 'seq_kll'" in output
    assert "Valid values:" in output and "mi_clamp_unify_difficulty" in output and "negonly_tok_kl" in output


@pytest.mark.e2e
def test_train_data_without_solutions_stops_at_start_up(assets_dir, tmp_path):
    frame = pd.read_parquet(assets_dir / "data" / "train.parquet")
    frame["extra_info"] = [{k: v for k, v in info.items() if k != "solution"} for info in frame["extra_info"]]
    no_solution = tmp_path / "train_without_solution.parquet"
    frame.to_parquet(no_solution)
    output = start_cpo(assets_dir, tmp_path, f"data.train_files={no_solution}")
    assert "data.train_files" in output and "extra_info.solution" in output and "row 0" in output


@pytest.mark.e2e
def test_disabled_entropy_stops_at_start_up(assets_dir, tmp_path):
    output = start_cpo(assets_dir, tmp_path, "actor_rollout_ref.actor.calculate_entropy=false")
    assert "actor_rollout_ref.actor.calculate_entropy=true" in output
