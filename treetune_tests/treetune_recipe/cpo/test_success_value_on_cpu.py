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
"""``cpo.success_value`` reaches the advantage wrappers and their hint-row rules.

The wrappers tell correct from wrong with :func:`treetune_recipe.cpo.methods.advantage_terms.succeeded`, the definition
the difficulty mask, the teacher contexts, the credit dump and the metrics use, and read the reward of a correct
response from their ``cfg``: the ``CPOConfig`` the loss, the credit dump and the trainer's hint-row selection pass. So
rewards of ±0.5 with ``success_value=0.5`` must shape exactly as rewards of ±1 with the default 1. Control: with 1 as
the reward of a correct response (the rule the wrappers had before, ``r == 1``), the ±0.5 rewards shape differently for
every method whose formula reads the reward.
"""

import pytest
import torch

from treetune_recipe.cpo.config import CPOConfig
from treetune_recipe.cpo.methods.registry import CPO_WRAPPERS, rows_reading_hint

#: Methods whose advantages and hint rows do not depend on the reward (no r condition in their formula).
REWARD_BLIND = {"naive", "mi_clamp_unify_difficulty", "rlsd", "opsd_token"}
#: Rewards of the rows: correct (+1), wrong (-1) and neither (0), in groups of every difficulty.
UNIT_REWARDS = (1.0, -1.0, 1.0, -1.0, 0.0, 1.0, -1.0, -1.0, 1.0, 1.0, -1.0, 0.0)
DIFFICULTY = (0.0, 0.0, 1.0, -1.0, -1.0, 0.0, 1.0, 0.0, 1.0, -1.0, 0.0, 0.0)


def inputs(seed: int = 0) -> dict:
    """One batch of wrapper inputs (``[12, 6]``, right-padded responses) without the rewards."""
    gen = torch.Generator().manual_seed(seed)
    rows, width = len(UNIT_REWARDS), 6
    mask = (torch.arange(width)[None] < torch.randint(2, width + 1, (rows,), generator=gen)[:, None]).float()
    old = -torch.rand(rows, width, generator=gen) * 3 * mask
    return dict(
        advantages=torch.randn(rows, 1, generator=gen) * mask,
        teacher_log_probs=(old + torch.randn(rows, width, generator=gen)).clamp(max=0) * mask,
        old_log_probs=old,
        entropy=torch.rand(rows, width, generator=gen) * 3 * mask,
        response_mask=mask,
        difficulty=torch.tensor(DIFFICULTY),
    )


def shaped(name: str, rewards: torch.Tensor, success_value: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages [B, T], hint rows bool [B])`` of method ``name`` with the trainer's own config type."""
    cfg = CPOConfig(method=name, pos_alpha=0.3, neg_alpha=0.5, success_value=success_value)
    batch = inputs()
    advantages = CPO_WRAPPERS[name](seq_rewards=rewards, cfg=cfg, **batch)
    hint_rows = rows_reading_hint(
        name, seq_rewards=rewards, difficulty=batch["difficulty"], cfg=cfg, advantages=batch["advantages"]
    )
    return advantages, hint_rows


@pytest.mark.parametrize("name", sorted(CPO_WRAPPERS))
def test_half_rewards_with_success_value_half_shape_as_unit_rewards(name):
    unit = shaped(name, torch.tensor(UNIT_REWARDS), 1.0)
    half = shaped(name, 0.5 * torch.tensor(UNIT_REWARDS), 0.5)
    torch.testing.assert_close(half[0], unit[0], rtol=0, atol=0)
    assert torch.equal(half[1], unit[1])
    # Control: the reward of a correct response taken as 1 whatever the config says (the wrappers' old r == 1).
    old_rule = shaped(name, 0.5 * torch.tensor(UNIT_REWARDS), 1.0)
    if name in REWARD_BLIND:
        torch.testing.assert_close(old_rule[0], unit[0], rtol=0, atol=0)
    else:
        with pytest.raises(AssertionError):
            torch.testing.assert_close(old_rule[0], unit[0], rtol=0, atol=0)


def test_the_control_also_changes_hint_rows():
    """The hint-row rules read ``success_value`` too: under the old rule some method selects other rows."""
    changed = [
        name
        for name in sorted(set(CPO_WRAPPERS) - REWARD_BLIND)
        if not torch.equal(
            shaped(name, 0.5 * torch.tensor(UNIT_REWARDS), 1.0)[1], shaped(name, torch.tensor(UNIT_REWARDS), 1.0)[1]
        )
    ]
    assert "seq_kl" in changed and "mi3" in changed, changed
