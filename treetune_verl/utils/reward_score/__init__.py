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
"""Rule-based rewards for verl's ``custom_reward_function`` (``compute_score`` of a module below).

``math_answer`` grades math, competition and multiple-choice answers, routed by ``data_source`` (the CPO recipe's
reward), on top of ``answer_extraction`` (the final answer of a response), ``string_normalize`` (normalised string
comparison) and ``math_verify_guard`` (math-verify under a time and memory limit, with ``time_limit``). ``tiny_arith``
is the dense reward of the tiny arithmetic task that the CPU demo and tests train on.
"""
