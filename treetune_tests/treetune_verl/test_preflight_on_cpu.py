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
"""The overlay's preflight (``treetune_verl/preflight.py``): every bad input gives one clear error naming the override
that fixes it. Its own checks (files, group sampling, batch sizes) and how it adds verl-cpu's (CPU settings without an
accelerator, Ray resources from ``ray_init``) into one message; verl-cpu's checks themselves are tested with verl-cpu.
"""

import pytest
import verl_cpu.preflight as verl_cpu_preflight
from hydra import compose, initialize_config_dir

from treetune_verl.preflight import PreflightError, check_run_config, collect_problems
from treetune_verl.tiny_assets import build_tiny_assets
from treetune_verl.tiny_run import tiny_run_overrides, verl_cpu_config_dir

#: A CPU setting verl-cpu refuses, and a Ray resource shortfall of ``ray_kwargs.ray_init``.
CPU_SETTING_PROBLEM = "trainer.device=cuda"
RESOURCE_PROBLEM = "ray_kwargs.ray_init.num_cpus=2"


@pytest.fixture(scope="module")
def assets_dir():
    return build_tiny_assets()


@pytest.fixture
def make_config(assets_dir, tmp_path, monkeypatch):
    monkeypatch.delenv(verl_cpu_preflight.EXTERNAL_MODULES_ENV, raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # a named cluster turns the resource check off

    def make(*overrides):
        with initialize_config_dir(config_dir=str(verl_cpu_config_dir()), version_base=None):
            return compose("ppo_trainer_cpu", overrides=[*tiny_run_overrides(assets_dir, tmp_path), *overrides])

    return make


def problems_of(config, accelerator=False):
    return collect_problems(config, accelerator=accelerator)


@pytest.mark.parametrize("accelerator", [False, True])
def test_the_cpu_profile_with_the_tiny_assets_passes(make_config, accelerator):
    check_run_config(make_config(), accelerator=accelerator)
    check_run_config(make_config("trainer.use_legacy_worker_impl=auto"), accelerator=accelerator)


# ------------------------------------------------------------------------------------------------------ own checks


@pytest.mark.parametrize(
    ("override", "expected_fix"),
    [
        ("actor_rollout_ref.model.path=/nonexistent/model", "model.path=/nonexistent/model does not exist"),
        ("data.train_files=/nonexistent/train.parquet", "data.train_files: /nonexistent/train.parquet does not exist"),
        ("data.val_files=[]", "data.val_files is empty"),
        ("reward.custom_reward_function.path=/nonexistent/reward.py", "does not exist"),
        ("reward.custom_reward_function.path=pkg://no_such_package.reward", "is not importable"),
    ],
)
@pytest.mark.parametrize("accelerator", [False, True])
def test_each_bad_file_is_reported_with_its_fix_on_any_host(make_config, override, expected_fix, accelerator):
    problems = problems_of(make_config(override), accelerator=accelerator)
    assert len(problems) == 1, problems
    assert expected_fix in problems[0]
    with pytest.raises(PreflightError, match="treetune preflight found 1 problem"):
        check_run_config(make_config(override), accelerator=accelerator)


def test_a_model_folder_without_config_json_is_refused(make_config, tmp_path):
    (tmp_path / "not_a_model").mkdir()
    problems = problems_of(make_config(f"actor_rollout_ref.model.path={tmp_path / 'not_a_model'}"))
    assert len(problems) == 1 and "has no config.json" in problems[0], problems


def test_a_group_estimator_needs_several_responses_per_prompt(make_config):
    # Micro-batches of one row keep the batch-size check quiet at n=1.
    micro = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"] + [
        f"actor_rollout_ref.{role}.log_prob_micro_batch_size_per_gpu=1" for role in ("rollout", "ref")
    ]
    problems = problems_of(make_config("actor_rollout_ref.rollout.n=1", *micro))
    assert len(problems) == 1, problems
    assert "algorithm.adv_estimator=grpo" in problems[0] and "set actor_rollout_ref.rollout.n=2 or more" in problems[0]
    assert problems_of(make_config("actor_rollout_ref.rollout.n=1", "algorithm.adv_estimator=gae", *micro)) == []


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_random_prompt_subset_needs_a_seed_or_a_resume_draws_another(make_config, split):
    problems = problems_of(make_config(f"data.{split}_max_samples=8"))
    assert len(problems) == 1, problems
    assert f"data.{split}_max_samples=8 with data.seed unset" in problems[0] and "set data.seed=<int>" in problems[0]
    # Controls: a seed fixes the subset, and without shuffling verl takes the first rows.
    assert problems_of(make_config(f"data.{split}_max_samples=8", "data.seed=3")) == []
    assert problems_of(make_config(f"data.{split}_max_samples=8", "data.shuffle=false")) == []


@pytest.mark.parametrize(
    ("micro_key", "size_key"),
    [
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "actor_rollout_ref.actor.ppo_mini_batch_size"),
        ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "data.train_batch_size"),
        ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "data.train_batch_size"),  # KL loss is on
    ],
)
def test_rows_that_do_not_split_into_micro_batches_are_refused_with_a_size_that_does(make_config, micro_key, size_key):
    config = make_config(f"{micro_key}=3")
    problems = problems_of(config)
    assert len(problems) == 1, problems
    assert f"{micro_key}=3" in problems[0] and size_key in problems[0]
    suggested = int(problems[0].split(f"e.g. {micro_key}=")[1].split(",")[0])
    assert problems_of(make_config(f"{micro_key}={suggested}")) == []  # the suggested size passes


def test_dynamic_batch_sizes_are_not_split_into_micro_batches(make_config):
    key = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
    assert problems_of(make_config(f"{key}=3", "actor_rollout_ref.actor.use_dynamic_bsz=true")) == []


# ----------------------------------------------------------------------------------------- with verl-cpu's checks


def test_without_an_accelerator_verl_cpus_problems_join_the_overlays_message(make_config):
    config = make_config("actor_rollout_ref.model.path=/nonexistent/model", CPU_SETTING_PROBLEM)
    cpu_problems = verl_cpu_preflight.cpu_problems(config)
    assert len(cpu_problems) == 1  # the setting is one verl-cpu refuses
    problems = problems_of(config)
    assert problems[-1] == cpu_problems[0] and "model.path=/nonexistent/model" in problems[0]
    with pytest.raises(PreflightError) as error:
        check_run_config(config, accelerator=False)
    message = str(error.value)
    assert message.startswith("treetune preflight found 2 problem") and cpu_problems[0] in message
    # The overlay owns its start-up error (it loads without verl-cpu); both checkers' errors are ValueErrors.
    assert isinstance(error.value, ValueError) and not isinstance(error.value, verl_cpu_preflight.PreflightError)


def test_with_an_accelerator_the_cpu_settings_are_not_checked(make_config):
    config = make_config(CPU_SETTING_PROBLEM, "actor_rollout_ref.model.use_remove_padding=true")
    assert problems_of(config, accelerator=True) == []


@pytest.mark.parametrize("accelerator", [False, True])
def test_ray_resources_of_ray_init_are_checked_on_any_host_unless_turned_off(make_config, accelerator):
    config = make_config(RESOURCE_PROBLEM)
    expected = verl_cpu_preflight.configured_resource_problems(config)
    assert len(expected) == 1  # ray_init is short of CPUs
    assert problems_of(config, accelerator=accelerator) == expected
    with pytest.raises(PreflightError, match="treetune preflight found 1 problem"):
        check_run_config(config, accelerator=accelerator)
    assert collect_problems(config, accelerator=accelerator, check_resources=False) == []
    check_run_config(config, accelerator=accelerator, check_resources=False)


def test_every_problem_is_reported_together(make_config):
    config = make_config(
        "actor_rollout_ref.model.path=/nonexistent/model",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
        CPU_SETTING_PROBLEM,
        RESOURCE_PROBLEM,
    )
    with pytest.raises(PreflightError, match="treetune preflight found 4 problem") as error:
        check_run_config(config, accelerator=False)
    for key in ("model.path", "ppo_micro_batch_size_per_gpu", "trainer.device", "num_cpus"):
        assert key in str(error.value)
