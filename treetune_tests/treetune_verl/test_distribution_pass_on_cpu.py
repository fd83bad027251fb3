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
"""``treetune_verl.logits_hook`` and ``treetune_verl.update_teacher`` on verl's FSDP engine workers in this
process (the context-sensitive tiny model, dynamic batch size so the engine reorders rows), against fp32 transformers
run row by row without padding.

Covered: the in-update teacher's forward on the reference engine, from the batch's teacher columns, at two
temperatures (the whole vocabulary at every response token); how the worker binds it to the loss and keeps the
reference on the device; the layout helpers inside a real actor update switched on by ``student_logits_in_update``
(values and gradient); and the reference EMA. Each numerics check also runs its control: the same assertion on a
corrupted input must fail.
"""

from __future__ import annotations

import pytest
import torch
from verl import DataProto
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

from treetune_tests.support import engine_harness as harness
from treetune_tests.support import fp32_reference as reference
from treetune_tests.support.shards import load_shards, local_shards
from treetune_verl.logits_hook import (
    check_distribution_support,
    response_index,
    response_positions,
    scatter_response_values,
    student_logits_in_update,
)
from treetune_verl.teacher_worker import TeacherWorker
from treetune_verl.tiny_assets import CONTEXT_SENSITIVE, build_tiny_assets
from treetune_verl.update_teacher import UpdateTeacher, teacher_columns
from treetune_verl.version import installed_verl_version

HAS_HOOK = installed_verl_version().startswith("0.9.")
needs_hook = pytest.mark.skipif(not HAS_HOOK, reason="the student-logits hook is verl 0.9.x only")


@pytest.fixture(scope="module")
def engine():
    from transformers import AutoModelForCausalLM

    from treetune_recipe.cpo.teacher.hint import build_hint_batch

    assets = build_tiny_assets(config=CONTEXT_SENSITIVE)
    with harness.engine_fixture(assets, *harness.BATCHING["dynamic_batch_size"]) as h:
        # The worker class's methods on the harness's actor and reference (no Ray: its __init__ would build them).
        worker = object.__new__(TeacherWorker)
        worker.actor, worker.ref, worker.role = h["actor"], h["ref"], "actor_rollout_ref"
        plain = reference.rollout_batch(h["model_path"], h["tokenizer"], seed=2)
        hint, _ = build_hint_batch(plain, h["tokenizer"], h["hint_config"])
        assert torch.equal(hint.batch["responses"], plain.batch["responses"])
        fp32 = AutoModelForCausalLM.from_pretrained(h["model_path"], dtype=torch.float32, attn_implementation="sdpa")
        yield {**h, "worker": worker, "plain": plain, "hint": hint, "fp32": fp32.eval()}


@torch.no_grad()
def fp32_distributions(engine, batch: DataProto, temperature: float = 1.0, shift: int = 0) -> torch.Tensor:
    """``[B, T, V]`` log-softmax(logits / temperature) over the tokenizer's V ids at each response token, one row at a
    time without padding (``shift=1``: each token read one position too early)."""
    vocab = len(engine["tokenizer"])
    tensors = batch.batch
    prompt_width, width = tensors["prompts"].shape[1], tensors["responses"].shape[1]
    out = torch.zeros(len(batch), width, vocab)
    for i in range(len(batch)):
        prompt = tensors["prompts"][i][tensors["attention_mask"][i, :prompt_width].bool()]
        response = tensors["responses"][i][tensors["response_mask"][i].bool()]
        p, r = len(prompt), len(response)
        logits = engine["fp32"](torch.cat([prompt, response])[None]).logits[0].float()
        first = p - 1 - shift
        out[i, :r] = torch.log_softmax(logits[first : first + r, :vocab] / temperature, dim=-1)
    return out


def request(batch: DataProto, temperature: float = 1.0, **flags):
    """verl's old-log-prob request for ``batch`` at ``temperature`` (as ``_compute_old_log_prob`` sends it)."""
    batch = DataProto(batch=batch.batch, non_tensor_batch=batch.non_tensor_batch, meta_info=dict(batch.meta_info))
    batch.meta_info["temperature"] = temperature
    data = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(data, calculate_entropy=False, compute_loss=False, **flags)
    return data


def sampled_log_probs(logits: torch.Tensor, data) -> torch.Tensor:
    """The log-prob of each response token under ``logits``, in the packed layout (through the layout helpers)."""
    packed, index, valid = response_index(logits, data)
    rows = torch.log_softmax(packed.index_select(0, index).float(), dim=-1)
    sampled = data["responses"].to(rows.device)[valid.to(rows.device)]
    return scatter_response_values(rows.gather(-1, sampled[:, None])[:, 0], data)


@needs_hook
@pytest.mark.parametrize("temperature", [1.0, 1.1])
def test_the_in_update_teacher_gives_the_references_distribution_under_the_hint_prompt(engine, temperature):
    """An update micro-batch of the plain rows carries the hint rows as token columns; the teacher's forward on the
    reference engine gives, at each response token, fp32 transformers' log-softmax under the hint prompt at the
    request's temperature, over the whole vocabulary."""
    plain, hint = engine["plain"], engine["hint"]
    batch = DataProto(batch=plain.batch.clone(), non_tensor_batch=plain.non_tensor_batch, meta_info=plain.meta_info)
    batch.batch.update(teacher_columns(hint))
    data = request(batch, temperature)
    teacher = UpdateTeacher(engine["ref"].engine)
    rows = teacher(data)
    mask = plain.batch["response_mask"].bool()
    vocab = len(engine["tokenizer"])
    assert teacher.forwards == 1 and torch.equal(rows.valid, mask) and rows.logits.shape[-1] >= vocab
    log_probs = torch.log_softmax(rows.logits.float(), dim=-1)
    torch.testing.assert_close(log_probs[:, vocab:].exp().sum(-1), torch.zeros(int(mask.sum())), atol=1e-6, rtol=0)
    got = log_probs[:, :vocab]
    expected = fp32_distributions(engine, hint, temperature)[mask]
    top = expected.topk(20, dim=-1)
    reference.assert_scores_match(got.gather(-1, top.indices), top.values, "teacher, 20 likeliest ids")
    # Controls: the plain prompt's distribution (the same response tokens), every token read one position early.
    controls = {
        "plain prompt": fp32_distributions(engine, plain, temperature)[mask],
        "shift": fp32_distributions(engine, hint, temperature, shift=1)[mask],
    }
    if temperature != 1.0:
        controls["temperature 1.0"] = fp32_distributions(engine, hint, 1.0)[mask]
    for name, corrupted in controls.items():
        with pytest.raises(AssertionError):
            reference.assert_scores_match(got.gather(-1, top.indices), corrupted.gather(-1, top.indices), name)
    # A teacher column that does not hold the batch's responses is refused (rows out of order).
    shuffled = DataProto(batch=batch.batch.clone(), meta_info=batch.meta_info)
    shuffled.batch.update({key: value.roll(1, dims=0) for key, value in teacher_columns(hint).items()})
    with pytest.raises(ValueError, match="other response tokens"):
        teacher(request(shuffled, temperature))


@needs_hook
def test_the_worker_binds_the_teachers_engine_to_the_loss_and_holds_the_reference_for_the_update(engine):
    worker, actor = engine["worker"], engine["actor"]
    saved = actor.loss_fn
    try:
        worker.set_loss_fn_with_teacher(print, "reference")
        assert actor.loss_fn.keywords["teacher"].engine is engine["ref"].engine and actor.loss_fn.func is print
        entered = []
        ref_engine = engine["ref"].engine
        original = type(ref_engine).eval_mode
        ref_engine.eval_mode = lambda **kwargs: (entered.append(kwargs), original(ref_engine, **kwargs))[1]
        with worker._reference_teacher_on_device():
            assert ref_engine.mode == "eval"
        assert entered and ref_engine.mode is None
        worker.set_loss_fn_with_teacher(print, "actor")
        assert actor.loss_fn.keywords["teacher"].engine is actor.engine
        entered.clear()
        with worker._reference_teacher_on_device():  # a policy teacher: nothing to hold
            pass
        assert not entered
        with pytest.raises(ValueError, match="teacher must be one of"):
            worker.set_loss_fn_with_teacher(print, "ema")
    finally:
        vars(engine["ref"].engine).pop("eval_mode", None)
        vars(worker).pop("update_teacher", None)
        actor.loss_fn = saved


@needs_hook
def test_scatter_inverts_no_padding_2_padding_and_sequence_parallelism_is_refused(engine):
    data = request(engine["hint"])
    mask = engine["hint"].batch["response_mask"]
    values = torch.randn(mask.shape, generator=torch.Generator().manual_seed(0)) * mask
    packed = scatter_response_values(values, data)
    assert packed.shape == (1, int(data["input_ids"].offsets()[-1]))
    torch.testing.assert_close(no_padding_2_padding(packed[0], data) * mask, values)
    with pytest.raises(AssertionError):  # control: the packed values one position off
        torch.testing.assert_close(no_padding_2_padding(packed[0].roll(1), data) * mask, values)
    assert torch.equal(response_positions(data)[1], mask.bool())
    tu.assign_non_tensor(data, sp_size=2)
    with pytest.raises(NotImplementedError, match="sequence-parallel size 1"):
        response_positions(data)


class GatherProbe:
    """An actor loss that reads the student's logits through the layout helpers: the log-prob of each sampled token
    (and, as the control, the same read one position too early); its loss is minus their mean, so any gradient comes
    through the gather."""

    def __init__(self):
        self.rows, self.student_calls = [], 0

    def __call__(self, *, data, student_logits=None, model_output=None, dp_group=None):
        if student_logits is not None:
            self.student_calls += 1
            shifted = torch.roll(student_logits, shifts=1, dims=1)
            return {"gathered": sampled_log_probs(student_logits, data), "shifted": sampled_log_probs(shifted, data)}
        mask = data["response_mask"].float()
        values = {key: no_padding_2_padding(model_output[key], data) for key in ("gathered", "shifted", "log_probs")}
        self.rows.append((data["row"].cpu(), {key: v.detach().float().cpu() for key, v in values.items()}))
        loss = -(values["gathered"] * mask).sum() / mask.sum()
        return loss, {}

    def by_row(self, key: str, rows: int) -> torch.Tensor:
        out = torch.zeros(rows, self.rows[0][1][key].shape[1])
        for row, values in self.rows:
            out[row] = values[key]
        return out


class UpdateGroup:
    """A worker group whose update_actor is the in-process actor's ``train_mini_batch`` (as verl's worker)."""

    def __init__(self, actor):
        self.actor = actor

    def update_actor(self, data):
        return self.actor.train_mini_batch(data)


def update_request(batch: DataProto):
    """``RayPPOTrainer._update_actor``'s request without any distillation flag (as with no distillation config)."""
    return harness.update_request(batch, calculate_entropy=False, compute_loss=True)


@needs_hook
def test_layout_helpers_inside_an_actor_update_give_the_sampled_log_probs_and_a_gradient(engine):
    batch = engine["plain"]
    batch = DataProto(batch=batch.batch.clone(), non_tensor_batch=batch.non_tensor_batch, meta_info=batch.meta_info)
    batch.batch["row"] = torch.arange(len(batch))
    actor, probe = engine["actor"], GatherProbe()
    module = actor.engine.module
    before, saved_loss = local_shards(module), actor.loss_fn
    group = UpdateGroup(actor)
    actor.loss_fn = probe
    try:
        # Control of the seam: without it verl's update never hands the loss the student's logits.
        with pytest.raises(KeyError):
            group.update_actor(update_request(batch))
        assert probe.student_calls == 0
        load_shards(module, before)
        probe.rows.clear()
        with student_logits_in_update(group):
            metrics = tu.get(group.update_actor(update_request(batch)), "metrics")
        assert "update_actor" not in vars(group)  # the seam is gone after the block
        after = local_shards(module)
    finally:
        actor.loss_fn = saved_loss
        load_shards(module, before)
    assert probe.student_calls > 1, "the update should span several micro-batches"
    mask = batch.batch["response_mask"]
    m = mask.bool()
    gathered, own = probe.by_row("gathered", len(batch)), probe.by_row("log_probs", len(batch))
    torch.testing.assert_close(gathered[m], own[m], atol=2e-2, rtol=0)  # the engine's own log-probs, same logits
    expected, _, _ = reference.reference_outputs(engine["model_path"], batch)
    reference.assert_scores_match(gathered * mask, expected, "gathered log-probs in the update", mask)
    shifted = probe.by_row("shifted", len(batch))
    with pytest.raises(AssertionError):
        reference.assert_scores_match(shifted * mask, expected, "shifted gathered log-probs", mask)
    # The loss only reads the gathered values: a non-zero gradient and changed weights come through the gather.
    assert float(torch.as_tensor(metrics["grad_norm"]).mean()) > 0
    assert any(not torch.equal(before[name], after[name]) for name in before)


@needs_hook
@torch.no_grad()
def test_ema_moves_the_reference_towards_the_actor_in_closed_form(engine):
    worker, tau = engine["worker"], 0.3
    actor, ref = worker.actor.engine.module, worker.ref.engine.module
    actor_before, ref_before = local_shards(actor), local_shards(ref)
    gen = torch.Generator().manual_seed(0)
    try:
        # the reference starts away from the actor, so the two closed forms differ from the start
        theta0 = {name: v + 0.1 * torch.randn(v.shape, generator=gen, dtype=v.dtype) for name, v in ref_before.items()}
        load_shards(ref, theta0)
        theta = actor_before
        steps = 3
        for _ in range(steps):
            assert worker.ema_actor_weights_into_reference(tau) == len(theta)
        got = local_shards(ref)

        def closed_form(rate, n):
            return {name: (1 - rate) ** n * theta0[name] + (1 - (1 - rate) ** n) * theta[name] for name in theta}

        for name, expected in closed_form(tau, steps).items():
            torch.testing.assert_close(got[name], expected, rtol=1e-5, atol=1e-6)
        with pytest.raises(AssertionError):  # control: a wrong rate
            for name, expected in closed_form(0.25, steps).items():
                torch.testing.assert_close(got[name], expected, rtol=1e-5, atol=1e-6)

        # The actor changes between two calls: a1 for the first, a2 for the second.
        load_shards(ref, theta0)
        a1 = actor_before
        a2 = {name: v + 0.05 * torch.randn(v.shape, generator=gen, dtype=v.dtype) for name, v in a1.items()}
        worker.ema_actor_weights_into_reference(tau)
        load_shards(actor, a2)
        worker.ema_actor_weights_into_reference(tau)
        got = local_shards(ref)
        for name in theta0:
            # r2 = (1-τ)·r1 + τ·a2 with r1 = (1-τ)·θ0 + τ·a1
            expected = (1 - tau) ** 2 * theta0[name] + tau * (1 - tau) * a1[name] + tau * a2[name]
            torch.testing.assert_close(got[name], expected, rtol=1e-5, atol=1e-6)
        with pytest.raises(AssertionError):  # control: the fixed-actor closed form no longer holds
            for name, expected in closed_form(tau, 2).items():
                torch.testing.assert_close(got[name], expected, rtol=1e-5, atol=1e-6)
        with pytest.raises(ValueError, match="rate must be in"):
            worker.ema_actor_weights_into_reference(0.0)
    finally:
        load_shards(actor, actor_before)
        load_shards(ref, ref_before)


def test_release_check_names_the_reason(monkeypatch):
    import treetune_verl.logits_hook as logits_hook

    if HAS_HOOK:
        check_distribution_support()
    monkeypatch.setattr(logits_hook, "installed_verl_version", lambda: "0.7.1")
    with pytest.raises(RuntimeError, match=r"need verl 0\.9\.x .* installed verl is 0\.7\.1"):
        logits_hook.check_distribution_support()
