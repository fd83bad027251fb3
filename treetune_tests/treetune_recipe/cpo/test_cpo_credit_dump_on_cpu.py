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
"""The token-credit dump (``cpo.credit_dump``) and the HTML report built from it."""

import html
import json
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from verl import DataProto

from treetune_recipe.cpo.config import CPOConfig
from treetune_recipe.cpo.methods.loss import CONTEXT_MASK, TOKEN_LOSS, teacher_top_keys
from treetune_recipe.cpo.reports import credit_dump
from treetune_recipe.cpo.reports.credit_dump import CreditDumpConfig, build_dump, maybe_dump_credit, select_rows
from treetune_recipe.cpo.reports.credit_report import render_report
from treetune_verl.rescoring import Scores
from treetune_verl.tiny_assets import build_tiny_assets


def test_rows_are_taken_round_robin_over_the_four_kinds():
    difficulty = torch.tensor([0, 0, 0, 0, -1, -1, 1, 1])
    correct = torch.tensor([True, False, True, False, False, False, True, True])
    # kinds in order: mixed_correct (0, 2), mixed_wrong (1, 3), all_wrong (4, 5), all_correct (6, 7)
    assert select_rows(difficulty, correct, 5) == [0, 1, 4, 6, 2]
    assert select_rows(difficulty, correct, 100) == [0, 1, 4, 6, 2, 3, 5, 7]


def test_config_is_off_by_default_and_checks_its_keys():
    assert CreditDumpConfig.from_config(CPOConfig().credit_dump).steps == ()
    assert CreditDumpConfig.from_config({"steps": [1, 5]}).steps == (1, 5)
    with pytest.raises(ValueError, match="steps must be a list of training steps >= 1"):
        CreditDumpConfig.from_config({"steps": [0]})
    with pytest.raises(ValueError, match="Unknown cpo.credit_dump key"):
        CreditDumpConfig.from_config({"step": [1]})


def test_off_steps_cost_nothing(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("no extra forward pass at an unlisted step")

    monkeypatch.setattr(credit_dump, "score_batch", forbidden)
    trainer = SimpleNamespace(cpo_config=CPOConfig.from_config({"credit_dump": {"steps": [3]}}), global_steps=2)
    assert maybe_dump_credit(trainer, batch=None, hint_batch=None, cpo_config=trainer.cpo_config) is None


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(build_tiny_assets() / "model")


def _batch(tokenizer):
    """Four responses of 3 tokens (the last one 2 valid): groups a (mixed) and b (all wrong)."""
    torch.manual_seed(0)
    prompt_ids = torch.tensor(tokenizer("Tom has 3 apples.")["input_ids"])
    width = len(prompt_ids) + 1
    prompts = torch.full((4, width), tokenizer.pad_token_id)
    prompts[:, 1:] = prompt_ids
    responses = torch.tensor([tokenizer("3 + 4")["input_ids"][:3]] * 4)
    response_mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 0]])
    attention = torch.cat([torch.tensor([[0] + [1] * (width - 1)] * 4), response_mask], dim=1)
    old, gw = -torch.rand(4, 3), -torch.rand(4, 3)
    batch = DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "attention_mask": attention,
            "response_mask": response_mask,
            "advantages": torch.tensor([[0.7] * 3, [-0.7] * 3, [0.0] * 3, [0.0] * 3]),
            "old_log_probs": old * response_mask,
            "teacher_log_probs": gw * response_mask,
            "seq_rewards": torch.tensor([1.0, -1.0, -1.0, -1.0]),
            "difficulty": torch.tensor([0, 0, -1, -1]),
        },
        non_tensors={"uid": np.array(["a", "a", "b", "b"], dtype=object)},
    )
    hint = DataProto.from_dict(tensors={"prompts": prompts, "attention_mask": attention})
    return batch, hint


def test_dump_holds_delta_and_the_wrappers_advantage_change(tokenizer):
    batch, hint = _batch(tokenizer)
    entropy = torch.rand(4, 3)
    dump = build_dump(batch, hint, entropy, tokenizer, CPOConfig(method="seq_kl"), step=7, max_rows=8)
    assert dump["step"] == 7 and [row["kind"] for row in dump["rows"]] == [
        "mixed_correct",
        "mixed_wrong",
        "all_wrong",
        "all_wrong",
    ]
    last = dump["rows"][3]
    assert len(last["tokens"]) == 2 and last["prompt"].endswith("Tom has 3 apples.")
    gw, old = batch.batch["teacher_log_probs"][3, :2], batch.batch["old_log_probs"][3, :2]
    torch.testing.assert_close(torch.tensor(last["delta"]), gw - old, atol=2e-6, rtol=0)
    # seq_kl, wrong response of an all-wrong group: A + neg_alpha * (mean delta over its valid tokens)
    expected = torch.full((2,), float((gw - old).mean()))
    torch.testing.assert_close(
        torch.tensor(last["advantage_shaped"]) - torch.tensor(last["advantage"]), expected, atol=2e-6, rtol=0
    )
    # correct response with pos_alpha = 0: unchanged
    assert dump["rows"][0]["advantage_shaped"] == dump["rows"][0]["advantage"]
    json.dumps(dump)  # JSON-ready


def test_a_listed_step_reads_the_old_policys_entropy_from_a_second_actor_pass(tokenizer, monkeypatch, tmp_path):
    batch, hint = _batch(tokenizer)
    entropy = torch.rand(4, 3)
    calls = []

    def second_pass(trainer, scored, **flags):
        calls.append((scored, flags))
        return Scores(log_probs=None, entropy=entropy)

    monkeypatch.setattr(credit_dump, "score_batch", second_pass)
    trainer = SimpleNamespace(
        cpo_config=CPOConfig.from_config({"credit_dump": {"steps": [2], "dir": str(tmp_path)}}),
        global_steps=2,
        tokenizer=tokenizer,
        config=SimpleNamespace(trainer=SimpleNamespace(default_local_dir=str(tmp_path / "unused"))),
    )
    path = maybe_dump_credit(trainer, batch, hint, trainer.cpo_config)
    assert calls == [(batch, {"on": "actor", "entropy": True})]  # the plain batch, on the actor, with the entropy
    dump = json.loads(path.read_text())
    assert path == tmp_path / "step_2.json" and dump["teacher"] == "policy"
    expected = build_dump(batch, hint, entropy, tokenizer, trainer.cpo_config, step=2, max_rows=32)
    assert dump == json.loads(json.dumps(expected))


def test_report_shows_every_token_with_its_exact_values_escaped(tokenizer):
    batch, hint = _batch(tokenizer)
    dump = build_dump(batch, hint, torch.rand(4, 3), tokenizer, CPOConfig(), step=1, max_rows=8)
    dump["rows"][0]["tokens"][0] = "<b>"
    page = render_report([dump], per_kind=1)
    spans = re.findall(
        r'<span class="tok" data-delta="([^"]+)" data-adv="([^"]+)" title="[^"]*"[^>]*>([^<]*)</span>', page
    )
    picked = [dump["rows"][0], dump["rows"][1], dump["rows"][2]]  # one per kind present (no all_correct rows)
    expected = [
        (str(row["delta"][i]), html.escape(row["tokens"][i])) for row in picked for i in range(len(row["tokens"]))
    ]
    assert [(float(d), t) for d, _, t in spans] == [(float(d), t) for d, t in expected]
    assert "&lt;b&gt;" in page and "<script>" in page and "http" not in page


@pytest.mark.parametrize("method", ["opsd", "sdpo"])
def test_a_distribution_level_dump_holds_the_context_the_teachers_top_ids_and_the_token_loss(tokenizer, method):
    batch, hint = _batch(tokenizer)
    torch.manual_seed(1)
    shown, vocab = 3, 50
    teacher = torch.log_softmax(torch.randn(4, 3, vocab), -1)
    top = teacher.topk(shown, dim=-1)
    token_loss = torch.rand(4, 3)
    # What the extra pass returns per token (the loss's logits call): the token loss and the teacher's top ids.
    outputs = {TOKEN_LOSS: token_loss}
    for i in range(shown):
        id_key, log_prob_key = teacher_top_keys(i)
        outputs[id_key], outputs[log_prob_key] = top.indices[..., i].float(), top.values[..., i]
    batch.batch[CONTEXT_MASK] = torch.tensor([1.0, 1.0, 0.0, 1.0])
    cpo_config = CPOConfig.from_config({"method": method})
    dump = build_dump(batch, hint, torch.rand(4, 3), tokenizer, cpo_config, step=2, max_rows=8, distribution=outputs)
    expected, ids = token_loss, top.indices
    for row in dump["rows"]:
        r, valid = row["row"], batch.batch["response_mask"][row["row"]].bool()
        assert "advantage_shaped" not in row and row["has_context"] == bool(batch.batch[CONTEXT_MASK][r])
        torch.testing.assert_close(torch.tensor(row["token_loss"]), expected[r][valid], atol=1e-6, rtol=0)
        first = row["teacher_topk"][0]  # the teacher's most likely ids first, [id, text, log-prob]
        assert [entry[0] for entry in first] == ids[r, 0, : len(first)].tolist()
        assert first[0][2] == pytest.approx(teacher[r, 0].max().item(), abs=1e-6)
    # The report colours the second mode by the token loss and names the teacher's top ids on hover.
    page = render_report([dump], per_kind=1)
    losses = [float(v) for v in re.findall(r'data-adv="([^"]+)"', page)]
    assert losses and all(loss >= 0 for loss in losses) and "teacher&#x27;s top ids" in page
    assert "no teacher context: out of the loss" in page
