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
"""GPU tier: the CPO loss positions and difficulty mask give the CPU results on CUDA tensors."""

import numpy as np
import pytest
import torch

from treetune_recipe.cpo.methods.core_algos import LOSS_POSITIONS, apply_loss_position, compute_difficulty_mask

pytestmark = pytest.mark.gpu


def _mask_and_entropy(bsz: int = 64, width: int = 257) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(0, width + 1, (bsz,), generator=gen)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    return mask, torch.rand(bsz, width, generator=gen) * 3 * mask


@pytest.mark.parametrize("position", sorted(LOSS_POSITIONS))
def test_loss_position_on_cuda_matches_cpu(position):
    mask, entropy = _mask_and_entropy()
    expected = apply_loss_position(mask, entropy, position)
    out = apply_loss_position(mask.cuda(), entropy.cuda(), position)
    torch.testing.assert_close(out.cpu(), expected)


def test_difficulty_mask_on_cuda_matches_cpu():
    rng = np.random.default_rng(0)
    uids = np.array([f"u{k}" for k in rng.integers(0, 50, size=400)], dtype=object)
    rewards = torch.tensor(rng.choice([1.0, -1.0], size=400, p=[0.7, 0.3]), dtype=torch.float32)
    out = compute_difficulty_mask(rewards.cuda(), uids)
    assert out.is_cuda
    torch.testing.assert_close(out.cpu(), compute_difficulty_mask(rewards, uids))
