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
"""verl-cpu's ``verl.plugins`` entry point, and the one place that adds the CPU platform to verl's ``PlatformRegistry``.

``import verl`` imports this module in every process (unless ``VERL_USE_EXTERNAL_PLUGINS=none``; then
:mod:`verl_cpu.activate` imports it). Importing it adds one registry entry and asks to be told when the verl modules
verl-cpu patches finish importing (:func:`verl_cpu.activation.watch_patched_modules`); nothing else changes. verl asks
the CPU platform last, after its own platforms, and selects it only where none of them claims the host, or when
``VERL_PLATFORM=cpu``. Selecting it activates verl-cpu (:func:`verl_cpu.activation.activate`). On verl 0.7.1, which
has no platform layer, importing this module does nothing.
"""

from __future__ import annotations

from verl_cpu.activation import watch_patched_modules
from verl_cpu.host import platform_layer_available

#: Name of the platform in verl's ``PlatformRegistry`` (``VERL_PLATFORM=cpu`` forces it).
PLATFORM_NAME = "cpu"


def register_platform() -> None:
    """Add ``PlatformCPU`` to verl's ``PlatformRegistry`` under ``cpu`` (idempotent; nothing on verl 0.7.1)."""
    if not platform_layer_available():
        return
    # verl 0.7.1 has neither verl.plugin.platform nor, so, an importable verl_cpu.platform: both only past the check
    from verl.plugin.platform import PlatformRegistry

    from verl_cpu.platform import PlatformCPU

    if PlatformRegistry.get(PLATFORM_NAME) is None:
        PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)


if platform_layer_available():
    register_platform()
    watch_patched_modules()
