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

Every weight sync runs as usual, through verl's sender and vLLM's receiver, but the trainer always sends the
weights of its first sync (at start-up, onto vLLM's dummy weights): the rollout keeps sampling with the initial policy
while the trainer moves on. The vLLM end-to-end tests use it as the control of their rollout/trainer agreement check.
"""

import functools

import verl_cpu.activate  # noqa: F401  (everything a CPU run loads, as the module it replaces in the list)
from verl_cpu.import_hooks import run_after_import


def _always_send_the_first_weights(module) -> None:
    engine_cls = module.FSDPEngine
    original = engine_cls.get_per_tensor_param

    @functools.wraps(original)
    def get_per_tensor_param(self, *args, **kwargs):
        if not hasattr(self, "_first_synced_weights"):
            params, peft_config = original(self, *args, **kwargs)
            self._first_synced_weights = ([(name, tensor.clone()) for name, tensor in params], peft_config)
        params, peft_config = self._first_synced_weights
        return iter(params), peft_config

    engine_cls.get_per_tensor_param = get_per_tensor_param


run_after_import("verl.workers.engine.fsdp.transformer_impl", _always_send_the_first_weights)
