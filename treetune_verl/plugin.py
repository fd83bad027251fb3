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
"""The overlay's ``verl.plugins`` entry point: verl 0.9.1 imports this module with itself, in every process.

It only arranges for :mod:`treetune_verl.seeded_agent_loop` to register its agent loop once verl's agent-loop module
is imported, so a process that never builds an agent loop (a trainer worker) imports nothing more. verl 0.7.1 loads
no entry points; the seeded agent loop is for verl 0.9.1 only.
"""

from verl_cpu.import_hooks import run_after_import

#: The verl module whose registry the seeded agent loop joins.
AGENT_LOOP_MODULE = "verl.experimental.agent_loop.agent_loop"


def _register_seeded_agent_loop(_module) -> None:
    import treetune_verl.seeded_agent_loop  # noqa: F401  (its @register runs on import)


run_after_import(AGENT_LOOP_MODULE, _register_seeded_agent_loop)
