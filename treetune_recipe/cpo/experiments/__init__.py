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
"""The CPO recipe's CPU experiments as a library: the warm start of the chain task, its RL settings, the hard regime's
prompts, the CPO-vs-GRPO comparison and its summary.

They live with the recipe, not in ``treetune_scripts/``, because they are CPO-experiment code that several command
lines and tests share (the scripts only parse arguments and call them), and not in ``treetune_verl/`` because they
know the recipe (its hint builder, methods and config). ``task`` holds the chain task's RL overrides and hint wording,
``warm_start`` the verl-SFT warm start (its shipped weights in ``shipped_warm_start/``), ``hard_prompts`` the hard
regime's prompts and gate, ``cpo_vs_grpo`` the comparison's methods, runs and results, ``summary`` the per-method
table and curves, ``console`` the condensed console line of a run.
"""
