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
"""Importing this module activates verl-cpu in this process (:func:`verl_cpu.activation.activate`).

List it in ``VERL_USE_EXTERNAL_MODULES`` (the CPU profile, ``verl_cpu/config/platform/cpu.yaml``, does it in the Ray
runtime env): verl imports the listed modules with itself, in the driver and in every Ray worker. verl 0.7.1 has no
platform layer, so this is how verl-cpu becomes active there; on verl 0.9.1 the CPU platform activates it too, and
listing the module makes the ``hf`` rollout known before any platform query. It imports :mod:`verl_cpu.plugin` first,
which registers the CPU platform (verl 0.9.1) where verl's own plugin loading is off. On a host with an accelerator
(and no ``VERL_PLATFORM=cpu``) only the ``hf`` rollout is registered, so that it can serve a small model there too.
"""

import verl_cpu.plugin  # noqa: F401  (registers the CPU platform: verl 0.9.1)
from verl_cpu.activation import activate

activate()
