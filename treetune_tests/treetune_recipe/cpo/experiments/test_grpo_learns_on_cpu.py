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
"""GRPO learns on CPU, through the real entry point (``python -m treetune_recipe.cpo.main_cpo platform=cpu``).

Setting: the experiments' default warm start (``build_warm_start()``), GRPO with the experiment's task settings
(``TASK_RL_OVERRIDES``: +-1 reward, 8 prompts x n=8 per step, one on-policy update per step, KL loss 0.001) on a fixed
set of 16 prompts (the first 16 rows of the warm start's ``train.parquet``), which are also verl's validation set: its
greedy accuracy (``GREEDY_VAL_ACC_KEY``) at step 0 and at the last step says whether the policy learned those prompts.

Learning is read from two numbers: the train reward's least-squares trend over all steps (slope times the steps it
spans: every step counts, where a first-vs-last window reads 10 of 20 noisy steps) and the greedy accuracy gain.
Measured on the 2-core box (``pytest -s`` prints the same numbers), lr 2e-4, 40 steps, verl 0.9.1, on two earlier
SFT builds of the default warm start (greedy accuracy 0.125 on these 16 prompts in both); the test now trains from the
shipped warm start (``warm_start.SHIPPED_WEIGHTS``, the same weights on every machine):

    rollout  seed  lr    train reward, first 5 -> last 5 steps  trend  greedy acc       |rollout_corr/kl| max  run
    hf       0     2e-4  -0.750 -> -0.494 (+0.26)               +0.35  0.125 -> 0.375   1.8e-3                 219 s
    hf       1     2e-4  -0.806 -> -0.406 (+0.40)               +0.41  0.125 -> 0.375   1.1e-3                 232 s
    hf       2     2e-4  -0.750 -> -0.212 (+0.54)               +0.66  0.125 -> 0.5625  1.4e-3                 210 s
    hf       3     2e-4  -0.756 -> -0.412 (+0.34)               +0.47  0.125 -> 0.5     1.5e-3                 201 s
    vllm     0     2e-4  -0.756 -> -0.300 (+0.46)               +0.45  0.125 -> 0.625   1.4e-3                 238 s
    hf       0     0     -0.819 -> -0.800 (+0.02)               +0.03  0.125 -> 0.125   1.4e-3                 212 s

The trainer computed under bf16 autocast in those runs. verl-cpu's profile now trains in fp32, and on the shipped warm
start (greedy accuracy 0.0625 on these prompts), on a 2-core AMD EPYC without AVX-512:

    hf       0     2e-4  -0.812 -> -0.263 (+0.55)               +0.63  0.0625 -> 0.5    4.9e-8                 302 s

The test trains 20 steps at lr 4e-4 (half the steps, twice the rate: the same learning in two thirds of the time),
with the hf rollout's per-request seeds (each seed now samples the same tokens on every run on one machine):

    steps  seed  lr    train reward, first 5 -> last 5 steps  trend  greedy acc       |rollout_corr/kl| max  run
    20     0     4e-4  -0.831 -> -0.450 (+0.38)               +0.50  0.0625 -> 0.4375  0.0                   (load)
    20     1     4e-4  -0.725 -> -0.375 (+0.35)               +0.46  0.0625 -> 0.375   0.0                   202 s
    20     0     0     -0.831 -> -0.794 (+0.04)               +0.03  0.0625 -> 0.0625  0.0                   197 s

The runs of the table were not reproducible (the warm start was rebuilt by an SFT that is not bitwise reproducible,
and the ``hf`` server then drew every batch from one shared random stream, so one seed sampled differently from run
to run; both are fixed now): seed 0 has
also given +0.50 and 0.125 -> 0.5625 (hf) and +0.44 and 0.125 -> 0.4375 (vLLM) on the first-vs-last windows, and a
CI run failed the former window criterion (gain >= 0.3) with the +0.26 above. Thresholds: trend >= 0.15 (smallest
learning run +0.35; the control with lr 0, which cannot learn, +0.03) and accuracy gain >= 2/16 (smallest 4/16;
the control 0, its weights never change); at 20 steps and lr 4e-4 the smallest learning run gives +0.46 and 5/16, the
lr-0 control +0.03 and 0.

The run uses the ``hf`` rollout. The vLLM row of the table was measured once and is not rerun here: that vLLM
samples with the weights of every step is asserted in ``treetune_tests/verl_cpu/test_vllm_rollout_e2e_on_cpu.py``
(a run whose policy moves by nats per step, with a stale-weights control). Health: the rollout's log-probs match the
trainer's, ``|rollout_corr/kl| < 0.01`` at every step (about 3 before the attention-mask fix,
verl-cpu's ``no_padding_attention_mask`` in ``verl_cpu/patches/engine.py``). GRPO with the CPO config is plain GRPO:
no hinted pass and no shaping, only the prompt-group outcome shares every estimator logs.
"""

import statistics
from pathlib import Path

import pytest

from treetune_recipe.cpo.experiments.task import GREEDY_VAL_ACC_KEY, HINT_OVERRIDES, TASK_RL_OVERRIDES
from treetune_recipe.cpo.experiments.warm_start import build_warm_start, write_first_prompts
from treetune_recipe.cpo.trainer.cpu_run import launch_cpo_on_cpu
from treetune_tests.support.runs import finished_run_metrics

NUM_PROMPTS = 16
STEPS = 20
LR = 4e-4
SEED = 0
WINDOW = 5
RUN_TIMEOUT_S = 900
#: Below every learning run measured, above the lr-0 control (see the module docstring).
REWARD_TREND_MIN = 0.15
VAL_ACC_GAIN_MIN = 2 / NUM_PROMPTS
#: Healthy mismatch: below 5e-8 nats per token with the fp32 trainer, about 1e-3 with the former bf16 one; the
#: attention-mask bug gave ~3.
ROLLOUT_KL_MAX = 0.01
REWARD_KEY = "critic/score/mean"
#: The only ``cpo/`` metrics a GRPO run logs: the prompt-group outcome shares, logged for every estimator.
GROUP_OUTCOME_METRICS = {"cpo/group_all_wrong_frac", "cpo/group_all_correct_frac", "cpo/success_frac"}
ROLLOUT_KL_KEY = "rollout_corr/kl"


def grpo_overrides(prompts: Path, *, seed: int, steps: int, lr: float) -> list[str]:
    """The experiment's GRPO run (task settings, hint wording, seeds) on a fixed prompt set, validated at both ends."""
    return [
        *TASK_RL_OVERRIDES,
        *HINT_OVERRIDES,
        f"data.train_files={prompts}",
        f"data.val_files={prompts}",
        f"trainer.total_epochs={steps}",
        f"trainer.test_freq={steps}",
        f"data.seed={seed}",
        f"++actor_rollout_ref.rollout.engine_kwargs.hf.seed={seed}",
        "algorithm.adv_estimator=grpo",
        f"actor_rollout_ref.actor.optim.lr={lr}",
    ]


def run_grpo(warm_dir: Path, run_dir: Path, *, seed: int = SEED, steps: int = STEPS, lr: float = LR, extra=()):
    """One GRPO run on the fixed prompts; returns (run, metrics by step). Asserts a clean exit."""
    run_dir.mkdir(parents=True, exist_ok=True)
    prompts = write_first_prompts(warm_dir, run_dir / "prompts.parquet", NUM_PROMPTS)
    run = launch_cpo_on_cpu(
        [*grpo_overrides(prompts, seed=seed, steps=steps, lr=lr), *extra],
        run_dir / "train.log",
        assets_dir=warm_dir,
        run_dir=run_dir,
        total_training_steps=steps,
        experiment_name=f"grpo_learns_seed{seed}",
        timeout_s=RUN_TIMEOUT_S,
    )
    return run, finished_run_metrics(run, run_dir)


def summarize(metrics: dict[int, dict[str, float]], wall_s: float) -> dict[str, float]:
    """The numbers the test asserts on: train reward of the first and last steps, greedy accuracy, rollout KL."""
    train_steps = sorted(step for step, values in metrics.items() if REWARD_KEY in values)
    rewards = [metrics[step][REWARD_KEY] for step in train_steps]
    val = [
        (step, values[GREEDY_VAL_ACC_KEY]) for step, values in sorted(metrics.items()) if GREEDY_VAL_ACC_KEY in values
    ]
    kls = [metrics[step][ROLLOUT_KL_KEY] for step in train_steps]
    return {
        "train_steps": len(train_steps),
        "reward_first": statistics.fmean(rewards[:WINDOW]),
        "reward_last": statistics.fmean(rewards[-WINDOW:]),
        "reward_trend": statistics.linear_regression(train_steps, rewards).slope * (train_steps[-1] - train_steps[0]),
        "val_acc_start": val[0][1],
        "val_acc_end": val[-1][1],
        "val_steps": [step for step, _ in val],
        "kl_min": min(kls),
        "kl_max": max(kls),
        "kl_absmax": max(abs(kl) for kl in kls),
        "wall_s": wall_s,
    }


@pytest.fixture(scope="module")
def warm_dir():
    """The experiments' default warm start (cached; about 3 minutes to build on a fresh machine)."""
    return build_warm_start()


@pytest.mark.e2e
@pytest.mark.timeout(RUN_TIMEOUT_S + 600)
def test_grpo_learns_a_fixed_prompt_set_from_the_warm_start(warm_dir, tmp_path):
    run, metrics = run_grpo(warm_dir, tmp_path, extra=["actor_rollout_ref.rollout.name=hf"])
    numbers = summarize(metrics, run.wall_s)
    print(
        f"\nGRPO (hf rollout) seed {SEED}, lr {LR}, {STEPS} steps on {NUM_PROMPTS} prompts: "
        f"train reward first {WINDOW} {numbers['reward_first']:+.3f} -> last {WINDOW} {numbers['reward_last']:+.3f} "
        f"(gain {numbers['reward_last'] - numbers['reward_first']:+.3f}, trend {numbers['reward_trend']:+.3f}); "
        f"greedy acc {numbers['val_acc_start']:.4f} -> {numbers['val_acc_end']:.4f}; rollout_corr/kl in "
        f"[{numbers['kl_min']:.2e}, {numbers['kl_max']:.2e}]; run {numbers['wall_s']:.0f} s"
    )
    assert numbers["train_steps"] == STEPS
    for step in range(1, STEPS + 1):
        assert "actor/pg_loss" in metrics[step] and "actor/kl_loss" in metrics[step], step
        assert {key for key in metrics[step] if "cpo/" in key} == GROUP_OUTCOME_METRICS, step
    assert numbers["val_steps"] == [0, STEPS], "validation must run before training and after the last step"
    # Healthy: the rollout's log-probs are the trainer's at every step.
    assert numbers["kl_absmax"] < ROLLOUT_KL_MAX, numbers
    # Learning: the reward on the training prompts trends up, and more of them are solved greedily.
    assert numbers["reward_trend"] >= REWARD_TREND_MIN, numbers
    assert numbers["val_acc_end"] - numbers["val_acc_start"] >= VAL_ACC_GAIN_MIN, numbers
