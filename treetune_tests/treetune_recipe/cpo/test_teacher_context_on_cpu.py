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
"""The teacher's contexts (``teacher.contexts``), their registry and the ``cpo.context`` knob: SDPO's
successful-sibling re-prompt built on a real chat template and the rows it masks, the gold-solution context, the
answer-only context in SDPG's wording, SDPO's environment-feedback section, the prompt limit of each, and an unknown
name refused."""

import numpy as np
import pytest
import torch

from treetune_recipe.cpo.config import CPOConfig, check_cpo_overrides
from treetune_recipe.cpo.methods.method import Method
from treetune_recipe.cpo.methods.registry import all_methods
from treetune_recipe.cpo.teacher.contexts import CONTEXTS, build_sibling_batch, get_context
from treetune_recipe.cpo.teacher.hint import HintConfig
from treetune_recipe.cpo.teacher.sibling import sibling_teacher_message
from treetune_tests.support.hint_batches import PROBLEMS, make_batch
from treetune_tests.support.tokenizer_factory import build_tokenizer
from treetune_verl.preflight import PreflightError


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
    teacher, has_context, metrics = get_context("successful_sibling").build(
        batch,
        success=success,
        tokenizer=tokenizer,
        hint_config=HintConfig(max_prompt_length=256),
        cpo=CPOConfig(method="sdpo"),
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
    teacher, has_context, metrics = get_context("gold_solution").build(
        batch, tokenizer=tokenizer, hint_config=HintConfig(max_prompt_length=1024, on_missing="skip")
    )
    assert has_context.tolist() == [True, True, False, False]
    assert problems[0]["solution"].split()[0] in tokenizer.decode(valid_prompt(teacher, 0))
    assert valid_prompt(teacher, 2) == valid_prompt(batch, 2)


def chat_ids(tokenizer, content: str) -> list[int]:
    """The chat template's prompt of one user message (generation prompt on), as a re-prompted row's."""
    messages = [{"role": "user", "content": content}]
    return list(tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False))


def test_the_registry_holds_four_contexts_each_with_its_needs_and_prompt_limit():
    assert list(CONTEXTS) == ["gold_solution", "answer_only", "successful_sibling", "environment_feedback"]
    cpo = CPOConfig.from_config({"hint": {"solution_key": "worked"}, "feedback": {"key": "critique"}})
    assert get_context("gold_solution").needs(cpo).columns == ("extra_info.worked",)
    assert get_context("answer_only").needs(cpo).columns == ("reward_model.ground_truth",)
    assert get_context("successful_sibling").needs(cpo).columns == ()  # nothing in the files: the step's rewards
    feedback = get_context("environment_feedback").needs(cpo)
    assert feedback.columns == () and "'critique'" in feedback.step[0]
    # The prompt limit: P + margin, plus T where the prompt may hold a whole response; a set limit wins.
    limits = {name: context.resolve_hint(HintConfig(), 100, 40).max_prompt_length for name, context in CONTEXTS.items()}
    assert limits == {"gold_solution": 612, "answer_only": 612, "successful_sibling": 652, "environment_feedback": 652}
    assert {c.resolve_hint(HintConfig(max_prompt_length=77), 100, 40).max_prompt_length for c in CONTEXTS.values()} == {
        77
    }
    for context in CONTEXTS.values():
        assert context.describe and "\n" not in context.describe


def test_cpo_context_selects_a_registered_context_and_null_is_the_methods_published_one():
    assert CPOConfig().context is None and CPOConfig().context_name == "gold_solution"  # the CPO wrappers
    assert CPOConfig(method="rlsd").context_name == "answer_only"  # RLSD's official code shows the answer
    assert CPOConfig(method="sdpo").context_name == "successful_sibling"
    chosen = CPOConfig.from_config({"method": "rlsd", "context": "gold_solution"})
    assert chosen.teacher_context is CONTEXTS["gold_solution"]
    assert {method.context for method in all_methods().values()} <= set(CONTEXTS)


@pytest.mark.parametrize("where", ["block", "override", "method"])
def test_an_unknown_context_is_refused_in_one_line_naming_the_valid_ones(where):
    error_type = PreflightError if where == "override" else ValueError
    with pytest.raises(error_type) as refused:
        if where == "block":
            CPOConfig.from_config({"context": "gold"})
        elif where == "override":
            check_cpo_overrides(["cpo.context=gold"])
        else:
            Method(name="x", family="cpo", summary="", policy="shaped", advantage=print, context="gold")
    message = str(refused.value)
    assert "\n" not in message and "gold" in message
    assert all(name in message for name in CONTEXTS), message


def test_the_answer_context_appends_sdpgs_wording_after_the_question_and_a_row_without_one_has_none():
    tokenizer = build_tokenizer("qwen3")
    problems = [PROBLEMS[0], {**PROBLEMS[1], "solution": ""}]  # make_batch: the answer is the solution's \boxed{}
    batch = make_batch(tokenizer, problems, n=2, shuffle=False)
    assert batch.non_tensor_batch["reward_model"][0]["ground_truth"] == "5"
    teacher, has_context, metrics = get_context("answer_only").build(
        batch, tokenizer=tokenizer, hint_config=HintConfig(max_prompt_length=256)
    )
    assert has_context.tolist() == [True, True, False, False] and metrics["cpo/context_frac"] == 0.5
    question = batch.non_tensor_batch["raw_prompt"][0][-1]["content"]
    wording = (
        "The correct answer to this problem is: 5\nUse this to verify your reasoning, but show your full solution "
        "process."
    )
    assert valid_prompt(teacher, 0) == chat_ids(tokenizer, question + "\n\n" + wording)
    assert wording in tokenizer.decode(valid_prompt(teacher, 1))
    assert valid_prompt(teacher, 2) == valid_prompt(batch, 2)  # no answer: the row's own prompt, no context
    assert torch.equal(teacher.batch["responses"], batch.batch["responses"])
    width = teacher.batch["prompts"].shape[1]
    assert teacher.batch["position_ids"][0, width] == len(valid_prompt(teacher, 0))
    _, fits, metrics = get_context("answer_only").build(
        batch, tokenizer=tokenizer, hint_config=HintConfig(max_prompt_length=len(valid_prompt(batch, 0)) + 3)
    )
    assert not fits.any() and metrics["cpo/context_too_long_frac"] == 0.5


def with_feedback(batch, texts, key="feedback"):
    """Put the reward function's extra info ``key`` into ``batch``, as verl's ``extract_reward`` leaves it."""
    values = np.empty(len(batch), dtype=object)
    values[:] = texts
    batch.non_tensor_batch[key] = values
    return batch


def test_the_feedback_context_shows_the_rows_own_feedback_in_sdpos_section():
    tokenizer = build_tokenizer("qwen3")
    batch = make_batch(tokenizer, PROBLEMS[:2], n=2, shuffle=False)
    batch = with_feedback(batch, ["Test 3 failed: expected 5, got 6.", "", None, "   "])
    context = get_context("environment_feedback")
    teacher, has_context, metrics = context.build(
        batch, tokenizer=tokenizer, hint_config=HintConfig(max_prompt_length=256), success=torch.zeros(4).bool()
    )
    assert has_context.tolist() == [True, False, False, False]  # empty, missing and blank feedback: no context
    question = batch.non_tensor_batch["raw_prompt"][0][-1]["content"]
    message = (
        question + "\nThe following is feedback from your unsuccessful earlier attempt:\n\n"
        "Test 3 failed: expected 5, got 6.\n\nCorrectly solve the original question."
    )
    assert valid_prompt(teacher, 0) == chat_ids(tokenizer, message)
    assert all(valid_prompt(teacher, row) == valid_prompt(batch, row) for row in (1, 2, 3))
    assert metrics["cpo/feedback_available_frac"] == metrics["cpo/feedback_used_frac"] == 0.25
    # The key is a knob: another column of the reward's extra info.
    batch = with_feedback(batch, [None, "Wrong sign.", None, None], key="critique")
    cpo = CPOConfig.from_config({"feedback": {"key": "critique"}})
    _, has_context, _ = context.build(
        batch, tokenizer=tokenizer, hint_config=HintConfig(max_prompt_length=256), cpo=cpo
    )
    assert has_context.tolist() == [False, True, False, False]


@pytest.mark.parametrize("only_without_solution", [True, False])
def test_the_feedback_context_with_a_sibling_follows_lasgroups_rules(only_without_solution):
    tokenizer = build_tokenizer("qwen3")
    batch = make_batch(tokenizer, PROBLEMS[:2], n=2, shuffle=False)
    batch = with_responses(tokenizer, batch, {1: "so y = 5"})
    batch = with_feedback(batch, ["Off by one.", None, "Wrong sign.", None])
    # Group 0 (rows 0, 1): row 1 correct, so row 0 has a sibling; group 1 (rows 2, 3): no success.
    success = torch.tensor([False, True, False, False])
    cpo = CPOConfig.from_config({"feedback": {"with_solution": True, "only_without_solution": only_without_solution}})
    teacher, has_context, metrics = get_context("environment_feedback").build(
        batch, tokenizer=tokenizer, hint_config=HintConfig(max_prompt_length=256), success=success, cpo=cpo
    )
    # Row 0: a sibling and feedback; row 1: its group's only success, no feedback: nothing; row 2: feedback only.
    assert has_context.tolist() == [True, False, True, False]
    question = batch.non_tensor_batch["raw_prompt"][0][-1]["content"]
    solution = "\nCorrect solution:\n\nso y = 5"
    feedback = "\nThe following is feedback from your unsuccessful earlier attempt:\n\nOff by one."
    shown = solution + ("" if only_without_solution else feedback)
    assert valid_prompt(teacher, 0) == chat_ids(
        tokenizer, question + shown + "\n\nCorrectly solve the original question."
    )
    assert "Wrong sign." in tokenizer.decode(valid_prompt(teacher, 2))
    assert metrics["cpo/feedback_used_frac"] == (0.25 if only_without_solution else 0.5)


def test_chosen_rows_are_built_alone_with_siblings_read_from_the_whole_batch():
    """The advantage methods' pass builds only the rows that read the teacher: a wrong row's sibling is a correct row
    that is not built."""
    tokenizer = build_tokenizer("qwen3")
    batch = make_batch(tokenizer, PROBLEMS[:2], n=3, shuffle=False, response_width=40)
    batch = with_responses(tokenizer, batch, {1: "so y = 5", 2: "y is 5"})
    success = torch.tensor([False, True, True, False, False, False])
    rows = ~success
    context, hint = get_context("successful_sibling"), HintConfig(max_prompt_length=256)
    whole, whole_context, _ = context.build(batch, tokenizer=tokenizer, hint_config=hint, success=success)
    chosen, chosen_context, metrics = context.build(
        batch, tokenizer=tokenizer, hint_config=hint, success=success, rows=rows
    )
    assert len(chosen) == 4 and chosen_context.tolist() == whole_context[rows].tolist() == [True, False, False, False]
    picked = rows.nonzero().flatten().tolist()
    assert [valid_prompt(chosen, i) for i in range(4)] == [valid_prompt(whole, row) for row in picked]
    assert metrics["cpo/context_frac"] == 0.25  # over the rows built
