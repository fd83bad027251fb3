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
"""The warm start's gate (:func:`~treetune_recipe.cpo.experiments.warm_start.check_mixed_groups`): a warm start
whose greedy accuracy would give RL too few mixed prompt groups is refused with the measured accuracy. The shipped
weights are tested in ``test_shipped_warm_start_on_cpu.py``, verl's SFT in ``test_sft_loss_on_cpu.py``."""

import pytest

from treetune_recipe.cpo.experiments.warm_start import WarmStartGateError, check_mixed_groups


def test_warm_start_gate_refuses_all_wrong_or_all_right_with_the_measured_accuracy():
    check_mixed_groups({"val_acc_plain": 0.3})
    for accuracy in (0.02, 0.9):
        with pytest.raises(WarmStartGateError, match=f"accuracy on plain prompts is {accuracy:.3f}"):
            check_mixed_groups({"val_acc_plain": accuracy, "path": "x"})
