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
"""The probe of SDPO's teacher prompt (``treetune_recipe/cpo/experiments/teacher_probe.py``): the step boundaries it
reads, the position its probabilities come from, that its gold and empty contexts use the recipe's own wrapper, and
that it builds one prompt kind per registered context that gives a row a context."""

import pytest
import torch

from treetune_recipe.cpo.experiments.teacher_probe import (
    ProbeResult,
    PromptStats,
    early_end_ids,
    mass_at,
    pack_batch,
    prompt_of,
    step_boundaries,
    wrapped_teacher_batch,
)

DOT = 5  # the step-ending token of the hand-made responses


def test_step_boundaries_are_the_positions_after_each_intermediate_step():
    # "a + b = c. c - d = e. e + f = g. \boxed{g}" as ids: the dots at 2, 5 and 8
    response = [1, 2, DOT, 3, 4, DOT, 6, 7, DOT, 9, 10]
    assert step_boundaries(response, DOT, ops=3) == [3, 6]  # none after the third (last) step
    assert step_boundaries(response, DOT, ops=2) == [3]
    assert step_boundaries(response, DOT, ops=1) == []
    assert step_boundaries([1, 2, 3, 4], DOT, ops=3) == []  # a response without steps
    assert step_boundaries([1, DOT], DOT, ops=3) == []  # ends right after a step: no next token to predict
    assert step_boundaries([DOT, DOT, DOT, 1], DOT, ops=2) == [1]


@pytest.fixture(scope="module")
def tiny():
    import pandas as pd
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from treetune_verl.tiny_assets import CONTEXT_SENSITIVE, build_tiny_assets

    assets = build_tiny_assets(config=CONTEXT_SENSITIVE)  # next-token distributions that depend on the context
    tokenizer = AutoTokenizer.from_pretrained(assets / "model")
    model = AutoModelForCausalLM.from_pretrained(assets / "model", dtype=torch.float32).eval()
    rows = pd.read_parquet(assets / "data" / "train.parquet").head(2)
    raw = [[dict(message) for message in prompt] for prompt in rows["prompt"]]
    solutions = [str(info["solution"]) for info in rows["extra_info"]]
    return tokenizer, model, raw, solutions


def _batch(tokenizer, raw, solutions, rows=((0, 0), (0, 1), (1, 1), (1, 0))):
    """Rows (group, response): two groups; responses = a solution's ids (+ end of turn), of different lengths."""
    from treetune_recipe.cpo.experiments.teacher_probe import chat_ids

    ids = [tokenizer(s, add_special_tokens=False)["input_ids"] for s in solutions]
    responses = [ids[r][: 6 + 3 * k] + [tokenizer.eos_token_id] for k, (_, r) in enumerate(rows)]
    prompts = [chat_ids(tokenizer, raw[g]) for g, _ in rows]
    assert len(prompts[0]) != len(prompts[2])  # the batch pads them
    return pack_batch(tokenizer, prompts, responses, [raw[g] for g, _ in rows], [g for g, _ in rows]), prompts


def test_early_end_tokens_are_the_boxed_opening_and_the_end_of_turn(tiny):
    tokenizer = tiny[0]
    assert tokenizer.convert_ids_to_tokens(list(early_end_ids(tokenizer))) == ["Ġ\\", "<|im_end|>"]


def test_mass_is_read_at_the_distribution_that_predicts_the_response_token(tiny):
    tokenizer, model, raw, solutions = tiny
    batch, prompts = _batch(tokenizer, raw, solutions)
    token_ids = list(range(0, len(tokenizer), 2))  # half the vocabulary: a mass of order one that moves with context
    spots = [(0, 3), (2, 1), (3, 6), (1, 0)]

    @torch.no_grad()
    def alone(row: int, t: int) -> torch.Tensor:  # one unpadded sequence: prompt + response tokens before t
        response = batch.batch["responses"][row][: batch.batch["response_mask"][row].sum()].tolist()
        logits = model(input_ids=torch.tensor([prompts[row] + response[:t]])).logits[0, -1]
        return torch.softmax(logits, -1)[token_ids].sum()

    got = mass_at(model, batch, spots, token_ids)
    torch.testing.assert_close(got, torch.stack([alone(row, t) for row, t in spots]), rtol=1e-4, atol=1e-5)
    shifted = torch.stack([alone(row, t + 1) for row, t in spots])  # a corrupted index: one token late
    assert (got - shifted).abs().max() > 0.05, (got, shifted)


def test_gold_and_empty_contexts_use_the_recipes_sibling_wrapper(tiny):
    from treetune_recipe.cpo.teacher.contexts import get_context, sibling_text
    from treetune_recipe.cpo.teacher.hint import HintConfig
    from treetune_recipe.cpo.teacher.sibling import choose_successful_siblings

    tokenizer, _, raw, solutions = tiny
    batch, _ = _batch(tokenizer, raw, solutions)
    success = torch.tensor([True, False, True, False])  # row 0 and row 2 are the groups' successes
    recipe, has_context, _ = get_context("successful_sibling").build(
        batch, success=success, tokenizer=tokenizer, hint_config=HintConfig(max_prompt_length=512)
    )
    siblings = choose_successful_siblings(batch.non_tensor_batch["uid"], success.numpy())
    responses, mask = batch.batch["responses"], batch.batch["response_mask"].bool()
    texts = [sibling_text(tokenizer, responses[s][mask[s]].tolist()) if s >= 0 else None for s in siblings]
    assert texts[1] is not None and texts[0] is None  # exclude_self: a group's only success has no teacher context

    ours, ours_context = wrapped_teacher_batch(batch, texts, tokenizer, 512)
    assert torch.equal(ours_context, has_context)
    for key in ("prompts", "responses", "input_ids", "attention_mask", "position_ids"):
        assert torch.equal(ours.batch[key], recipe.batch[key]), key

    groups = batch.non_tensor_batch["uid"]
    gold, _ = wrapped_teacher_batch(batch, [solutions[g] if t else None for g, t in zip(groups, texts)], tokenizer, 512)
    empty, _ = wrapped_teacher_batch(batch, ["" if t else None for t in texts], tokenizer, 512)
    decoded = [tokenizer.decode(b.batch["prompts"][1], skip_special_tokens=True) for b in (recipe, gold, empty)]
    assert all("Correct solution:" in text and "Correctly solve the original question." in text for text in decoded)
    assert solutions[0] in decoded[1] and len(set(decoded)) == 3
    assert prompt_of(gold, 0) == prompt_of(batch, 0)  # no context: the row's own prompt
    _, too_long = wrapped_teacher_batch(batch, texts, tokenizer, 8)
    assert not too_long.any()


def test_table_has_one_row_per_prompt_kind():
    stats = [
        PromptStats(name, 0.1 * k, 0.2 * k, 20.0, 2.0, 0.5) for k, name in enumerate(["plain (student)", "sibling"])
    ]
    table = ProbeResult(4, 8, 0, 10, 2, 12, tuple(stats)).format_table()
    assert "10 rows with an SDPO context in 2 groups, 12 intermediate step boundaries" in table
    assert table.splitlines()[-2:] == [
        "| plain (student) | 0.000 | 0.000 | 20.0 | 2.00 | 0.500 |",
        "| sibling | 0.100 | 0.200 | 20.0 | 2.00 | 0.500 |",
    ]


def test_the_probe_builds_every_registered_context_that_gives_a_row_one(tiny):
    import numpy as np

    from treetune_recipe.cpo.experiments.teacher_probe import chat_ids, context_batches
    from treetune_recipe.cpo.teacher.contexts import CONTEXTS, get_context
    from treetune_recipe.cpo.teacher.hint import HintConfig

    tokenizer, _, raw, solutions = tiny
    rows = ((0, 0), (0, 1), (1, 1), (1, 0))
    ids = [tokenizer(s, add_special_tokens=False)["input_ids"] for s in solutions]
    responses = [ids[r][: 6 + 3 * k] + [tokenizer.eos_token_id] for k, (_, r) in enumerate(rows)]
    batch = pack_batch(
        tokenizer,
        [chat_ids(tokenizer, raw[g]) for g, _ in rows],
        responses,
        [raw[g] for g, _ in rows],
        [g for g, _ in rows],
        extra_infos=[{"solution": solutions[g]} for g, _ in rows],
        reward_models=[{"style": "rule", "ground_truth": str(7 + g)} for g, _ in rows],
    )
    success, hint = torch.tensor([True, False, True, False]), HintConfig(max_prompt_length=512)
    built = context_batches(batch, success, tokenizer, hint)
    # The task's reward returns no feedback: every other registered context is built, in the registry's order.
    assert list(built) == [name for name in CONTEXTS if name != "environment_feedback"]
    for name, (teacher_batch, has_context) in built.items():  # each the trainer's call, as built alone
        alone, alone_context, _ = get_context(name).build(batch, tokenizer=tokenizer, hint_config=hint, success=success)
        assert torch.equal(teacher_batch.batch["input_ids"], alone.batch["input_ids"]) and torch.equal(
            has_context, alone_context
        ), name
    assert "The correct answer to this problem is: 7" in tokenizer.decode(prompt_of(built["answer_only"][0], 0))
    # With feedback in the reward's extra info the feedback context is built too.
    batch.non_tensor_batch["feedback"] = np.array(["Off by one.", None, None, None], dtype=object)
    assert "environment_feedback" in context_batches(batch, success, tokenizer, hint)
