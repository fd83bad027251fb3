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
"""Test helper, loaded in every Ray process of a run through ``VERL_USE_EXTERNAL_MODULES``: a broken weight sync.

verl's vLLM worker extension still receives every bucket the trainer sends, but loads none of it, so the rollout keeps
sampling from the initial weights while the trainer moves on. The vLLM end-to-end tests use it as the control of their
rollout/trainer agreement check.
"""

import treetune_verl.cpu_backend  # noqa: F401  (everything a CPU run loads, as the module it replaces in the list)
from treetune_verl.import_hooks import run_after_import


def _discard_received_weights(module) -> None:
    module.vLLMColocateWorkerExtension._update_weights = lambda self, weights, peft_config, base_sync_done: None


run_after_import("verl.workers.rollout.vllm_rollout.utils", _discard_received_weights)
