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
"""treetune_verl.verl_runtime: the engine-worker fixes every treetune Ray process applies, on any device."""

import asyncio
import subprocess
import sys
import types
from pathlib import Path

import pytest
from verl_cpu.preflight import ACTIVATE_MODULE

from treetune_verl import patches, verl_runtime
from treetune_verl.version import verl_is


class _Engine:
    def __init__(self, param_offload: bool):
        self.is_param_offload_enabled = param_offload
        self.device = "cuda"
        self.moves: list[tuple] = []

    def to(self, device, model=True, optimizer=True, grad=True):
        self.moves.append((device, model, optimizer, grad))
        if model:
            self.device = device


def _stand_in_engine_workers_module():
    """A module shaped like verl.workers.engine_workers whose update_weights offloads the model unconditionally."""

    class ActorRolloutRefWorker:
        def __init__(self, engine):
            self.actor = types.SimpleNamespace(engine=engine)

        async def update_weights(self, global_steps=None):
            self.actor.engine.to("cpu", model=True, optimizer=False, grad=False)
            return global_steps

    ActorRolloutRefWorker.update_weights.dispatch_marker = "kept"
    return types.SimpleNamespace(ActorRolloutRefWorker=ActorRolloutRefWorker)


@pytest.mark.parametrize(("param_offload", "final_device"), [(False, "cuda"), (True, "cpu")])
def test_actor_parameters_return_to_the_device_after_a_weight_sync_unless_offloaded(
    monkeypatch, param_offload, final_device
):
    monkeypatch.setattr("verl.utils.device.get_device_name", lambda: "cuda")
    module = _stand_in_engine_workers_module()
    patches._patch_keep_actor_on_device_after_weight_sync(module)
    engine = _Engine(param_offload)

    assert asyncio.run(module.ActorRolloutRefWorker(engine).update_weights(global_steps=7)) == 7
    assert engine.device == final_device
    assert engine.moves[0] == ("cpu", True, False, False)
    assert len(engine.moves) == (1 if param_offload else 2)
    # verl's @register dispatch attributes survive the wrapper, so the worker group still binds the method
    assert module.ActorRolloutRefWorker.update_weights.dispatch_marker == "kept"


def test_wrapping_twice_wraps_once(monkeypatch):
    monkeypatch.setattr("verl.utils.device.get_device_name", lambda: "cuda")
    module = _stand_in_engine_workers_module()
    patches._patch_keep_actor_on_device_after_weight_sync(module)
    once = module.ActorRolloutRefWorker.update_weights
    patches._patch_keep_actor_on_device_after_weight_sync(module)
    assert module.ActorRolloutRefWorker.update_weights is once


def test_importing_the_runtime_module_patches_verl_engine_workers_on_the_release_that_needs_it():
    import inspect

    import verl.workers.engine_workers as engine_workers

    assert verl_runtime.MODULE == "treetune_verl.verl_runtime"
    patched = verl_is("0.7.1")  # verl 0.9.1 offloads after the sync only with param offload on (PR #4777)
    assert ("keep_actor_on_device_after_weight_sync" in patches.applied_patches()) == patched
    update_weights = engine_workers.ActorRolloutRefWorker.update_weights
    assert getattr(update_weights, "_treetune_keep_on_device", False) == patched
    if not patched:
        assert "if self.actor.engine.is_param_offload_enabled:" in inspect.getsource(update_weights)


def test_the_runtime_module_applies_its_fixes_in_a_fresh_process():
    probe = (
        "import treetune_verl.verl_runtime, verl.workers.engine_workers as m; "
        "print(getattr(m.ActorRolloutRefWorker.update_weights, '_treetune_keep_on_device', False))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip().splitlines()[-1] == str(verl_is("0.7.1"))


def test_recipe_config_lists_the_runtime_module_and_the_cpu_profile_verl_cpus_activation():
    from hydra import compose, initialize_config_dir

    from treetune_recipe.cpo import main_cpo

    env_key = "VERL_USE_EXTERNAL_MODULES"
    config_dir = str(Path(main_cpo.__file__).parent / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        gpu = compose(config_name="cpo_trainer")
        cpu = compose(config_name="cpo_trainer", overrides=["platform=cpu"])
    assert gpu.ray_kwargs.ray_init.runtime_env.env_vars[env_key] == "treetune_verl.verl_runtime"
    assert cpu.ray_kwargs.ray_init.runtime_env.env_vars[env_key] == ACTIVATE_MODULE
