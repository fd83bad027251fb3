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
"""Helpers shared by several test modules; no tests here.

Imported as ``treetune_tests.support.<module>`` (pytest puts the repository root on ``sys.path``: ``pythonpath`` in
``pyproject.toml``); a test module never imports another test module.

- :mod:`treetune_tests.support.engine_harness`: verl's FSDP engine workers in the test process;
  :mod:`treetune_tests.support.fp32_reference`: the same computations with fp32 transformers, with corrupted-forward
  controls; :mod:`treetune_tests.support.engine_checks`: the engine checks of the CPU and GPU tiers (numerics tests).
- :mod:`treetune_tests.support.distribution_harness` and :mod:`treetune_tests.support.distribution_device_loss`: the
  distribution-level losses in an engine update and alone under autocast, against fp32.
- :mod:`treetune_tests.support.runs`: the checks of a finished training run (:func:`finished_run_metrics`);
  :mod:`treetune_tests.support.cpo_runs`: the CPO recipe's e2e runs; :mod:`treetune_tests.support.child_process`: a
  Python child process to signal or kill.
- :mod:`treetune_tests.support.tokenizer_factory`: small locally trained tokenizers of four chat-template families.
- :mod:`treetune_tests.support.hint_batches`: rollout batches shaped like verl's at ``_update_actor``.
- :mod:`treetune_tests.support.cpo_trainer`: ``RayCPOTrainer`` on a composed config against an in-process fake actor
  worker group.
"""
