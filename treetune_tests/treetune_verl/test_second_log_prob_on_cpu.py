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
"""``treetune_verl.rescoring.score_batch`` against in-process worker groups and verl's own ``_get_dp_size`` and
``_balance_batch``: which worker scores, the request it gets, and the scores back in the caller's row order."""

from __future__ import annotations

import copy

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils import tensordict_utils as tu

from treetune_verl.rescoring import score_batch


@pytest.fixture(autouse=True)
def verl_pad_helpers():
    """verl's pad/unpad helpers as every treetune Ray process has them (flash-attn's, else verl's pure-torch ones)."""
    import treetune_verl.verl_runtime  # noqa: F401  (applies the swap on import)


def row_scores(input_ids: torch.Tensor) -> torch.Tensor:
    """A stand-in model: the score at position j is a function of the row's tokens up to j+1 only: [L] -> [L]."""
    prefix = torch.cumsum((input_ids * 7919) % 1009, dim=0)
    return -(((prefix * 31 + torch.roll(input_ids, -1)) % 97).float() + 1.0) / 40.0


class FakeGroup:
    """A worker group of ``dp_size`` ranks on ``mesh``: refuses what verl's dispatch and micro-batching refuse."""

    def __init__(self, mesh: str, dp_size: int, micro_batch_size: int | None):
        self._dispatch_info = {mesh: list(range(dp_size))}
        self.dp_size, self.micro_batch_size = dp_size, micro_batch_size
        self.requests: list[TensorDict] = []

    def compute_log_prob(self, data: TensorDict) -> TensorDict:
        assert len(data) % self.dp_size == 0, "rows must split evenly over the DP ranks"
        if self.micro_batch_size is not None:
            assert len(data) // self.dp_size % self.micro_batch_size == 0, "fixed micro-batches must divide a rank"
        self.requests.append(data)
        per_row = [row_scores(ids) for ids in data["input_ids"].unbind()]
        outputs = {"log_probs": torch.nested.as_nested_tensor(per_row, layout=torch.jagged)}
        if tu.get(data, "calculate_entropy"):
            outputs["entropy"] = torch.nested.as_nested_tensor([-x for x in per_row], layout=torch.jagged)
        return tu.get_tensordict(outputs, non_tensor_dict={"metrics": {"mfu": 0.0}})

    compute_ref_log_prob = compute_log_prob


class StandInTrainer:
    """What ``score_batch`` reads of a ``RayPPOTrainer``, with verl's own DP-size query and balancing."""

    _get_dp_size = RayPPOTrainer._get_dp_size
    _balance_batch = RayPPOTrainer._balance_batch

    def __init__(self, *, dp_size=2, dynamic=False, micro=2, ref_micro=3, ref_offload=True, ref_in_actor=False):
        self.config = OmegaConf.create(
            {
                "trainer": {"balance_batch": True},
                "actor_rollout_ref": {
                    "actor": {"use_dynamic_bsz": dynamic, "strategy": "fsdp2", "fsdp_config": {"param_offload": False}},
                    "rollout": {"log_prob_micro_batch_size_per_gpu": micro},
                    "ref": {
                        "log_prob_use_dynamic_bsz": False,
                        "log_prob_micro_batch_size_per_gpu": ref_micro,
                        "strategy": "fsdp2",
                        "fsdp_config": {"param_offload": ref_offload},
                    },
                },
            }
        )
        self.actor_rollout_wg = FakeGroup("actor", dp_size, None if dynamic else micro)
        self.ref_in_actor = ref_in_actor
        self.ref_policy_wg = None if ref_in_actor else FakeGroup("ref", dp_size, ref_micro)


def make_batch(rows: int = 7, prompt_width: int = 6, response_width: int = 5) -> DataProto:
    """Rows of different lengths in verl's padded layout (left-padded prompts, right-padded responses)."""
    generator = torch.Generator().manual_seed(0)
    prompt_lengths = [2 + (3 * row) % (prompt_width - 1) for row in range(rows)]
    response_lengths = [1 + (2 * row) % response_width for row in range(rows)]
    prompts = torch.zeros(rows, prompt_width, dtype=torch.long)
    responses = torch.zeros(rows, response_width, dtype=torch.long)
    attention = torch.zeros(rows, prompt_width + response_width, dtype=torch.long)
    for row, (p, r) in enumerate(zip(prompt_lengths, response_lengths, strict=True)):
        prompts[row, prompt_width - p :] = torch.randint(3, 200, (p,), generator=generator)
        responses[row, :r] = torch.randint(3, 200, (r,), generator=generator)
        attention[row, prompt_width - p : prompt_width + r] = 1
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention,
            "position_ids": position_ids,
            "response_mask": attention[:, prompt_width:],
        },
        meta_info={"temperature": 1.0},
    )


def expected_scores(batch: DataProto, sign: float = 1.0) -> torch.Tensor:
    """The stand-in model's scores of each response token, computed row by row without verl: [N, T]."""
    prompt_width, response_width = batch.batch["prompts"].shape[1], batch.batch["responses"].shape[1]
    out = torch.zeros(len(batch), response_width)
    for row in range(len(batch)):
        valid = batch.batch["attention_mask"][row].bool()
        ids = batch.batch["input_ids"][row][valid]
        first = int((~valid[:prompt_width]).sum())  # left padding
        prompt_length = prompt_width - first
        scores = sign * row_scores(ids)
        length = int(batch.batch["response_mask"][row].sum())
        out[row, :length] = scores[prompt_length - 1 : prompt_length - 1 + length]
    return out


@pytest.mark.parametrize(("dynamic", "sent_rows"), [(False, 8), (True, 6)])
def test_the_actor_scores_the_rows_in_the_callers_order_after_padding_and_balancing(dynamic, sent_rows):
    trainer, batch = StandInTrainer(dynamic=dynamic), make_batch(rows=5)
    before = copy.deepcopy(batch)
    scores = score_batch(trainer, batch, on="actor")
    mask = batch.batch["response_mask"].bool()
    torch.testing.assert_close(scores.log_probs[mask], expected_scores(batch)[mask], rtol=0, atol=0)
    assert scores.entropy is None and scores.log_probs.shape == batch.batch["responses"].shape
    (request,) = trainer.actor_rollout_wg.requests
    # 5 rows padded with repeats of the first ones to DP 2 (times the micro-batch 2 without dynamic batch size).
    assert len(request) == sent_rows
    # Control: balancing did reorder the rows sent, so the comparison above checks the way back.
    padded_order = [*range(5), *range(sent_rows - 5)]
    plain = [batch.batch["input_ids"][row][batch.batch["attention_mask"][row].bool()] for row in padded_order]
    sent = list(request["input_ids"].unbind())
    assert [ids.tolist() for ids in sent] != [ids.tolist() for ids in plain]
    assert sorted(ids.tolist() for ids in sent) == sorted(ids.tolist() for ids in plain)
    # The caller's batch is untouched (balancing works in place on verl's side).
    for key in before.batch.keys():
        torch.testing.assert_close(batch.batch[key], before.batch[key], rtol=0, atol=0)
    flags = {key: tu.get(request, key) for key in ("calculate_entropy", "calculate_sum_pi_squared", "compute_loss")}
    assert flags == {"calculate_entropy": False, "calculate_sum_pi_squared": False, "compute_loss": False}
    assert tu.get(request, "disable_auto_offload") is True  # resident parameters: no offload switch
    assert tu.get(request, "temperature") == 1.0  # meta_info travels with the request


def test_the_entropy_comes_back_only_when_asked_for():
    trainer, batch = StandInTrainer(), make_batch()
    scores = score_batch(trainer, batch, on="actor", entropy=True)
    mask = batch.batch["response_mask"].bool()
    torch.testing.assert_close(scores.entropy[mask], expected_scores(batch, sign=-1.0)[mask], rtol=0, atol=0)
    assert tu.get(trainer.actor_rollout_wg.requests[-1], "calculate_entropy") is True


def test_the_reference_scores_with_its_own_worker_and_knobs_or_the_actor_without_its_adapter():
    trainer, batch = StandInTrainer(micro=2, ref_micro=3), make_batch()
    scores = score_batch(trainer, batch, on="reference")
    (request,) = trainer.ref_policy_wg.requests
    assert trainer.actor_rollout_wg.requests == []
    assert len(request) == 12  # 7 rows padded to DP 2 x the reference's micro-batch 3
    assert "disable_auto_offload" not in request.keys()  # the reference offloads its parameters: keep the switch
    assert "no_lora_adapter" not in request.keys()
    mask = batch.batch["response_mask"].bool()
    torch.testing.assert_close(scores.log_probs[mask], expected_scores(batch)[mask], rtol=0, atol=0)
    # With LoRA the reference is the actor without its adapter, with the actor's knobs, as verl's reference pass.
    lora = StandInTrainer(ref_in_actor=True)
    score_batch(lora, batch, on="reference")
    (request,) = lora.actor_rollout_wg.requests
    assert tu.get(request, "no_lora_adapter") is True and len(request) == 8
    with pytest.raises(ValueError, match="valid values: actor, reference"):
        score_batch(trainer, batch, on="critic")
