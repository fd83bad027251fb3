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
"""GPU tier: the CPO advantage wrappers give the CPU results on CUDA tensors.

The loss runs inside the engine's ``torch.autocast(bfloat16)`` region, so the wrappers are also run under it.
"""

import types

import pytest
import torch

from treetune_recipe.cpo.methods.registry import CPO_WRAPPERS

pytestmark = pytest.mark.gpu
CFG = types.SimpleNamespace(cpo_lambda=2.0, pos_alpha=0.3, neg_alpha=0.5, rlsd_lambda=0.5, rlsd_clip=0.2)


def _inputs(bsz: int = 64, width: int = 257) -> dict:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(0, width + 1, (bsz,), generator=gen)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    old = -torch.rand(bsz, width, generator=gen) * 4 * mask
    return dict(
        advantages=torch.randn(bsz, 1, generator=gen) * mask,
        teacher_log_probs=(old + torch.randn(bsz, width, generator=gen)).clamp(max=0) * mask,
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
