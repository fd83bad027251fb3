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
"""GPU tier: the CPO wrappers, loss positions and difficulty mask give the CPU results on CUDA tensors.

The loss runs inside the engine's ``torch.autocast(bfloat16)`` region, so the wrappers are also run under it.
"""

import types

import numpy as np
import pytest
import torch

from treetune_recipe.cpo.cpo_core_algos import (
    CPO_WRAPPERS,
    LOSS_POSITIONS,
    apply_loss_position,
    compute_difficulty_mask,
)

pytestmark = pytest.mark.gpu
CFG = types.SimpleNamespace(cpo_lambda=2.0, pos_alpha=0.3, neg_alpha=0.5)


def _inputs(bsz: int = 64, width: int = 257) -> dict:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(0, width + 1, (bsz,), generator=gen)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    old = -torch.rand(bsz, width, generator=gen) * 4 * mask
    return dict(
        advantages=torch.randn(bsz, 1, generator=gen) * mask,
        gw_log_probs=(old + torch.randn(bsz, width, generator=gen)).clamp(max=0) * mask,
        old_log_probs=old,
        entropy=torch.rand(bsz, width, generator=gen) * 3 * mask,
        response_mask=mask,
        seq_rewards=torch.tensor([1.0, -1.0, 0.0])[torch.randint(0, 3, (bsz,), generator=gen)],
        difficulty=torch.tensor([-1.0, 0.0, 1.0])[torch.randint(0, 3, (bsz,), generator=gen)],
    )


@pytest.mark.parametrize("name", sorted(CPO_WRAPPERS))
def test_wrapper_on_cuda_under_bf16_autocast_matches_cpu(name):
    cpu_inputs = _inputs()
    cuda_inputs = {key: value.cuda() for key, value in cpu_inputs.items()}
    expected = CPO_WRAPPERS[name](cfg=CFG, **cpu_inputs)
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        out = CPO_WRAPPERS[name](cfg=CFG, **cuda_inputs)
    assert out.dtype == torch.float32 and out.is_cuda
    torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("position", sorted(LOSS_POSITIONS))
def test_loss_position_on_cuda_matches_cpu(position):
    inputs = _inputs()
    expected = apply_loss_position(inputs["response_mask"], inputs["entropy"], position)
    out = apply_loss_position(inputs["response_mask"].cuda(), inputs["entropy"].cuda(), position)
    torch.testing.assert_close(out.cpu(), expected)


def test_difficulty_mask_on_cuda_matches_cpu():
    rng = np.random.default_rng(0)
    uids = np.array([f"u{k}" for k in rng.integers(0, 50, size=400)], dtype=object)
    rewards = torch.tensor(rng.choice([1.0, -1.0], size=400, p=[0.7, 0.3]), dtype=torch.float32)
    out = compute_difficulty_mask(rewards.cuda(), uids)
    assert out.is_cuda
    torch.testing.assert_close(out.cpu(), compute_difficulty_mask(rewards, uids))
