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
"""GPU tier, end to end: the CPO recipe trains two steps on CUDA with the tiny assets and the ``hf`` rollout (so the
tier needs neither vLLM nor SGLang): the tiny profile (``platform=cpu``) with ``trainer.device=cuda``, so the FSDP
actor and reference run on the GPU while the ``hf`` server generates on CPU.
"""

import math

import pytest
import torch

from treetune_recipe.cpo import CONFIG_DIR, CONFIG_NAME, ENTRY_MODULE
from treetune_tests.support.runs import finished_run_metrics
from treetune_verl.tiny_assets import build_tiny_assets
from treetune_verl.tiny_run import launch_training, tiny_run_overrides

pytestmark = [pytest.mark.gpu, pytest.mark.e2e]
RUN_TIMEOUT_S = 600
STEPS = 2


@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_cpo_trains_two_steps_on_cuda_with_the_hf_rollout(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    assets_dir = build_tiny_assets()
    overrides = [
        "platform=cpu",
        *tiny_run_overrides(assets_dir, tmp_path, total_training_steps=STEPS, experiment_name="gpu_e2e_cpo"),
        "trainer.device=cuda",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        f"hydra.run.dir={tmp_path / 'hydra'}",
    ]
    run = launch_training(
        overrides,
        tmp_path / "train.log",
        entry_module=ENTRY_MODULE,
        config_dir=CONFIG_DIR,
        config_name=CONFIG_NAME,
        timeout_s=RUN_TIMEOUT_S,
        cwd=tmp_path,
    )
    metrics = finished_run_metrics(run, tmp_path, STEPS)
    for step, values in metrics.items():
        for key in ("cpo/gw_minus_old_absmean", "actor/cpo/adv_delta_absmean", "actor/pg_loss", "actor/grad_norm"):
            assert key in values and math.isfinite(values[key]), (step, key)
        assert values["cpo/gw_minus_old_absmean"] > 1e-3, step  # the hinted pass scored other log-probs
