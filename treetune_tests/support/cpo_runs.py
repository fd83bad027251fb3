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
"""The CPO recipe's end-to-end runs on CPU (``python -m treetune_recipe.cpo.main_cpo platform=cpu`` with real Ray), as
the e2e test modules of the recipe start and check them."""

from treetune_recipe.cpo.trainer.cpu_run import launch_cpo_on_cpu
from treetune_tests.support.runs import finished_run_metrics

#: Time limit of one run (a two- or three-step run takes 1-3 minutes on 2 cores).
RUN_TIMEOUT_S = 480
#: Healthy mismatch: about 1e-8 nats per token on verl 0.9.1 (fp32 trainer), 1e-3 on 0.7.1 (bf16 autocast); the
#: attention-mask bug gave 3.
ROLLOUT_KL_MAX = 0.01


def run_cpo(assets_dir, run_dir, *, steps, extra=(), timeout_s=RUN_TIMEOUT_S, env=None):
    """Train with the CPO recipe on the CPU profile; returns (run, metrics by step). Asserts a clean exit."""
    run = launch_cpo_on_cpu(
        ["actor_rollout_ref.rollout.n=4", *extra],
        run_dir / "train.log",
        assets_dir=assets_dir,
        run_dir=run_dir,
        total_training_steps=steps,
        experiment_name="e2e_cpo",
        timeout_s=timeout_s,
        env=env,
    )
    return run, finished_run_metrics(run, run_dir, steps)
