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
"""Upstream ``verl.trainer.main_ppo`` with too few Ray CPUs stops with verl-cpu's preflight message instead of hanging.

Without verl-cpu's check (patch ``main_ppo_preflight``: ``verl_cpu.preflight`` first in upstream ``validate_config``),
verl waits forever for a placement group it can never get.
"""

import pytest

from treetune_scripts.make_tiny_assets import build_tiny_assets
from treetune_verl.tiny_run import launch_training, tiny_run_overrides

RUN_TIMEOUT_S = 240


@pytest.mark.e2e
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_too_few_ray_cpus_fail_fast_with_the_fix_in_the_message(tmp_path):
    overrides = tiny_run_overrides(build_tiny_assets(), tmp_path) + [
        "ray_kwargs.ray_init.num_cpus=2",
        f"hydra.run.dir={tmp_path / 'hydra'}",
    ]
    run = launch_training(overrides, tmp_path / "train.log", timeout_s=RUN_TIMEOUT_S, cwd=tmp_path)
    log = run.log_path.read_text()
    assert not run.timed_out, log[-3000:]
    assert run.returncode != 0
    assert "PreflightError" in log and "verl-cpu preflight found 1 problem" in log, log[-3000:]
    assert "Ray resource CPU=3" in log and "++ray_kwargs.ray_init.num_cpus=4" in log
    assert "step:1" not in log
