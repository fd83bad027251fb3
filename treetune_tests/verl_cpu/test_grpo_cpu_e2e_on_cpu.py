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
"""End to end on CPU: upstream ``verl.trainer.main_ppo`` (unmodified, in a subprocess) trains the tiny model with GRPO.

Two steps on engine workers (``use_legacy_worker_impl=disable``), with KL loss against the reference model, the
``hf`` rollout and the CPU patches loaded through ``VERL_USE_EXTERNAL_MODULES``. Checked from the run's own outputs:
exit status, logged metrics, a changed policy (saved HF checkpoint vs the initial weights) and rollout log-probs
that agree with the actor's recomputation on the updated weights (so the weight sync to the server works), on the
context-sensitive tiny model, where a forward without its context would be off by nats.
"""

import math

import pytest
import torch
from safetensors.torch import load_file

from treetune_scripts.make_tiny_assets import CONTEXT_SENSITIVE, build_tiny_assets
from treetune_verl.tiny_run import METRICS_FILE, launch_training, read_metrics, tiny_run_overrides

RUN_TIMEOUT_S = 480
STEPS = 2


@pytest.mark.e2e
@pytest.mark.both_releases
@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_grpo_two_steps_on_engine_workers_with_kl_loss(tmp_path):
    assets_dir = build_tiny_assets(config=CONTEXT_SENSITIVE)  # log-probs that depend on their context, by nats
    overrides = tiny_run_overrides(assets_dir, tmp_path, total_training_steps=STEPS, experiment_name="e2e_grpo")
    overrides += [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=2",
        "trainer.use_legacy_worker_impl=disable",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        # A large learning rate moves the policy enough in one step that rollouts from stale server weights would
        # visibly disagree with the actor's log-probs at step 2 (measured: Pearson 0.15 instead of 0.97).
        "actor_rollout_ref.actor.optim.lr=1e-2",
        f"trainer.save_freq={STEPS}",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]",
        f"hydra.run.dir={tmp_path / 'hydra'}",
    ]
    run = launch_training(overrides, tmp_path / "train.log", timeout_s=RUN_TIMEOUT_S, cwd=tmp_path)
    log_tail = "\n".join(run.log_path.read_text().splitlines()[-60:])
    assert not run.timed_out, f"run exceeded {RUN_TIMEOUT_S} s:\n{log_tail}"
    assert run.returncode == 0, log_tail

    metrics = read_metrics(tmp_path / METRICS_FILE)
    assert sorted(metrics) == list(range(1, STEPS + 1))
    for step, values in metrics.items():
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "timing_s/step", "timing_s/gen"):
            assert key in values and math.isfinite(values[key]), (step, key)
        # A step whose groups all tie (every response scored -1: no advantage) and whose policy still equals the
        # reference has nothing to follow (measured on verl 0.7.1: step 1, grad norm 0); any other step must move.
        has_signal = values["critic/advantages/max"] > 0 or values["critic/advantages/min"] < 0
        assert values["actor/grad_norm"] > 0 or not (has_signal or values["actor/kl_loss"] > 0), (step, values)
        assert values["training/rollout_probs_diff_max"] < 0.1
        assert abs(values["rollout_corr/kl"]) < 0.01, (step, values["rollout_corr/kl"])  # 3 nats with verl #6278
    assert any(values["actor/grad_norm"] > 0 for values in metrics.values())
    assert metrics[STEPS]["actor/kl_loss"] > 0  # the reference model is on and the policy moved away from it
    # Step 2 rolled out with the weights after update 1: the server must have received them.
    assert metrics[STEPS]["training/rollout_actor_probs_pearson_corr"] > 0.9
    assert metrics[STEPS]["rollout_corr/k3_kl"] < 0.01

    initial = load_file(assets_dir / "model" / "model.safetensors")
    trained = load_file(
        tmp_path / "checkpoints" / f"global_step_{STEPS}" / "actor" / "huggingface" / "model.safetensors"
    )
    assert sorted(trained) == sorted(initial)
    changes = {name: (trained[name].float() - initial[name].float()).abs().max().item() for name in initial}
    assert all(math.isfinite(change) for change in changes.values())
    assert max(changes.values()) > 1e-3, changes
    assert all(torch.isfinite(tensor).all() for tensor in trained.values())

    step_times = [round(metrics[step]["timing_s/step"], 2) for step in sorted(metrics)]
    peak_gib = run.peak_rss_bytes / 2**30
    print(f"\ne2e GRPO CPU: wall {run.wall_s:.1f} s, timing_s/step {step_times}, peak RSS {peak_gib:.2f} GiB")
