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
"""apply_loss_position: reference ``entropy``/``first`` (golden values) and the per-sequence fixes."""

import json
from pathlib import Path

import pytest
import torch

from treetune_recipe.cpo.methods.core_algos import LOSS_POSITIONS, apply_loss_position

GOLDEN = json.loads((Path(__file__).parents[2] / "fixtures" / "cpo_wrappers_golden.json").read_text())
MASK = torch.tensor(GOLDEN["inputs"]["response_mask"], dtype=torch.float32)
ENTROPY = torch.tensor(GOLDEN["inputs"]["entropys"], dtype=torch.float32)


def test_all_returns_an_equal_new_mask():
    out = apply_loss_position(MASK, ENTROPY, "all")
    torch.testing.assert_close(out, MASK)
    assert out.data_ptr() != MASK.data_ptr()


def test_entropy_matches_reference_golden():
    # reference: q = quantile(H * m over all B*T entries, 0.8) = 1.34 (padding zeros included), keep H > q
    assert torch.quantile((ENTROPY * MASK).flatten(), 0.8).item() == pytest.approx(
        GOLDEN["loss_position"]["entropy_threshold"]
    )
    out = apply_loss_position(MASK, ENTROPY, "entropy")
    assert out.dtype == MASK.dtype
    assert out.bool().tolist() == GOLDEN["loss_position"]["entropy_mask"]


def test_first_matches_reference_golden():
    # reference: keep t < floor(0.2 * T), T the padded width: nothing for T = 4, two tokens for T = 10
    out = apply_loss_position(MASK, ENTROPY, "first")
    assert out.bool().tolist() == GOLDEN["loss_position"]["first_mask_L4"]
    mask_10 = torch.ones(2, 10)
    mask_10[0, 3:] = 0
    out = apply_loss_position(mask_10, torch.zeros(2, 10), "first")
    assert out.bool().tolist() == GOLDEN["loss_position"]["first_mask_L10"]


def test_entropy_threshold_is_strict():
    mask = torch.ones(1, 5)
    entropy = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0]])  # q = 1.0, nothing is strictly above it
    assert apply_loss_position(mask, entropy, "entropy").sum() == 0


def test_first_seq_keeps_20_percent_of_each_sequences_own_length():
    lengths = [10, 5, 4, 15, 0]
    mask = (torch.arange(16)[None, :] < torch.tensor(lengths)[:, None]).long()
    out = apply_loss_position(mask, torch.zeros(5, 16), "first_seq")
    assert out.dtype == torch.long
    assert out.sum(-1).tolist() == [2, 1, 0, 3, 0]
    assert out[:, :3].tolist() == [[1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1], [0, 0, 0]]


def test_entropy_valid_uses_each_sequences_valid_tokens_only():
    # row 0: 5 valid tokens H = 1..5 -> q0.8 = 4.2 -> keeps H = 5 only; padding holds huge H and is never kept.
    # row 1: 2 valid tokens H = (0.1, 0.3) -> q0.8 = 0.26 -> keeps 0.3 (a per-batch threshold would drop both).
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0]], dtype=torch.float32)
    entropy = torch.tensor([[1.0, 2, 3, 4, 5, 99], [0.1, 0.3, 99, 99, 99, 99]])
    out = apply_loss_position(mask, entropy, "entropy_valid")
    assert out.tolist() == [[0, 0, 0, 0, 1, 0], [0, 1, 0, 0, 0, 0]]
    assert apply_loss_position(mask, entropy * mask, "entropy")[1].sum() == 0


@pytest.mark.parametrize("position", sorted(LOSS_POSITIONS))
def test_positions_never_modify_inputs_and_stay_inside_the_mask(position):
    gen = torch.Generator().manual_seed(0)
    mask = (torch.rand(6, 12, generator=gen) > 0.3).float()
    entropy = torch.rand(6, 12, generator=gen)
    mask_before, entropy_before = mask.clone(), entropy.clone()
    out = apply_loss_position(mask, entropy, position)
    assert torch.equal(mask, mask_before) and torch.equal(entropy, entropy_before)
    assert not (out.bool() & ~mask.bool()).any()


def test_unknown_position_lists_the_valid_ones():
    with pytest.raises(ValueError, match="all, entropy, first, entropy_valid, first_seq"):
        apply_loss_position(MASK, ENTROPY, "last")
