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
"""verl-cpu's platform (verl >= 0.9): registration, selection, and what verl asks of it."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from verl_cpu import plugin
from verl_cpu.host import accelerator_available, platform_layer_available
from verl_cpu.release_guard import verl_is

needs_platform_layer = pytest.mark.skipif(verl_is("0.7.1"), reason="verl 0.7.1 has no platform plugin layer")
pytestmark = pytest.mark.skipif(accelerator_available(), reason="the CPU platform is selected only without one")

#: What a fresh process reports about verl's platform after ``import verl`` (the entry point runs there).
PROBE = textwrap.dedent(
    """
    import json
    from omegaconf import OmegaConf
    import verl
    from verl.plugin.platform import PlatformRegistry
    from verl.utils.device import auto_set_device, get_device_name, get_nccl_backend, get_resource_name
    config = OmegaConf.create({"trainer": {"device": "cpu"}})
    auto_set_device(config)
    print(json.dumps({
        "registered": "cpu" in PlatformRegistry.registered_names(),
        "device": get_device_name(),
        "backend": get_nccl_backend(),
        "ray_resource": get_resource_name(),
        "trainer_device_after_auto_set_device": config.trainer.device,
    }))
    """
)


def probe(**env_overrides: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_PLUGINS")}
    env.pop("VERL_USE_EXTERNAL_MODULES", None)
    env.update(env_overrides)
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@needs_platform_layer
def test_import_verl_registers_the_platform_and_selects_it_on_a_host_without_accelerator():
    assert probe() == {
        "registered": True,
        "device": "cpu",
        "backend": "gloo",
        "ray_resource": "cpu",
        "trainer_device_after_auto_set_device": "cpu",  # verl's fallback platform would rewrite it to cuda
    }


@needs_platform_layer
def test_without_the_plugin_verl_falls_back_to_cuda_and_rewrites_the_device():
    # The control: verl's own behaviour on this host, which the plugin exists to change.
    report = probe(VERL_USE_EXTERNAL_PLUGINS="none")
    assert report["registered"] is False
    assert report["device"] == "cuda" and report["trainer_device_after_auto_set_device"] == "cuda"


@needs_platform_layer
def test_verl_platform_cpu_works_where_the_plugin_or_the_activate_module_registered_it():
    env = {"VERL_PLATFORM": "cpu", "VERL_USE_EXTERNAL_PLUGINS": "none"}
    # without the entry point nothing registers it: verl refuses the unknown name, naming its registry
    env_no_module = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_MODULES",)} | env
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env_no_module)
    assert result.returncode != 0 and "Unknown platform 'cpu'" in result.stderr
    # the activate module (what every Ray process of a CPU run imports) registers it too
    assert probe(**env, VERL_USE_EXTERNAL_MODULES="verl_cpu.activate")["device"] == "cpu"


@needs_platform_layer
def test_every_abstract_member_is_implemented_and_the_device_module_answers_like_cuda():
    from verl.plugin.platform import PlatformBase
    from verl_cpu.platform import PlatformCPU

    assert not PlatformCPU.__abstractmethods__
    assert issubclass(PlatformCPU, PlatformBase)
    platform = PlatformCPU()
    assert (platform.device_name, platform.communication_backend_name(), platform.ray_resource_name()) == (
        "cpu",
        "gloo",
        "cpu",
    )
    assert platform.ray_resource_options(0.5) == {"resources": {"cpu": 0.5}}
    assert torch.zeros(1).to(device=platform.current_device()).device.type == "cpu"  # an index would mean cuda
    device = platform.device_module
    assert device.memory_allocated() == 0 and device.max_memory_reserved() == 0
    free, total = device.mem_get_info()
    assert 0 < free <= total
    assert device.synchronize is torch.cpu.synchronize  # what torch.cpu has is torch.cpu's own
    with platform.nvtx_range("x"):
        pass
    assert torch.arange(3.0).pin_memory().is_pinned() is False  # creating the selected platform activated verl-cpu
    assert platform.is_platform_available()  # torch sees no accelerator here


@needs_platform_layer
def test_fsdp_engines_resolve_for_the_cpu_device():
    from verl.utils.device import get_device_name
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    assert get_device_name() == "cpu"  # selecting the platform activated verl-cpu, which registered them
    assert EngineRegistry.get_engine_cls("language_model", "fsdp2") is FSDPEngineWithLMHead


@pytest.mark.skipif(not verl_is("0.7.1"), reason="verl 0.7.1 only")
def test_on_verl_071_the_plugin_does_nothing():
    assert platform_layer_available() is False
    plugin.register_platform()  # no error, nothing to register with


@needs_platform_layer
def test_preflight_names_the_missing_platform_before_anything_starts():
    script = "from verl_cpu.preflight import _platform_problem; print(repr(_platform_problem()))"

    def run(**env_overrides):
        env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_MODULES"} | env_overrides
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout.strip().splitlines()[-1]

    assert run(VERL_USE_EXTERNAL_PLUGINS="auto") == "None"
    problem = run(VERL_USE_EXTERNAL_PLUGINS="none")
    assert "selected its 'cuda' platform" in problem and "rewrites trainer.device=cpu to cuda" in problem
