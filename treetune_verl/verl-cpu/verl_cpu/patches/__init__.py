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
"""verl-cpu's monkey-patches of torch and verl, one module per area; each function changes one thing, idempotently.

:mod:`.device` (a process without accelerator: gloo, pin_memory, device stand-ins, verl's full collections),
:mod:`.engine` (verl's FSDP engine) and :mod:`.vllm` (verl's vLLM rollout on vLLM's CPU build). Importing them
changes nothing: :mod:`verl_cpu.activation` decides which apply, on which verl release, and when.
"""
