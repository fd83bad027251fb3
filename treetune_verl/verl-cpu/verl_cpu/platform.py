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
"""``PlatformCPU``: verl's platform interface (``verl.plugin.platform.PlatformBase``, verl >= 0.9) for the CPU.

Device ``cpu``, collectives on gloo, Ray resource ``cpu`` (a custom resource the CPU profile declares, one unit per
trainer process), no device memory, no profiler, no IPC. The device module is ``torch.cpu`` with the
``torch.cuda``-style functions verl calls added (:func:`verl_cpu.patches.device.cuda_style_stand_ins`).

verl creates its platform once per process, on the first device query, which comes before any process group or model.
Creating this one where it is selected (:func:`verl_cpu.host.cpu_selected`) activates verl-cpu in the process
(:func:`verl_cpu.activation.activate`). Auto-detection asks it after verl's own platforms, and it claims only a host
where torch sees no accelerator.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform import PlatformBase

from verl_cpu.activation import activate
from verl_cpu.host import RAY_RESOURCE, accelerator_available, cpu_selected
from verl_cpu.patches.device import cuda_style_stand_ins


class CPUDeviceModule(ModuleType):
    """``torch.cpu``, plus the ``torch.cuda``-style functions verl calls on its device module (no memory, no-ops)."""

    def __init__(self):
        super().__init__("verl_cpu.device_module")
        for name, function in cuda_style_stand_ins().items():
            if not hasattr(torch.cpu, name):
                setattr(self, name, function)

    def __getattr__(self, name: str):
        return getattr(torch.cpu, name)


_DEVICE_MODULE = CPUDeviceModule()


class PlatformCPU(PlatformBase):
    """verl platform for a host without accelerator: every trainer process computes on the CPU."""

    def __init__(self):
        if not cpu_selected():
            return
        try:
            activate()
        except Exception:
            # verl's platform detection swallows errors and falls back to cuda: say what went wrong first
            logging.getLogger(__name__).exception("verl-cpu could not activate; verl will not select the CPU platform")
            raise

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Asked after verl's own platforms: claims the host only where torch sees no accelerator.
        return not accelerator_available()

    def current_device(self) -> str:
        # verl passes this to ``Tensor.to(device=...)``: an index would mean an accelerator, so answer as torch.cpu does
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return RAY_RESOURCE

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"resources": {RAY_RESOURCE: num_gpus}}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
