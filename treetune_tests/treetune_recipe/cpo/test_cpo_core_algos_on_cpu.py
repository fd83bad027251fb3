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
"""The ``cpo`` advantage estimator registered by :mod:`treetune_recipe.cpo.methods.core_algos`.

The difficulty mask and the ``loss_position`` masks of the same module have their own files
(``test_difficulty_mask_on_cpu.py``, ``test_loss_position_on_cpu.py``).
"""

import importlib

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo import core_algos as verl_core_algos

from treetune_recipe.cpo.methods import core_algos


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_cpo_estimator_is_grpo_outcome_advantage(norm_by_std):
    rewards = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, 0.5])
    uids = np.array(["a", "a", "a", "b", "b", "c"], dtype=object)
    mask = torch.ones(6, 3)
    mask[0, 2] = 0
    token_level_rewards = torch.zeros(6, 3)
    token_level_rewards[torch.arange(6), mask.sum(-1).long() - 1] = rewards
    config = OmegaConf.create({"adv_estimator": "cpo", "norm_adv_by_std_in_grpo": norm_by_std})
    # Same kwargs as verl 0.7.1's compute_advantage generic branch.
    estimator = verl_core_algos.get_adv_estimator_fn("cpo")
    advantages, returns = estimator(
        token_level_rewards=token_level_rewards, response_mask=mask, config=config, index=uids
    )

    # By hand: group a = (1, -1, -1): mean -1/3, unbiased std 2/sqrt(3); b: all equal; c: singleton (mean 0, std 1).
    centred = torch.tensor([4 / 3, -2 / 3, -2 / 3, 0.0, 0.0, 0.5])
    std = torch.tensor([2 / 3**0.5] * 3 + [0.0, 0.0, 1.0])
    expected = centred / (std + 1e-6) if norm_by_std else centred
    torch.testing.assert_close(advantages, expected[:, None] * mask)
    torch.testing.assert_close(returns, advantages)


def test_estimator_registration_is_idempotent_and_refuses_a_foreign_cpo(monkeypatch):
    registered = verl_core_algos.get_adv_estimator_fn("cpo")
    reloaded = importlib.reload(core_algos)  # a second import of the module must not crash
    assert verl_core_algos.get_adv_estimator_fn("cpo") is registered

    monkeypatch.setitem(verl_core_algos.ADV_ESTIMATOR_REGISTRY, "cpo", lambda **_: None)
    with pytest.raises(ValueError, match="already registered"):
        reloaded._register_cpo_adv_estimator()
