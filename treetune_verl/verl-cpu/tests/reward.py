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
"""Reward of the end-to-end test's addition problems (a verl ``custom_reward_function``)."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """1.0 when the response contains the answer, plus a tie-breaker below 0.01: the mean character code over 127 / 100.

    The random test model rarely writes the answer, so with the answer alone every group of a step could score the same
    and GRPO's advantages, hence the gradient the test checks, would be exactly zero. The tie-breaker makes the two
    responses of a group score differently unless their characters sum to the same code.
    """
    response = solution_str or ""
    tie_breaker = sum(map(ord, response)) / max(len(response), 1) / 127 / 100
    return (1.0 if ground_truth in response else 0.0) + tie_breaker
