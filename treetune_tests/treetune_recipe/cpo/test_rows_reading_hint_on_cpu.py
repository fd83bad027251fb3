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
"""``rows_reading_hint``: which rows of a batch read ``teacher_log_probs``, proved on every wrapper x α grid x batch.

Two properties, checked by calling the real wrappers:

* **sound**: overwriting ``teacher_log_probs`` on the rows *not* selected leaves the wrapper's output bit-for-bit
  unchanged (any advantages, any log-probs);
* **tight**: on every selected row with at least two valid tokens, some value of ``teacher_log_probs`` changes the
  output, for advantages with the sign GRPO gives them (> 0 on correct responses, < 0 otherwise). The selection
  only sees (r, D, α, λ), so this is the least it can select: it is not "every row" where the formula reads fewer.
"""

import itertools
import types

import pytest
import torch

from treetune_recipe.cpo.methods.registry import CPO_WRAPPERS, rows_reading_hint
from treetune_recipe.cpo.methods.rlsd import RLSDKnobs

ALPHAS = (0.0, None, 0.4, -0.3)
CONFIGS = [
    types.SimpleNamespace(cpo_lambda=cpo_lambda, pos_alpha=pos_alpha, neg_alpha=neg_alpha, rlsd=RLSDKnobs())
    for cpo_lambda, pos_alpha, neg_alpha in itertools.product((1.5, 3.0), ALPHAS, ALPHAS)
]
SEEDS = (0, 1, 2)
ROWS, WIDTH = 24, 7


def random_batch(seed: int, grpo_signs: bool) -> dict:
    """Ragged rows (row 0 fully padded, the others 2..WIDTH valid tokens), rewards in {1, -1, 0, -0.6, 0.5}.

    Old log-probs lie in (-2, -0.05), where every ratio set of the naive wrappers can be entered by changing g.
    ``grpo_signs``: advantages > 0 on r = 1 and < 0 otherwise (else any sign).
    """
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, WIDTH + 1, (ROWS,), generator=gen)
    lengths[0] = 0
    mask = (torch.arange(WIDTH)[None, :] < lengths[:, None]).float()
    rewards = torch.tensor([1.0, -1.0, 0.0, -0.6, 0.5])[torch.randint(0, 5, (ROWS,), generator=gen)]
    rewards[1:4] = torch.tensor([1.0, -1.0, 0.5])  # every kind of response at least once
    difficulty = torch.tensor([-1.0, 0.0, 1.0])[torch.randint(0, 3, (ROWS,), generator=gen)]
    scale = torch.rand(ROWS, 1, generator=gen) + 0.1
    if grpo_signs:
        advantages = torch.where(rewards[:, None] == 1, scale, -scale)
    else:  # any sign, and 0 on about a third of the rows
        advantages = scale * torch.randn(ROWS, 1, generator=gen).sign() * (torch.rand(ROWS, 1, generator=gen) > 0.3)
    old = -(torch.rand(ROWS, WIDTH, generator=gen) * 1.95 + 0.05)
    gw = (old + torch.randn(ROWS, WIDTH, generator=gen)).clamp(max=0)
    entropy = torch.rand(ROWS, WIDTH, generator=gen) * 3 + 0.01
    return dict(
        advantages=advantages * mask,
        teacher_log_probs=gw,
        old_log_probs=old,
        entropy=entropy,
        response_mask=mask,
        seq_rewards=rewards,
        difficulty=difficulty,
    )


def gw_variants(batch: dict, seed: int) -> list[torch.Tensor]:
    """Values of g to try: δ = +3, δ = -3, δ = 0 and two random draws (log-probs and beyond the ±10 clamp)."""
    old = batch["old_log_probs"]
    gen = torch.Generator().manual_seed(1000 + seed)
    return [
        old + 3.0,
        old - 3.0,
        old.clone(),
        -torch.rand(old.shape, generator=gen) * 5,
        old + 12 * torch.randn(old.shape, generator=gen),
    ]


def shaped(name: str, batch: dict, cfg, gw: torch.Tensor) -> torch.Tensor:
    return CPO_WRAPPERS[name](cfg=cfg, **{**batch, "teacher_log_probs": gw})


def selection(name: str, batch: dict, cfg) -> torch.Tensor:
    rows = rows_reading_hint(
        name, seq_rewards=batch["seq_rewards"], difficulty=batch["difficulty"], cfg=cfg, advantages=batch["advantages"]
    )
    assert rows.dtype == torch.bool and rows.shape == (ROWS,)
    return rows


@pytest.mark.parametrize("name", sorted(CPO_WRAPPERS))
def test_gw_on_rows_not_selected_never_changes_the_output(name):
    for seed, cfg in itertools.product(SEEDS, CONFIGS):
        batch = random_batch(seed, grpo_signs=False)
        reads = selection(name, batch, cfg)
        expected = shaped(name, batch, cfg, batch["teacher_log_probs"])
        for variant in gw_variants(batch, seed):
            gw = torch.where(reads[:, None], batch["teacher_log_probs"], variant)
            assert torch.equal(shaped(name, batch, cfg, gw), expected), (name, seed, cfg)


@pytest.mark.parametrize("name", sorted(CPO_WRAPPERS))
def test_every_selected_row_reads_gw(name):
    selected_somewhere = False
    for seed, cfg in itertools.product(SEEDS, CONFIGS):
        batch = random_batch(seed, grpo_signs=True)
        reads = selection(name, batch, cfg)
        reference = shaped(name, batch, cfg, batch["teacher_log_probs"])
        changed = torch.zeros(ROWS, dtype=torch.bool)
        for variant in gw_variants(batch, seed):
            changed |= (shaped(name, batch, cfg, variant) != reference).any(dim=-1)
        has_tokens = batch["response_mask"].sum(dim=-1) >= 2
        unread = reads & has_tokens & ~changed
        assert not unread.any(), (name, seed, cfg, unread.nonzero().flatten().tolist())
        assert not (changed & ~reads).any()  # the soundness of the other test, seen from here
        selected_somewhere |= bool(reads.any())
    assert selected_somewhere, name


#: Wrappers without α: the privileged-context peers, whose formulas read δ on their own terms.
WITHOUT_ALPHAS = ("rlsd", "opsd_token")


def test_no_row_reads_gw_when_both_alphas_are_off():
    batch = random_batch(0, grpo_signs=True)
    with_alphas = [name for name in CPO_WRAPPERS if name not in WITHOUT_ALPHAS]
    for name, alphas in itertools.product(with_alphas, [(0.0, 0.0), (None, None), (0.0, None)]):
        cfg = types.SimpleNamespace(cpo_lambda=2.0, pos_alpha=alphas[0], neg_alpha=alphas[1])
        assert not selection(name, batch, cfg).any(), (name, alphas)


def test_rlsd_reads_gw_where_the_advantage_is_not_zero_and_opsd_token_everywhere():
    batch = random_batch(0, grpo_signs=True)
    batch["advantages"] = batch["advantages"] * (batch["difficulty"][:, None] == 0)  # GRPO's A with equal ±1 rewards
    cfg = CONFIGS[0]
    has_tokens = batch["response_mask"].sum(dim=-1) > 0
    assert torch.equal(selection("rlsd", batch, cfg), (batch["difficulty"] == 0) & has_tokens)
    assert selection("opsd_token", batch, cfg).all()
    with pytest.raises(ValueError, match="pass advantages= to rows_reading_hint"):
        rows_reading_hint("rlsd", seq_rewards=batch["seq_rewards"], difficulty=batch["difficulty"], cfg=cfg)


def test_default_seq_kl_reads_gw_on_wrong_responses_only_and_negonly_in_all_wrong_groups():
    batch = random_batch(0, grpo_signs=True)
    cfg = types.SimpleNamespace(cpo_lambda=2.0, pos_alpha=0.0, neg_alpha=1.0)  # the recipe's defaults
    assert torch.equal(selection("seq_kl", batch, cfg), batch["seq_rewards"] != 1)
    expected = (batch["seq_rewards"] != 1) & (batch["difficulty"] == -1)
    assert torch.equal(selection("negonly_seq_kl", batch, cfg), expected)


def test_unknown_wrapper_is_a_clear_error():
    with pytest.raises(ValueError, match="Unknown cpo.method 'seqkl'"):
        rows_reading_hint("seqkl", seq_rewards=torch.ones(2), difficulty=torch.zeros(2), cfg=CONFIGS[0])
