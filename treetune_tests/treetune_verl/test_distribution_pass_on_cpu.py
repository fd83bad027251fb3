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
"""``treetune_verl.distribution_pass`` on verl's FSDP engine workers in this process (the context-sensitive tiny
model, dynamic batch size so the engine reorders rows), against fp32 transformers run row by row without padding.

Covered: the top-k pass under a hint prompt at two temperatures (worker method ``compute_topk_log_prob``, and
``score_batch`` with padding and balancing over two stand-in DP ranks), the given-ids pass and the whole vocabulary,
the layout helpers inside a real actor update switched on by ``student_logits_in_update`` (values and gradient), and
the reference EMA. Each numerics check also runs its control: the same assertion on a corrupted input must fail.
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

from treetune_tests.support import engine_harness as harness
from treetune_tests.support import fp32_reference as reference
from treetune_tests.support.shards import load_shards, local_shards
from treetune_verl.distribution_pass import (
    TOPK_K,
    check_distribution_support,
    gather_response_log_probs,
    response_positions,
    scatter_response_values,
    student_logits_in_update,
    topk_log_probs,
)
from treetune_verl.reference_refresh import RefreshableReferenceWorker
from treetune_verl.second_log_prob import score_batch
from treetune_verl.tiny_assets import CONTEXT_SENSITIVE, build_tiny_assets
from treetune_verl.version import installed_verl_version

HAS_HOOK = installed_verl_version().startswith("0.9.")
needs_hook = pytest.mark.skipif(not HAS_HOOK, reason="the student-logits hook is verl 0.9.x only")
K = 5


@pytest.fixture(scope="module")
def engine():
    from transformers import AutoModelForCausalLM

    from treetune_recipe.cpo.cpo_hint import build_hint_batch

    assets = build_tiny_assets(config=CONTEXT_SENSITIVE)
    with harness.engine_fixture(assets, *harness.BATCHING["dynamic_batch_size"]) as h:
        # The worker class's methods on the harness's actor and reference (no Ray: its __init__ would build them).
        worker = object.__new__(RefreshableReferenceWorker)
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


def assert_topk_matches(ids, log_probs, expected, mask, what: str) -> None:
    """The engine's top-k equals fp32's: the k log-probs (sorted), the fp32 log-probs at the engine's ids (the same ids
    up to bf16 near-ties), and at least 90 % of the ids exactly."""
    mask = mask.bool()
    top = expected.topk(ids.shape[-1], dim=-1)
    reference.assert_scores_match(log_probs[mask], top.values[mask], f"{what}: top-k log-probs")
    reference.assert_scores_match(expected.gather(-1, ids)[mask], top.values[mask], f"{what}: fp32 log-probs at ids")
    agree = (ids == top.indices)[mask].float().mean().item()
    assert agree >= 0.9, f"{what}: only {agree:.2f} of the top-k ids agree"


@needs_hook
@pytest.mark.parametrize("temperature", [1.0, 1.1])
def test_topk_under_a_hint_prompt_matches_fp32_transformers(engine, temperature):
    hint, mask = engine["hint"], engine["hint"].batch["response_mask"]
    data = request(hint, temperature, **{TOPK_K: K})
    output = engine["worker"].compute_topk_log_prob(data)
    ids, log_probs = output["topk_ids"], output["topk_log_probs"]
    assert ids.shape == (len(hint), mask.shape[1], K) and ids.dtype == torch.int64
    assert log_probs.dtype == torch.float32
    assert bool((log_probs[mask.bool()].diff(dim=-1) <= 0).all()), "top-k must be sorted by descending log-prob"
    assert engine["actor"].loss_fn is not None and engine["ref"].loss_fn is None  # the workers' losses are back
    assert_topk_matches(ids, log_probs, fp32_distributions(engine, hint, temperature), mask, "hinted top-k")
    # Controls: the plain prompt's distribution (same response tokens), and every token read one position early.
    controls = {
        "plain prompt": fp32_distributions(engine, engine["plain"], temperature),
        "shift": fp32_distributions(engine, hint, temperature, shift=1),
    }
    if temperature != 1.0:
        controls["temperature 1.0"] = fp32_distributions(engine, hint, 1.0)
    for name, corrupted in controls.items():
        with pytest.raises(AssertionError):
            assert_topk_matches(ids, log_probs, corrupted, mask, f"hinted top-k vs {name}")


@needs_hook
def test_given_ids_and_the_whole_vocabulary_match_fp32_transformers(engine):
    hint, mask = engine["hint"], engine["hint"].batch["response_mask"]
    vocab = len(engine["tokenizer"])
    expected = fp32_distributions(engine, hint)
    gen = torch.Generator().manual_seed(0)
    ids = torch.cat([hint.batch["responses"][..., None], torch.randint(0, vocab, (*mask.shape, 3), generator=gen)], -1)
    data = request(hint)
    output = topk_log_probs(engine["ref"], data, k=0, ids=ids)
    got = output["topk_log_probs"]
    assert tu.get(data, "compute_loss") is False and "treetune_topk_row" not in data.keys()  # the request is intact
    assert torch.equal(output["topk_ids"], ids * mask[..., None])
    m = mask.bool()
    reference.assert_scores_match(got[m], expected.gather(-1, ids)[m], "log-probs at given ids")
    # The sampled token's column is the engine's own log-prob from the same forward (same logits, row order kept).
    own = no_padding_2_padding(output["log_probs"], data).float()
    torch.testing.assert_close(got[..., 0][m], own[m], atol=2e-2, rtol=0)
    for name, corrupted in {
        "shift": fp32_distributions(engine, hint, shift=1).gather(-1, ids),
        "wrong ids": expected.gather(-1, (ids + 1) % vocab),
    }.items():
        with pytest.raises(AssertionError):
            reference.assert_scores_match(got[m], corrupted[m], f"log-probs at given ids vs {name}")

    full = topk_log_probs(engine["ref"], request(hint), k=0)
    rows = full["topk_ids"].shape[-1]
    assert rows >= vocab  # every row of the output layer (the model's padding rows included)
    torch.testing.assert_close(full["topk_log_probs"].exp().sum(-1)[m], torch.ones(int(m.sum())), atol=1e-4, rtol=0)
    assert torch.equal(full["topk_ids"][m].sort(-1).values, torch.arange(rows).expand(int(m.sum()), rows))
    by_id = torch.zeros(*mask.shape, rows).scatter(-1, full["topk_ids"], full["topk_log_probs"])
    top = expected.topk(20, dim=-1)
    reference.assert_scores_match(by_id.gather(-1, top.indices)[m], top.values[m], "whole vocabulary, 20 likeliest")
    with pytest.raises(AssertionError):
        reference.assert_scores_match(by_id.gather(-1, (top.indices + 1) % vocab)[m], top.values[m], "wrong ids")


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
            sampled = data["responses"][..., None]
            shifted = torch.roll(student_logits, shifts=1, dims=1)
            return {
                "gathered": scatter_response_values(
                    gather_response_log_probs(student_logits, data, sampled)[..., 0], data
                ),
                "shifted": scatter_response_values(gather_response_log_probs(shifted, data, sampled)[..., 0], data),
            }
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
def test_score_batch_returns_topk_in_the_callers_order_after_padding_and_balancing(engine):
    class InProcessGroup:
        """Two stand-in DP ranks on the in-process worker: the request split in two, the outputs concatenated."""

        def __init__(self, mesh):
            self._dispatch_info, self.requests = {mesh: [0, 1]}, []

        def _two_ranks(self, method, data):
            self.requests.append(data)
            return tu.concat_tensordict([method(part) for part in tu.chunk_tensordict(data, 2)])

        def compute_topk_log_prob(self, data):
            return self._two_ranks(engine["worker"].compute_topk_log_prob, data)

        def compute_ref_topk_log_prob(self, data):
            return self._two_ranks(engine["worker"].compute_ref_topk_log_prob, data)

    trainer = type("Trainer", (), {"_get_dp_size": RayPPOTrainer._get_dp_size})()
    trainer._balance_batch = RayPPOTrainer._balance_batch.__get__(trainer)
    trainer.config = OmegaConf.merge(engine["config"], {"trainer": {"balance_batch": True}})
    trainer.actor_rollout_wg, trainer.ref_policy_wg = InProcessGroup("actor"), InProcessGroup("ref")
    trainer.ref_in_actor = False
    hint = engine["hint"][:7]  # padded to 8 rows for the two ranks
    mask = hint.batch["response_mask"]
    expected = fp32_distributions(engine, hint, temperature=1.0)
    scores = score_batch(trainer, hint, on="actor", entropy=True, topk=K)
    assert scores.topk_ids.shape == (7, mask.shape[1], K) and scores.entropy is not None
    assert_topk_matches(scores.topk_ids, scores.topk_log_probs, expected, mask, "score_batch top-k")
    sampled = expected.gather(-1, hint.batch["responses"][..., None])[..., 0]
    reference.assert_scores_match(scores.log_probs, sampled * mask, "score_batch log-probs", mask)
    (sent,) = trainer.actor_rollout_wg.requests
    assert len(sent) == 8
    plain_order = [hint.batch["input_ids"][i][hint.batch["attention_mask"][i].bool()].tolist() for i in [*range(7), 0]]
    assert [ids.tolist() for ids in sent["input_ids"].unbind()] != plain_order  # balancing reordered the rows
    # Given ids on the reference, in the caller's order; control: the rows' ids read back in the sent order fail.
    ids = scores.topk_ids.flip(-1)
    by_ref = score_batch(trainer, hint, on="reference", topk_ids=ids)
    assert torch.equal(by_ref.topk_ids, ids * mask[..., None]) and by_ref.entropy is None
    m = mask.bool()
    reference.assert_scores_match(by_ref.topk_log_probs[m], expected.gather(-1, ids)[m], "score_batch given ids")
    with pytest.raises(AssertionError):
        reference.assert_scores_match(by_ref.topk_log_probs[m], expected.gather(-1, ids.roll(1, dims=0))[m], "rows")


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
    import treetune_verl.distribution_pass as distribution_pass

    if HAS_HOOK:
        check_distribution_support()
    monkeypatch.setattr(distribution_pass, "installed_verl_version", lambda: "0.7.1")
    with pytest.raises(RuntimeError, match=r"need verl 0\.9\.x .* installed verl is 0\.7\.1"):
        distribution_pass.check_distribution_support()


@needs_hook
def test_the_old_log_prob_pass_can_return_the_top_k_of_its_own_forward():
    """verl's pass calls ``compute_log_prob`` once and keeps log_probs, entropy and metrics; inside the block the call
    goes to ``compute_topk_log_prob`` with k, and the top-k it returns is kept for the caller; afterwards the group's
    own method is back."""
    from treetune_verl.distribution_pass import TOPK_K, topk_in_log_prob_pass

    class Group:
        def __init__(self):
            self.calls = []

        def compute_log_prob(self, data):
            self.calls.append(("plain", None))
            return TensorDict({}, batch_size=[])

        def compute_topk_log_prob(self, data):
            self.calls.append(("topk", tu.get_non_tensor_data(data=data, key=TOPK_K, default=None)))
            return TensorDict({"topk_ids": torch.ones(2, 3, 4), "topk_log_probs": -torch.ones(2, 3, 4)}, batch_size=[])

    group = Group()
    with topk_in_log_prob_pass(group, k=4) as captured:
        group.compute_log_prob(TensorDict({}, batch_size=[]))
    assert group.calls == [("topk", 4)]
    assert captured["topk"].ids.dtype == torch.long and captured["topk"].ids.shape == (2, 3, 4)
    group.compute_log_prob(TensorDict({}, batch_size=[]))  # restored: verl's own pass again
    assert group.calls[-1] == ("plain", None)
