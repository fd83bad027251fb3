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
"""``RayCPOTrainer`` carries the run-health guard on both paths, CPO (``adv_estimator=cpo``) and plain (``grpo``).

The trainer runs its real code against the in-process actor worker group of the hint-pass tests
(``treetune_tests/support/cpo_trainer.py``): a step's old-log-prob pass is checked before anything is updated, and the
step's verdict reaches the metrics of ``_update_actor`` on either path.
"""

import copy

import pytest
from hydra import compose, initialize_config_dir
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from treetune_recipe.cpo import CONFIG_DIR, CONFIG_NAME
from treetune_recipe.cpo.trainer.preflight import check_cpo_run
from treetune_recipe.cpo.trainer.ray_trainer import RayCPOTrainer
from treetune_tests.support.cpo_trainer import make_trainer, rollout_batch
from treetune_verl.rollout_health import (
    CHECKED_METRIC,
    CONSECUTIVE_WARNINGS_METRIC,
    WARNING_METRIC,
    RolloutHealthConfig,
    RolloutHealthMixin,
    RolloutMismatchError,
)

pytestmark = pytest.mark.usefixtures("verl_pad_helpers")


def with_rollout_log_probs(batch, shift: float):
    """The batch as ``fit`` has it after the rollout: the server's log-probs are the trainer's plus ``shift``."""
    batch = copy.deepcopy(batch)
    mask = batch.batch["response_mask"]
    batch.batch["rollout_log_probs"] = (batch.batch["old_log_probs"] + shift) * mask
    return batch


def test_guard_sits_between_the_trainer_and_upstream():
    mro = RayCPOTrainer.__mro__
    assert mro.index(RolloutHealthMixin) < mro.index(RayPPOTrainer)
    # The trainer's own pass (a student top-k for SDPO) calls super(): the guard's, which calls upstream's. The tests
    # below drive the trainer's method and see the guard stop a broken step.
    assert "_compute_old_log_prob" in vars(RolloutHealthMixin)


@pytest.mark.parametrize("estimator", ["cpo", "grpo"])
def test_both_update_paths_report_the_guard_and_a_broken_step_never_updates(monkeypatch, estimator):
    trainer = make_trainer(monkeypatch, f"algorithm.adv_estimator={estimator}")
    assert trainer.cpo_enabled is (estimator == "cpo")
    batch = rollout_batch(trainer)
    updates = trainer.actor_rollout_wg.update_requests

    trainer.global_steps = 2
    healthy = with_rollout_log_probs(batch, shift=0.001)
    trainer._compute_old_log_prob(healthy)
    metrics = trainer._update_actor(healthy).meta_info["metrics"]
    assert metrics[CHECKED_METRIC] == 1.0 and metrics[WARNING_METRIC] == 0.0
    assert ("cpo/hint_rows_frac" in metrics) is (estimator == "cpo")
    assert len(updates) == 1

    trainer.global_steps = 3
    drifting = with_rollout_log_probs(batch, shift=0.1)  # above warn_kl, below stop_kl
    trainer._compute_old_log_prob(drifting)
    metrics = trainer._update_actor(drifting).meta_info["metrics"]
    assert metrics[WARNING_METRIC] == 1.0 and metrics[CONSECUTIVE_WARNINGS_METRIC] == 1.0
    assert len(updates) == 2

    trainer.global_steps = 4
    with pytest.raises(RolloutMismatchError, match="rollout health STOP at step 4"):
        trainer._compute_old_log_prob(with_rollout_log_probs(batch, shift=3.0))
    assert len(updates) == 2


@pytest.mark.parametrize("estimator", ["cpo", "grpo"])
def test_recipe_config_has_the_block_and_bad_thresholds_stop_the_start_up_checks(estimator):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        config = compose(CONFIG_NAME, overrides=["platform=cpu", f"algorithm.adv_estimator={estimator}"])
        bad = compose(
            CONFIG_NAME,
            overrides=["platform=cpu", f"algorithm.adv_estimator={estimator}", "treetune.rollout_health.stop_kl=0.001"],
        )
    assert RolloutHealthConfig.from_run_config(config) == RolloutHealthConfig()
    # check_cpo_run checks the block before it reads any data file.
    with pytest.raises(ValueError, match=r"warn_kl=0.01 is above treetune.rollout_health.stop_kl=0.001\b"):
        check_cpo_run(bad)
