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
"""verl-cpu: train with unmodified verl (0.9.1, 0.7.1) on a host without accelerator.

A verl platform for the CPU (:mod:`verl_cpu.platform`, registered through a ``verl.plugins`` entry point), gloo
collectives, verl's FSDP engines registered for device ``cpu``, two rollouts (``hf``, an HF-transformers server in
:mod:`verl_cpu.hf_server`, and verl's own vLLM rollout on vLLM's CPU build), checks that stop a configuration that
cannot run on CPU before any worker starts (:mod:`verl_cpu.preflight`), and the Hydra profile of a CPU run
(``verl_cpu/config``). Importing this package changes nothing; what changes once the CPU is selected is listed in
:mod:`verl_cpu.activation`.
"""

__version__ = "0.1.0"
