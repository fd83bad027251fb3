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
"""End to end on CPU: the run-health guard (``treetune.rollout_health``) on GRPO runs of the recipe's entry point.

The context-sensitive tiny model (``CONTEXT_SENSITIVE``: its log-probs depend on the context by nats; on the default
tiny model, close to uniform, a broken forward changes little) is trained with GRPO while the trainer's forward
differs from the rollout's: ``actor_rollout_ref.model.override_config.rms_norm_eps=100.0`` flattens the normalised
hidden states of the trainer's model only (the ``hf`` rollout server loads the checkpoint's own config; the
activation swap silu -> gelu moved the KL by only 0.015 nats, too little to stop a run), a stand-in for any trainer
forward that disagrees with the rollout (on verl 0.7.1 the upstream attention-mask bug #6278 was one; verl 0.9.1 has
it fixed, so that bug cannot serve on both releases). The guard must stop the run at step 1, before any update, with
its message in the log and a non-zero exit. The run prints the measured mismatch.

The healthy side is asserted on runs other tests make anyway: the CPO run of ``test_cpo_cpu_e2e_on_cpu.py`` (guard
metrics, no guard line in the log) and the 40-step GRPO run of ``test_grpo_learns_on_cpu.py`` (``rollout_corr/kl``);
invalid thresholds stopping at start-up are checked in ``test_cpo_cpu_e2e_on_cpu.py`` with the other start-up errors.
"""

import re

import pytest

from treetune_recipe.cpo.trainer.cpu_run import launch_cpo_on_cpu
from treetune_tests.support.runs import ended_run_log, log_tail
from treetune_verl.metrics_history import read_metrics
from treetune_verl.rollout_health import KL_METRIC, PROBS_DIFF_METRIC, RolloutHealthConfig
from treetune_verl.tiny_assets import CONTEXT_SENSITIVE, build_tiny_assets
from treetune_verl.tiny_run import METRICS_FILE

RUN_TIMEOUT_S = 480
STEPS = 3
BROKEN_TRAINER_FORWARD = "+actor_rollout_ref.model.override_config.rms_norm_eps=100.0"  # the checkpoint's is 1e-6
GRPO = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2"]
STOP_LINE = re.compile(
    r"rollout health STOP at step (\d+): .*?rollout_corr/kl=(\S+) .*?training/rollout_probs_diff_mean=(\S+) "
)


@pytest.fixture(scope="module")
def assets_dir():
    return build_tiny_assets(config=CONTEXT_SENSITIVE)


def run_grpo(assets_dir, run_dir, *extra):
    run = launch_cpo_on_cpu(
        [*GRPO, *extra],
        run_dir / "train.log",
        assets_dir=assets_dir,
        run_dir=run_dir,
        total_training_steps=STEPS,
        experiment_name="e2e_rollout_health",
        timeout_s=RUN_TIMEOUT_S,
    )
    return run, ended_run_log(run)


@pytest.mark.e2e
@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_broken_log_probs_stop_the_run_at_step_one_before_any_update(assets_dir, tmp_path):
    run, log = run_grpo(assets_dir, tmp_path, BROKEN_TRAINER_FORWARD)
    tail = log_tail(run)
    assert run.returncode != 0, tail
    assert "RolloutMismatchError" in log, tail
    match = STOP_LINE.search(log)
    assert match, tail
    step, kl, probs_diff = int(match.group(1)), float(match.group(2)), float(match.group(3))
    print(f"\n[broken run] step {step}: {KL_METRIC}={kl} {PROBS_DIFF_METRIC}={probs_diff}")
    defaults = RolloutHealthConfig()
    assert step == 1 and kl > defaults.stop_kl
    for hint in ("#6278", "weight sync", "chat template", "dtype", "temperature", "treetune.rollout_health.enabled"):
        assert hint in log, hint
    # Stopped before step 1 was logged: no step's metrics, no checkpoint.
    metrics_file = tmp_path / METRICS_FILE
    assert not metrics_file.exists() or read_metrics(metrics_file) == {}
    assert not list((tmp_path / "checkpoints").glob("global_step_*"))
