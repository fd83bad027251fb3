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
"""A CPU platform for verl, through verl's own plugin layer (verl >= 0.9 registers only nvidia, huawei and amd).

With it, the unmodified verl trainer runs on a host without accelerator: ``trainer.device=cpu`` survives
``auto_set_device``, collectives use gloo, and verl's FSDP engines are found for device ``cpu``.

Activation, in every process that imports verl:

- The package declares a ``verl.plugins`` entry point (``cpu_platform``); ``import verl`` loads it and
  :func:`register` adds :class:`~.platform.PlatformCPU` to ``PlatformRegistry`` before anything asks for a platform.
  Auto-detection asks it last, so it is selected only where no accelerator platform claims the host.
- ``VERL_PLATFORM=cpu`` forces it; ``VERL_USE_EXTERNAL_PLUGINS=none`` turns verl's plugin loading off.

It depends on verl, torch and psutil only (and :mod:`treetune_verl.import_hooks`, standard library), so a verl user
can take it without the rest of this project. On verl 0.7.1, which has no platform layer, importing it does nothing.
"""

from __future__ import annotations

import importlib.util

#: Name of the platform in verl's ``PlatformRegistry`` (``VERL_PLATFORM=cpu`` forces it).
PLATFORM_NAME = "cpu"


def platform_layer_available() -> bool:
    """True when the installed verl has the platform plugin layer (verl >= 0.9)."""
    try:
        return importlib.util.find_spec("verl.plugin.platform") is not None
    except ModuleNotFoundError:  # verl 0.7.1: no verl.plugin package
        return False


def register() -> None:
    """Add ``PlatformCPU`` to verl's ``PlatformRegistry`` under ``cpu`` (idempotent; nothing on verl 0.7.1).

    Also registers verl's FSDP engines for device ``cpu`` once their module is imported (harmless under another
    platform: nothing looks the ``cpu`` entry up).
    """
    if not platform_layer_available():
        return
    from verl.plugin.platform import PlatformRegistry

    from treetune_verl.cpu_platform.device_fixes import register_fsdp_engines_for_cpu
    from treetune_verl.import_hooks import run_after_import

    if PlatformRegistry.get(PLATFORM_NAME) is None:
        from treetune_verl.cpu_platform.platform import PlatformCPU

        PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)
    run_after_import("verl.workers.engine.fsdp.transformer_impl", register_fsdp_engines_for_cpu)


register()
