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
"""The teacher prompt of a distribution-level method (``teacher.contexts``): SDPO's successful-sibling re-prompt
built on a real chat template, the rows it masks, and the gold-solution context of OPSD."""

import numpy as np
import pytest
import torch

from treetune_recipe.cpo.methods.registry import get_method
from treetune_recipe.cpo.methods.sdpo import SDPOKnobs
from treetune_recipe.cpo.teacher.contexts import build_sibling_batch, build_teacher_batch
from treetune_recipe.cpo.teacher.hint import HintConfig
from treetune_recipe.cpo.teacher.sibling import sibling_teacher_message
from treetune_tests.support.hint_batches import PROBLEMS, make_batch
from treetune_tests.support.tokenizer_factory import build_tokenizer


def valid_prompt(batch, row: int) -> list[int]:
    width = batch.batch["prompts"].shape[1]
    return batch.batch["prompts"][row][batch.batch["attention_mask"][row, :width].bool()].tolist()


def with_responses(tokenizer, batch, texts: dict[int, str]):
    """Put the given response texts into rows of ``batch`` (right-padded, mask and attention updated)."""
    width = batch.batch["responses"].shape[1]
    prompt_width = batch.batch["prompts"].shape[1]
    for row, text in texts.items():
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:width]
        batch.batch["responses"][row] = torch.tensor(ids + [0] * (width - len(ids)))
        batch.batch["response_mask"][row] = torch.tensor([1] * len(ids) + [0] * (width - len(ids)))
        batch.batch["attention_mask"][row, prompt_width:] = batch.batch["response_mask"][row]
    batch.batch["input_ids"] = torch.cat([batch.batch["prompts"], batch.batch["responses"]], dim=-1)
    return batch


@pytest.mark.parametrize("family", ["qwen3", "chatml"])
def test_a_row_is_reprompted_with_its_groups_first_other_success_and_thinking_stripped(family):
    tokenizer = build_tokenizer(family)
    batch = make_batch(tokenizer, PROBLEMS[:2], n=3, shuffle=False, response_width=40)
    batch = with_responses(tokenizer, batch, {1: "<think>scratch</think>so y = 5", 2: "y is 5"})
    uids = batch.non_tensor_batch["uid"]
    # Group 0: rows 0-2, rows 1 and 2 correct; group 1: rows 3-5, none correct.
    success = torch.tensor([False, True, True, False, False, False])
    teacher, has_context, metrics = build_teacher_batch(
        get_method("sdpo"),
        SDPOKnobs(),
        batch,
        success=success,
        tokenizer=tokenizer,
        hint_config=HintConfig(max_prompt_length=256),
    )
    assert has_context.tolist() == [True, True, True, False, False, False]
    assert metrics["cpo/context_frac"] == pytest.approx(0.5)
    question = batch.non_tensor_batch["raw_prompt"][0][-1]["content"]

    def expected(sibling_text):
        messages = [{"role": "user", "content": sibling_teacher_message(question, sibling_text)}]
        return list(
            tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
        )

    assert valid_prompt(teacher, 0) == expected("so y = 5")  # the first success, its thinking block removed
    assert valid_prompt(teacher, 1) == expected("y is 5")  # a success gets the other one, never itself
    assert valid_prompt(teacher, 2) == expected("so y = 5")
    for row in (3, 4, 5):  # no success in the group: the row keeps its own prompt and is masked out of the loss
        assert valid_prompt(teacher, row) == valid_prompt(batch, row)
    # The responses are the student's, with positions continuing from the new prompt's end.
    assert torch.equal(teacher.batch["responses"], batch.batch["responses"])
    width = teacher.batch["prompts"].shape[1]
    first = teacher.batch["position_ids"][0, width]
    assert first == len(valid_prompt(teacher, 0))
    assert len(uids) == 6


def test_the_only_success_gets_no_context_and_a_too_long_prompt_is_masked():
    tokenizer = build_tokenizer("qwen3")
    batch = make_batch(tokenizer, PROBLEMS[:1], n=2, shuffle=False, response_width=40)
    batch = with_responses(tokenizer, batch, {0: "the answer is 5 " * 6})
    siblings = np.array([-1, 0])
    _, has_context, metrics = build_sibling_batch(batch, siblings, tokenizer, max_prompt_length=512)
    assert has_context.tolist() == [False, True]
    short_limit = len(valid_prompt(batch, 1)) + 3  # the own prompt fits, the re-prompt with the sibling does not
    teacher, has_context, metrics = build_sibling_batch(batch, siblings, tokenizer, max_prompt_length=short_limit)
    assert has_context.tolist() == [False, False] and metrics["cpo/context_too_long_frac"] == 0.5
    assert valid_prompt(teacher, 1) == valid_prompt(batch, 1)


def test_the_gold_solution_context_is_the_hint_prompt_and_a_missing_solution_masks_the_group():
    tokenizer = build_tokenizer("qwen3")
    problems = [PROBLEMS[0], {**PROBLEMS[1], "solution": ""}]
    batch = make_batch(tokenizer, problems, n=2, shuffle=False)
    teacher, has_context, metrics = build_teacher_batch(
        get_method("opsd"),
        None,
        batch,
        success=torch.zeros(4, dtype=torch.bool),
        tokenizer=tokenizer,
        hint_config=HintConfig(max_prompt_length=1024, on_missing="skip"),
    )
    assert has_context.tolist() == [True, True, False, False]
    assert problems[0]["solution"].split()[0] in tokenizer.decode(valid_prompt(teacher, 0))
    assert valid_prompt(teacher, 2) == valid_prompt(batch, 2)
