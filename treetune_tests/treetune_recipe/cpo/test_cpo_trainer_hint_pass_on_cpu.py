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
"""``RayCPOTrainer``'s hint path (``_update_actor``) with ``cpo.hint.rescore=needed`` vs ``all`` on one fixed batch.

The trainer runs its real code (config composed from ``cpo_trainer.yaml``, verl's ``_compute_old_log_prob``,
``_balance_batch`` and ``_update_actor``) against an in-process actor worker group
(``treetune_tests/support/cpo_trainer.py``): its log-probs are a deterministic function of each row's own tokens (so
the hint prompt changes them and batch composition does not), it refuses a batch that verl's dispatch and
micro-batching would refuse, and it records every request.
"""

import copy

import pytest
import torch
from tensordict import NonTensorData, TensorDict
from verl import DataProto
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

from treetune_recipe.cpo.config import CPOConfig
from treetune_recipe.cpo.methods.advantage_terms import succeeded
from treetune_recipe.cpo.methods.registry import get_cpo_wrapper, rows_reading_hint
from treetune_recipe.cpo.teacher.contexts import build_sibling_batch, sibling_text
from treetune_recipe.cpo.teacher.hint import build_hint_batch
from treetune_recipe.cpo.teacher.sibling import choose_successful_siblings
from treetune_recipe.cpo.teacher.weights import Teacher
from treetune_recipe.cpo.trainer import ray_trainer
from treetune_tests.support.cpo_trainer import FakeActorGroup, fake_log_probs, make_trainer, rollout_batch
from treetune_tests.support.hint_batches import PROBLEMS, make_batch

LOSS_INPUTS = ("advantages", "old_log_probs", "response_mask", "seq_rewards", "difficulty", "teacher_log_probs")

pytestmark = pytest.mark.usefixtures("verl_pad_helpers")  # the trainer's passes unpad with them


def run_update(trainer, batch: DataProto, rescore: str):
    """One ``_update_actor`` call; returns (padded loss inputs sent to the update, logged metrics)."""
    trainer.hint_config = type(trainer.hint_config)(**{**trainer.hint_config.__dict__, "rescore": rescore})
    output = trainer._update_actor(copy.deepcopy(batch))
    sent = trainer.actor_rollout_wg.update_requests[-1]
    return {key: sent[key] for key in LOSS_INPUTS}, output.meta_info["metrics"]


def shaped_advantages(trainer, inputs: dict) -> torch.Tensor:
    """What the CPO loss computes from the loss inputs (with a fixed stand-in for the current-policy entropy)."""
    entropy = torch.linspace(0.1, 2.0, inputs["advantages"].shape[1]).expand_as(inputs["advantages"])
    wrapper = get_cpo_wrapper(trainer.cpo_config.method)
    return wrapper(
        inputs["advantages"],
        entropy=entropy,
        cfg=trainer.cpo_config,
        **{key: inputs[key] for key in LOSS_INPUTS if key != "advantages"},
    )


def teacher_rows(trainer, batch: DataProto, seq_rewards: torch.Tensor):
    """Every row's teacher batch under the run's context, built directly (``(teacher_batch, has_context, metrics)``)."""
    return trainer.cpo_config.teacher_context.build(
        batch,
        tokenizer=trainer.tokenizer,
        hint_config=trainer.hint_config,
        success=succeeded(seq_rewards, trainer.cpo_config.success_value),
        cpo=trainer.cpo_config,
    )


def expected_gw(trainer, batch: DataProto, seq_rewards: torch.Tensor) -> torch.Tensor:
    """teacher_log_probs of every row, computed directly: the fake actor on the full teacher batch, masked by the
    response (``old_log_probs`` on a row without a context)."""
    hint_batch, has_context, _ = teacher_rows(trainer, batch, seq_rewards)
    td = left_right_2_no_padding(hint_batch.to_tensordict())
    per_row = [fake_log_probs(ids) for ids in td["input_ids"].unbind()]
    log_probs = no_padding_2_padding(torch.nested.as_nested_tensor(per_row, layout=torch.jagged), td)
    return torch.where(has_context[:, None], log_probs * batch.batch["response_mask"], batch.batch["old_log_probs"])


SETUPS = {
    "dp1-fixed-micro": dict(dp_size=1, dynamic=False, micro_batch_size=2),
    "dp2-fixed-micro-balanced": dict(dp_size=2, dynamic=False, micro_batch_size=2),
    "dp2-dynamic-balanced": dict(dp_size=2, dynamic=True, micro_batch_size=2),
}
WRAPPERS = {
    "seq_kl-default": [],
    "negonly_mi3": ["cpo.method=negonly_mi3", "cpo.pos_alpha=0.3", "cpo.neg_alpha=0.5"],
    "mi_unify": ["cpo.method=mi_unify", "cpo.pos_alpha=0.2", "cpo.neg_alpha=0.5"],
    # (opsd_token reads every row: nothing for `needed` to leave out). The teacher does not choose the rows; the
    # policy teacher keeps the pass on the fake actor group (test_a_reference_teacher_... covers the reference).
    # RLSD's published context is the answer; the gold solution, a sibling: cpo.context.
    "rlsd": ["cpo.method=rlsd", "cpo.teacher=policy"],
    "rlsd-sibling": ["cpo.method=rlsd", "cpo.teacher=policy", "cpo.context=successful_sibling"],
}


@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_needed_and_all_give_identical_loss_inputs_and_shaped_advantages(monkeypatch, setup, wrapper):
    trainer = make_trainer(monkeypatch, *WRAPPERS[wrapper], **SETUPS[setup])
    batch = rollout_batch(trainer)
    old_log_probs = batch.batch["old_log_probs"]

    inputs_all, metrics_all = run_update(trainer, batch, "all")
    hint_rows_all = len(trainer.actor_rollout_wg.log_prob_requests[-1])
    inputs_needed, metrics_needed = run_update(trainer, batch, "needed")
    rows = rows_reading_hint(
        trainer.cpo_config.method,
        seq_rewards=inputs_all["seq_rewards"],
        difficulty=inputs_all["difficulty"],
        cfg=trainer.cpo_config,
        advantages=inputs_all["advantages"],
    )
    assert 0 < rows.sum() < len(rows)  # a real subset: the comparison below means something

    # The loss inputs, tensor by tensor: identical, except teacher_log_probs on the rows that never read them.
    for key in LOSS_INPUTS:
        if key == "teacher_log_probs":
            torch.testing.assert_close(inputs_needed[key][rows], inputs_all[key][rows], rtol=0, atol=0)
            torch.testing.assert_close(inputs_needed[key][~rows], old_log_probs[~rows], rtol=0, atol=0)
        else:
            torch.testing.assert_close(inputs_needed[key], inputs_all[key], rtol=0, atol=0, msg=key)
    torch.testing.assert_close(
        shaped_advantages(trainer, inputs_needed), shaped_advantages(trainer, inputs_all), rtol=0, atol=0
    )
    # The rows were scattered back where they belong (checked against a direct computation, not the trainer's).
    torch.testing.assert_close(
        inputs_all["teacher_log_probs"], expected_gw(trainer, batch, inputs_all["seq_rewards"]), rtol=0, atol=0
    )

    # Only the selected rows (plus the padding verl needs) went through the hinted pass.
    group = SETUPS[setup]["dp_size"] * (1 if SETUPS[setup]["dynamic"] else SETUPS[setup]["micro_batch_size"])
    hint_rows_needed = len(trainer.actor_rollout_wg.log_prob_requests[-1])
    assert hint_rows_all == len(rows)
    assert hint_rows_needed == -(-int(rows.sum()) // group) * group
    assert metrics_all["cpo/hint_rows_frac"] == 1.0
    assert metrics_needed["cpo/hint_rows_frac"] == pytest.approx(rows.float().mean().item())
    # Tokens scored under the hint over tokens of the old-log-prob pass (hint prompts are longer than plain ones).
    hint_tokens = teacher_rows(trainer, batch, inputs_all["seq_rewards"])[0].batch["attention_mask"].sum(-1)
    plain_tokens = batch.batch["attention_mask"].sum()
    assert metrics_all["cpo/hint_token_ratio"] == pytest.approx((hint_tokens.sum() / plain_tokens).item())
    assert metrics_needed["cpo/hint_token_ratio"] == pytest.approx((hint_tokens[rows].sum() / plain_tokens).item())
    assert metrics_needed["cpo/hint_token_ratio"] > metrics_needed["cpo/hint_rows_frac"]
    assert metrics_needed["timing_s/cpo_gw_log_prob"] > 0


def test_hinted_pass_sends_the_same_batching_flags_as_the_old_log_prob_pass(monkeypatch):
    trainer = make_trainer(monkeypatch, dp_size=2, dynamic=True)
    assert trainer.config.actor_rollout_ref.actor.fsdp_config.param_offload is False
    batch = make_batch(trainer.tokenizer, PROBLEMS, n=4, seed=3)
    trainer._compute_old_log_prob(batch)
    plain = trainer.actor_rollout_wg.log_prob_requests[-1]
    trainer._score_hint_batch(build_hint_batch(batch, trainer.tokenizer, trainer.hint_config)[0])
    hinted = trainer.actor_rollout_wg.log_prob_requests[-1]

    def flags(td):  # batch-wide settings (not per-row data)
        return {key: tu.get(td, key) for key in td.keys() if isinstance(td.get(key), NonTensorData)}

    ignore = {"max_seq_len", "indices", "global_token_num"}  # widths and token counts of each batch
    assert {"calculate_entropy", "compute_loss", "temperature"} <= set(flags(hinted))
    assert flags(plain)["calculate_entropy"] is True
    # The differences: CPO reads the entropy of the plain pass only, needs no sum of squared probabilities (verl
    # 0.9.1 asks for it in the plain pass when configured), and with resident parameters the hinted pass skips the
    # engine's offload switch.
    assert {k: v for k, v in flags(hinted).items() if k not in ignore} == {
        **{k: v for k, v in flags(plain).items() if k not in ignore},
        "calculate_entropy": False,
        "calculate_sum_pi_squared": False,
        "disable_auto_offload": True,
    }
    # No batching knob is set by the caller: the worker applies the actor's own (dynamic batch size, token budget).
    assert not {"use_dynamic_bsz", "max_token_len_per_gpu", "micro_batch_size_per_gpu"} & set(hinted.keys())


class FakeReferenceGroup(FakeActorGroup):
    """Stands in for the fused worker group's reference mesh: ``compute_ref_log_prob`` records like the actor's."""

    def __init__(self, dp_size: int, micro_batch_size: int | None):
        super().__init__(dp_size, micro_batch_size)
        self._dispatch_info = {"ref": list(range(dp_size))}

    def compute_ref_log_prob(self, data: TensorDict) -> TensorDict:
        return self.compute_log_prob(data)


@pytest.mark.parametrize("teacher", ["initial", "refreshed"])
def test_a_reference_teacher_scores_the_hint_batch_on_the_reference_worker(monkeypatch, teacher):
    trainer = make_trainer(
        monkeypatch,
        f"cpo.teacher={teacher}",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=3",
        "actor_rollout_ref.ref.fsdp_config.param_offload=true",
        dp_size=2,
    )
    trainer.ref_in_actor = False
    trainer.ref_policy_wg = FakeReferenceGroup(2, 3)
    hint_batch = build_hint_batch(rollout_batch(trainer), trainer.tokenizer, trainer.hint_config)[0]
    scored = trainer._score_hint_batch(hint_batch)
    (request,) = trainer.ref_policy_wg.log_prob_requests
    assert not trainer.actor_rollout_wg.log_prob_requests  # the actor is not asked
    assert len(request) % (2 * 3) == 0  # padded for the reference's DP size and its own micro-batch size
    assert "disable_auto_offload" not in request.keys()  # the reference offloads its parameters: keep the switch
    # Both fakes score with the same function: the reference's scores, unpadded and put back in row order, are
    # what the actor's pass gives.
    reference_teacher, trainer.teacher = trainer.teacher, Teacher(CPOConfig(teacher="policy").teacher_config)
    torch.testing.assert_close(scored, trainer._score_hint_batch(hint_batch))
    assert len(trainer.actor_rollout_wg.log_prob_requests) == 1
    trainer.teacher = reference_teacher
    # With the reference inside the actor (LoRA), the actor scores it without its adapter, as verl's reference pass.
    trainer.ref_in_actor, trainer.ref_policy_wg = True, None
    trainer._score_hint_batch(hint_batch)
    assert tu.get(trainer.actor_rollout_wg.log_prob_requests[-1], "no_lora_adapter") is True


def test_rlsd_installs_the_lambda_of_each_step_in_the_loss(monkeypatch):
    trainer = make_trainer(monkeypatch, "cpo.method=rlsd", "cpo.teacher=policy")
    batch = rollout_batch(trainer)
    for step, expected in ((1, 0.5 * 59 / 60), (30, 0.25), (75, 0.0)):  # λ_t = 0.5·max(0, 1 - t/60)
        trainer.global_steps = step
        metrics = trainer._update_actor(copy.deepcopy(batch)).meta_info["metrics"]
        installed = trainer.actor_rollout_wg.loss_fns[-1].keywords["cpo"]
        assert installed.rlsd.mix_lambda == pytest.approx(expected) == metrics["cpo/rlsd_lambda"]
    assert trainer.cpo_config.rlsd.mix_lambda == 0.5  # the run's own config is left as configured


def test_the_credit_dump_shapes_with_the_lambda_of_its_step(monkeypatch):
    trainer = make_trainer(monkeypatch, "cpo.method=rlsd", "cpo.teacher=policy", "cpo.credit_dump.steps=[30]")
    dumped = []
    monkeypatch.setattr(
        ray_trainer, "maybe_dump_credit", lambda trainer, batch, hint, cpo_config: dumped.append(cpo_config)
    )
    trainer.global_steps = 30
    trainer._update_actor(rollout_batch(trainer))
    assert [config.rlsd.mix_lambda for config in dumped] == [pytest.approx(0.25)]  # λ_30 = 0.5·(1 - 30/60), not 0.5


@pytest.mark.parametrize("estimator", ["grpo", "cpo"])
def test_every_estimator_logs_the_share_of_responses_in_all_wrong_and_all_correct_groups(monkeypatch, estimator):
    trainer = make_trainer(monkeypatch, f"algorithm.adv_estimator={estimator}")
    metrics = trainer._update_actor(rollout_batch(trainer)).meta_info["metrics"]
    # REWARDS by hand: one mixed group (2 of 4 correct), one all wrong (dense rewards, none equal to 1), one all
    # correct; 12 responses.
    assert metrics["cpo/group_all_wrong_frac"] == pytest.approx(4 / 12)
    assert metrics["cpo/group_all_correct_frac"] == pytest.approx(4 / 12)
    assert metrics["cpo/success_frac"] == pytest.approx(6 / 12)
    assert ("cpo/hint_rows_frac" in metrics) == (estimator == "cpo")  # GRPO runs no hinted pass


def test_a_step_where_no_row_reads_the_hint_skips_the_hinted_pass(monkeypatch):
    trainer = make_trainer(monkeypatch, "cpo.method=mi3", "cpo.pos_alpha=0.5", "cpo.neg_alpha=0.0")
    batch = rollout_batch(trainer)
    inputs, metrics = run_update(trainer, batch, "needed")
    assert trainer.actor_rollout_wg.log_prob_requests == []
    assert metrics["cpo/hint_rows_frac"] == 0.0
    assert "timing_s/cpo_gw_log_prob" not in metrics and "timing_s/cpo_hint_batch" not in metrics
    assert "cpo/gw_minus_old_mean" not in metrics  # no row was scored under a hint
    torch.testing.assert_close(inputs["teacher_log_probs"], batch.batch["old_log_probs"], rtol=0, atol=0)


def test_with_offloaded_parameters_the_hinted_pass_keeps_the_offload_switch(monkeypatch):
    trainer = make_trainer(monkeypatch, "actor_rollout_ref.actor.fsdp_config.param_offload=true")
    batch = make_batch(trainer.tokenizer, PROBLEMS, n=4, seed=3)
    trainer._score_hint_batch(build_hint_batch(batch, trainer.tokenizer, trainer.hint_config)[0])
    assert "disable_auto_offload" not in trainer.actor_rollout_wg.log_prob_requests[-1].keys()


@pytest.mark.parametrize("setup", ["dp2-fixed-micro-balanced", "dp2-dynamic-balanced"])
def test_the_hinted_pass_leaves_the_callers_hint_batch_in_row_order(monkeypatch, setup):
    """Balancing reorders the rows sent to the workers, never the hint batch the trainer reads afterwards (its
    ``hint_missing`` flags and the credit dump's hint prompts), even when no padding row is needed."""
    trainer = make_trainer(monkeypatch, **SETUPS[setup])
    batch = make_batch(trainer.tokenizer, PROBLEMS, n=4, seed=3)
    hint_batch, _ = build_hint_batch(batch, trainer.tokenizer, trainer.hint_config)
    assert len(hint_batch) % (2 * 2) == 0  # no padding: the case where the pass could alias the caller's batch
    before = copy.deepcopy(hint_batch)
    trainer._score_hint_batch(hint_batch)
    assert sorted(hint_batch.batch.keys()) == sorted(before.batch.keys())
    for key in before.batch.keys():
        torch.testing.assert_close(hint_batch.batch[key], before.batch[key], rtol=0, atol=0, msg=key)
    assert sorted(hint_batch.non_tensor_batch) == sorted(before.non_tensor_batch)
    for key, values in before.non_tensor_batch.items():
        assert list(hint_batch.non_tensor_batch[key]) == list(values), key


def valid_prompt(batch: DataProto, row: int) -> list[int]:
    width = batch.batch["prompts"].shape[1]
    return batch.batch["prompts"][row][batch.batch["attention_mask"][row, :width].bool()].tolist()


@pytest.mark.parametrize("context", ["successful_sibling", "gold_solution"])
def test_an_advantage_methods_pass_scores_its_rows_under_the_selected_context(monkeypatch, context):
    """The advantage methods' pass built the gold-solution hint prompt whatever the context (a latent bug): with
    ``cpo.context=successful_sibling`` RLSD's rows are scored under SDPO's re-prompt holding a successful sibling's
    response. Control: with ``cpo.context=gold_solution`` the same assertion fails, the prompts hold the gold
    solution."""
    trainer = make_trainer(monkeypatch, "cpo.method=rlsd", "cpo.teacher=policy", f"cpo.context={context}")
    batch = rollout_batch(trainer)
    scored, score = [], trainer._score_hint_batch
    monkeypatch.setattr(trainer, "_score_hint_batch", lambda hint_batch: scored.append(hint_batch) or score(hint_batch))
    inputs, metrics = run_update(trainer, batch, "needed")
    (received,) = scored  # one teacher pass, on the rows that read it
    rows = rows_reading_hint(
        "rlsd",
        seq_rewards=inputs["seq_rewards"],
        difficulty=inputs["difficulty"],
        cfg=trainer.cpo_config,
        advantages=inputs["advantages"],
    )
    picked = rows.nonzero().flatten().tolist()
    # A != 0: the mixed group's 4 rows (2 correct) and the all-wrong group's 4 (dense rewards), which has no success.
    assert len(received) == len(picked) == 8

    success = succeeded(inputs["seq_rewards"], trainer.cpo_config.success_value).numpy()
    every_sibling = choose_successful_siblings(batch.non_tensor_batch["uid"], success)
    siblings = every_sibling[picked]
    assert (siblings >= 0).sum() == 4
    sibling_batch, _, _ = build_sibling_batch(batch, every_sibling, trainer.tokenizer, max_prompt_length=10_000)
    prompts = [valid_prompt(received, i) for i in range(len(received))]
    responses, mask = batch.batch["responses"], batch.batch["response_mask"].bool()
    texts = [trainer.tokenizer.decode(ids) for ids in prompts]
    with_sibling = [
        (text, sibling_text(trainer.tokenizer, responses[j][mask[j]].tolist()))
        for text, j in zip(texts, siblings)
        if j >= 0
    ]

    # The assertion: the scorer received the sibling builder's prompts, holding each row's sibling response.
    under_sibling = prompts == [valid_prompt(sibling_batch, row) for row in picked] and all(
        "Correct solution:" in text and sibling in text for text, sibling in with_sibling
    )
    assert under_sibling == (context == "successful_sibling"), texts
    if context == "gold_solution":  # the control: every row's prompt holds its problem's gold solution instead
        solutions = [batch.non_tensor_batch["extra_info"][row]["solution"] for row in picked]
        assert all(solution in text for solution, text in zip(solutions, texts))
        assert metrics["cpo/context_frac"] == 1.0
    else:  # the all-wrong group has no sibling: those rows keep old_log_probs
        assert metrics["cpo/context_frac"] == 0.5
