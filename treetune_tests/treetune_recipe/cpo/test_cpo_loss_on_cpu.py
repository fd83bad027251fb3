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
"""cpo_ppo_loss on verl 0.7.1 engine-format micro-batches equals upstream ppo_loss on pre-shaped inputs.

The batch is built the way ``RayPPOTrainer._update_actor`` builds it (DataProto -> ``to_tensordict`` ->
``left_right_2_no_padding`` -> non-tensor flags), the engine's per-batch keys are added as in
``forward_backward_batch``, and micro-batches come from verl's own ``prepare_micro_batches``. The actor config is
verl's ``ppo_trainer.yaml`` actor section composed with Hydra. The expected entropy ``[B, T]`` is sliced by hand
from the per-row model outputs (response token t is predicted at sequence position prompt_len + t - 1).
"""

import functools
import pickle
import types

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_module
from verl import DataProto
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.metric import Metric
from verl.workers.engine.utils import prepare_micro_batches
from verl.workers.utils.losses import ppo_loss
from verl.workers.utils.padding import left_right_2_no_padding

from treetune_recipe.cpo.config import CPOConfig
from treetune_recipe.cpo.methods.core_algos import apply_loss_position
from treetune_recipe.cpo.methods.loss import cpo_ppo_loss
from treetune_recipe.cpo.methods.registry import get_cpo_wrapper

PROMPT_WIDTH, RESPONSE_WIDTH, BATCH = 5, 7, 8


pytestmark = pytest.mark.usefixtures("verl_pad_helpers")  # left_right_2_no_padding unpads with them


@pytest.fixture(scope="module")
def actor_config_factory():
    """Fresh actor configs from verl's ppo_trainer.yaml (``ppo_loss`` writes into ``global_batch_info``)."""
    overrides = [
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.kl_loss_coef=0.1",
        "actor_rollout_ref.actor.entropy_coeff=0.01",
    ]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        actor_section = compose(config_name="ppo_trainer", overrides=overrides).actor_rollout_ref.actor
    return lambda: omega_conf_to_dataclass(actor_section)


def build_engine_batch(seed: int = 0):
    """An engine-format TensorDict with the CPO keys, plus per-row model outputs (log-prob leaves, entropies)."""
    gen = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(2, PROMPT_WIDTH + 1, (BATCH,), generator=gen)
    response_lens = torch.randint(1, RESPONSE_WIDTH + 1, (BATCH,), generator=gen)
    response_lens[3] = RESPONSE_WIDTH
    positions_p, positions_r = torch.arange(PROMPT_WIDTH), torch.arange(RESPONSE_WIDTH)
    prompt_mask = (positions_p[None, :] >= PROMPT_WIDTH - prompt_lens[:, None]).long()  # left padded
    response_mask = (positions_r[None, :] < response_lens[:, None]).long()  # right padded
    attention_mask = torch.cat([prompt_mask, response_mask], dim=-1)
    prompts = torch.randint(10, 100, (BATCH, PROMPT_WIDTH), generator=gen) * prompt_mask
    responses = torch.randint(10, 100, (BATCH, RESPONSE_WIDTH), generator=gen) * response_mask
    position_ids = torch.clip(attention_mask.cumsum(-1) - 1, min=0)

    mask = response_mask.float()
    seq_rewards = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0, -1.0, 1.0, 1.0])
    token_level_rewards = torch.zeros(BATCH, RESPONSE_WIDTH)
    token_level_rewards[torch.arange(BATCH), response_lens - 1] = seq_rewards
    old_log_probs = -torch.rand(BATCH, RESPONSE_WIDTH, generator=gen) * 3 * mask
    teacher_log_probs = (old_log_probs + torch.randn(BATCH, RESPONSE_WIDTH, generator=gen)).clamp(max=0) * mask
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=-1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": response_mask,
        "old_log_probs": old_log_probs,
        "ref_log_prob": old_log_probs + 0.1 * torch.randn(BATCH, RESPONSE_WIDTH, generator=gen) * mask,
        "advantages": torch.randn(BATCH, 1, generator=gen) * mask,
        "token_level_rewards": token_level_rewards,
        "teacher_log_probs": teacher_log_probs,
        "seq_rewards": seq_rewards,
        "difficulty": torch.tensor([0.0, 0.0, 1.0, -1.0, -1.0, 0.0, 1.0, 0.0]),
    }
    uids = np.array(["a", "a", "b", "c", "c", "d", "b", "d"], dtype=object)
    batch = DataProto.from_dict(tensors=tensors, non_tensors={"uid": uids}, meta_info={"temperature": 1.0})

    # As RayPPOTrainer._update_actor (engine path) and FSDPEngine.forward_backward_batch, verl 0.7.1.
    data = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(
        data,
        calculate_entropy=True,
        global_batch_size=BATCH,
        use_dynamic_bsz=True,
        max_token_len_per_gpu=3 * (PROMPT_WIDTH + RESPONSE_WIDTH),
        use_remove_padding=True,
        sp_size=1,
        batch_num_tokens=int(response_mask.sum()),
        dp_size=1,
    )

    seq_lens = (prompt_lens + response_lens).tolist()
    log_prob_rows = [(-torch.rand(n, generator=gen) * 2).requires_grad_() for n in seq_lens]
    entropy_rows = [torch.rand(n, generator=gen) * 3 for n in seq_lens]
    # Response token t of row i is scored at sequence position prompt_len_i + t - 1 (next-token prediction).
    padded_entropy = torch.zeros(BATCH, RESPONSE_WIDTH)
    for i in range(BATCH):
        p, r = int(prompt_lens[i]), int(response_lens[i])
        padded_entropy[i, :r] = entropy_rows[i][p - 1 : p + r - 1]
    return types.SimpleNamespace(
        data=data, log_prob_rows=log_prob_rows, entropy_rows=entropy_rows, padded_entropy=padded_entropy
    )


def model_output_for(batch, rows, micro_batch, with_entropy=True) -> dict:
    offsets = micro_batch["input_ids"].offsets()
    output = {
        "log_probs": torch.nested.nested_tensor_from_jagged(torch.cat([batch.log_prob_rows[i] for i in rows]), offsets)
    }
    if with_entropy:
        output["entropy"] = torch.nested.nested_tensor_from_jagged(
            torch.cat([batch.entropy_rows[i] for i in rows]), offsets
        )
    return output


def shaped_inputs(batch, cpo) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and loss mask computed directly on the full padded batch (the expectation's inputs)."""
    data, entropy = batch.data, batch.padded_entropy
    advantages = get_cpo_wrapper(cpo.method)(
        data["advantages"],
        teacher_log_probs=data["teacher_log_probs"],
        old_log_probs=data["old_log_probs"],
        entropy=entropy,
        response_mask=data["response_mask"],
        seq_rewards=data["seq_rewards"],
        difficulty=data["difficulty"],
        cfg=cpo,
    )
    return advantages, apply_loss_position(data["response_mask"], entropy, cpo.loss_position)


def _grads(batch) -> list[torch.Tensor]:
    grads = [row.grad.clone() for row in batch.log_prob_rows]
    for row in batch.log_prob_rows:
        row.grad = None
    return grads


@pytest.mark.parametrize(
    "cpo",
    [
        CPOConfig(),  # seq_kl, the reference main run
        CPOConfig(method="mi3", pos_alpha=0.3, neg_alpha=0.5, loss_position="entropy"),
        CPOConfig(method="naive_qwen3", pos_alpha=0.3, neg_alpha=0.5, cpo_lambda=1.5, loss_position="first_seq"),
    ],
    ids=["seq_kl-all", "mi3-entropy", "naive_qwen3-first_seq"],
)
def test_whole_batch_equals_ppo_loss_on_preshaped_inputs(actor_config_factory, cpo):
    batch = build_engine_batch()
    data, rows = batch.data, list(range(BATCH))
    original_advantages, original_mask = data["advantages"].clone(), data["response_mask"].clone()

    loss, metrics = cpo_ppo_loss(actor_config_factory(), model_output_for(batch, rows, data), data, cpo=cpo)
    loss.backward()
    grads = _grads(batch)

    advantages, loss_mask = shaped_inputs(batch, cpo)
    assert not torch.equal(advantages, original_advantages)  # the shaping does something on this batch
    expected_data = data.copy()
    expected_data["advantages"], expected_data["response_mask"] = advantages, loss_mask
    expected_loss, expected_metrics = ppo_loss(
        actor_config_factory(), model_output_for(batch, rows, data), expected_data
    )
    expected_loss.backward()

    torch.testing.assert_close(loss, expected_loss)
    for got, want in zip(grads, _grads(batch), strict=True):
        torch.testing.assert_close(got, want)
    assert any(g.abs().sum() > 0 for g in grads)
    assert set(expected_metrics) < set(metrics)
    # the caller's micro-batch is untouched
    assert torch.equal(data["advantages"], original_advantages)
    assert torch.equal(data["response_mask"], original_mask)


def test_cpo_metrics_values(actor_config_factory):
    cpo = CPOConfig(method="mi2", pos_alpha=0.3, neg_alpha=0.5, loss_position="first_seq")
    batch = build_engine_batch(seed=1)
    data = batch.data
    _, metrics = cpo_ppo_loss(actor_config_factory(), model_output_for(batch, range(BATCH), data), data, cpo=cpo)
    values = {key: metric.aggregate() for key, metric in metrics.items() if key.startswith("cpo/")}

    advantages, loss_mask = shaped_inputs(batch, cpo)
    valid = data["response_mask"].bool()
    correct = valid & (data["seq_rewards"] == 1)[:, None]
    wrong = valid & ~correct
    full_delta = advantages - data["advantages"]
    delta = full_delta[valid]
    expected = {
        "cpo/adv_delta_mean": delta.mean(),
        "cpo/adv_delta_absmean": delta.abs().mean(),
        "cpo/adv_delta_absmean/correct": full_delta[correct].abs().mean(),
        "cpo/adv_delta_absmean/wrong": full_delta[wrong].abs().mean(),
        "cpo/changed_token_frac": (delta != 0).float().mean(),
        "cpo/loss_token_frac": loss_mask.sum() / valid.sum(),
    }
    assert set(values) == set(expected)
    for key, value in expected.items():
        assert values[key] == pytest.approx(value.item(), abs=1e-6), key
    assert all(isinstance(metrics[key], Metric) for key in expected)


@pytest.mark.parametrize("loss_position", ["all", "first_seq", "entropy_valid"])
def test_dynamic_bsz_micro_batches_with_permuted_rows(actor_config_factory, loss_position):
    cpo = CPOConfig(method="tok_kl", pos_alpha=0.3, neg_alpha=0.5, loss_position=loss_position)
    batch = build_engine_batch(seed=2)
    micro_batches, indices = prepare_micro_batches(batch.data)
    assert len(micro_batches) > 1
    assert [i for idx in indices for i in idx] != list(range(BATCH))  # rows are reordered

    advantages, loss_mask = shaped_inputs(batch, cpo)
    total, expected_total = 0.0, 0.0
    for micro_batch, rows in zip(micro_batches, indices, strict=True):
        loss, _ = cpo_ppo_loss(actor_config_factory(), model_output_for(batch, rows, micro_batch), micro_batch, cpo=cpo)
        loss.backward()
        total += loss.item()
    grads = _grads(batch)
    for micro_batch, rows in zip(micro_batches, indices, strict=True):
        expected_data = micro_batch.copy()
        expected_data["advantages"], expected_data["response_mask"] = advantages[rows], loss_mask[rows]
        expected_loss, _ = ppo_loss(actor_config_factory(), model_output_for(batch, rows, micro_batch), expected_data)
        expected_loss.backward()
        expected_total += expected_loss.item()

    assert total == pytest.approx(expected_total, abs=1e-6)
    for got, want in zip(grads, _grads(batch), strict=True):
        torch.testing.assert_close(got, want)


def test_picklable_partial_as_installed_by_set_loss_fn(actor_config_factory):
    loss_fn = functools.partial(cpo_ppo_loss, config=actor_config_factory(), cpo=CPOConfig(method="mi"))
    restored = pickle.loads(pickle.dumps(loss_fn))
    batch = build_engine_batch(seed=3)
    output = model_output_for(batch, range(BATCH), batch.data)
    loss, _ = restored(model_output=output, data=batch.data, dp_group=None)  # the engine's call convention
    assert torch.isfinite(loss)


def test_missing_entropy_says_it_must_be_requested(actor_config_factory):
    batch = build_engine_batch()
    output = model_output_for(batch, range(BATCH), batch.data, with_entropy=False)
    with pytest.raises(ValueError, match="calculate_entropy=True"):
        cpo_ppo_loss(actor_config_factory(), output, batch.data, cpo=CPOConfig())


def test_missing_teacher_log_probs_is_named(actor_config_factory):
    batch = build_engine_batch()
    data = batch.data.copy()
    del data["teacher_log_probs"]
    with pytest.raises(KeyError, match="teacher_log_probs"):
        cpo_ppo_loss(actor_config_factory(), model_output_for(batch, range(BATCH), data), data, cpo=CPOConfig())
