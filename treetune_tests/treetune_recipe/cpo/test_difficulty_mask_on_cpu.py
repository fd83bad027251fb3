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
"""compute_difficulty_mask: per prompt group -1 all failed, +1 all succeeded, 0 mixed; reference mode = zeros."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from treetune_recipe.cpo.methods.core_algos import compute_difficulty_mask

GOLDEN = json.loads((Path(__file__).parents[2] / "fixtures" / "cpo_wrappers_golden.json").read_text())


def _labels(rewards, uids, **kwargs) -> torch.Tensor:
    return compute_difficulty_mask(torch.tensor(rewards, dtype=torch.float32), np.array(uids, dtype=object), **kwargs)


def test_groups_of_varied_size_with_interleaved_uids_pm1_rewards():
    uids = ["p", "q", "p", "r", "q", "s", "p", "r", "q"]
    rewards = [1, -1, 1, 1, 1, -1, 1, -1, -1]
    # p: 1,1,1 -> +1 | q: -1,1,-1 -> 0 | r: 1,-1 -> 0 | s: -1 (singleton) -> -1
    expected = torch.tensor([1, 0, 1, 0, 0, -1, 1, 0, 0], dtype=torch.float32)
    out = _labels(rewards, uids)
    torch.testing.assert_close(out, expected)
    assert out.dtype == torch.float32 and out.shape == (9,)


def test_zero_one_rewards_and_other_failure_values():
    uids = ["a", "b", "a", "b", "c", "c", "d"]
    rewards = [1, 0, 1, 0, 0, 1, 0.5]  # a all 1, b all 0, c mixed, d: 0.5 is not a success
    torch.testing.assert_close(_labels(rewards, uids), torch.tensor([1.0, -1, 1, -1, 0, 0, -1]))


def test_success_value_is_configurable():
    uids = ["a", "a", "b", "b"]
    rewards = [2.0, 2.0, 1.0, 2.0]
    torch.testing.assert_close(_labels(rewards, uids, success_value=2.0), torch.tensor([1.0, 1, 0, 0]))
    torch.testing.assert_close(_labels(rewards, uids), torch.tensor([-1.0, -1, 0, 0]))


def test_uids_as_list_of_str():
    out = compute_difficulty_mask(torch.tensor([1.0, 1.0, -1.0]), ["u1", "u1", "u2"])
    torch.testing.assert_close(out, torch.tensor([1.0, 1.0, -1.0]))


@pytest.mark.parametrize("case", sorted(GOLDEN["difficulty_mask_reference"]))
def test_reference_mode_reproduces_the_forks_all_zeros(case):
    entry = GOLDEN["difficulty_mask_reference"][case]
    out = _labels(entry["rewards"], entry["uids"], mode="reference")
    torch.testing.assert_close(out, torch.tensor(entry["reference_output"], dtype=torch.float32))


def test_spec_intended_labels_on_the_golden_batches():
    # the intended labels for the ±1 and mixed batches (with fixed success = 1.0, not the batch max)
    entry = GOLDEN["difficulty_mask_reference"]["mixed_batch"]
    torch.testing.assert_close(_labels(entry["rewards"], entry["uids"]), torch.tensor([1.0, 1, -1, -1, 0, 0]))
    entry = GOLDEN["difficulty_mask_reference"]["all_same_batch"]
    torch.testing.assert_close(_labels(entry["rewards"], entry["uids"]), torch.tensor([-1.0, -1, -1, -1]))


def test_bad_mode_and_mismatched_uids_are_rejected():
    with pytest.raises(ValueError, match="group, reference"):
        _labels([1.0], ["a"], mode="batch")
    with pytest.raises(ValueError, match="one uid per response"):
        _labels([1.0, 1.0], ["a"])


def test_large_shuffled_batch_matches_a_per_group_loop():
    rng = np.random.default_rng(0)
    uids = np.array([f"uid-{k}" for k in rng.integers(0, 300, size=2000)], dtype=object)
    rewards = torch.tensor(rng.choice([1.0, -1.0], size=2000, p=[0.8, 0.2]), dtype=torch.float32)
    expected = torch.empty(2000)
    for uid in set(uids):
        rows = np.flatnonzero(uids == uid)
        group = rewards[rows]
        expected[rows] = 1.0 if bool((group == 1).all()) else -1.0 if bool((group != 1).all()) else 0.0
    assert {-1.0, 0.0, 1.0} <= set(expected.tolist())
    torch.testing.assert_close(compute_difficulty_mask(rewards, uids), expected)
