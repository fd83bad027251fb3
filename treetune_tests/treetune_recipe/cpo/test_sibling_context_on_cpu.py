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
"""SDPO's teacher context: which successful sibling each row gets, thinking stripped, the teacher's message text, and
its environment-feedback section (lasgroup's wording and rules)."""

import numpy as np
import pytest
import torch

from treetune_recipe.cpo.teacher.feedback import feedback_teacher_message, row_feedback
from treetune_recipe.cpo.teacher.sibling import choose_successful_siblings, sibling_teacher_message, strip_thinking


def _chosen(uids, success, **kwargs) -> list[int]:
    return choose_successful_siblings(uids, np.array(success, dtype=bool), **kwargs).tolist()


def test_all_wrong_group_gets_no_context():
    assert _chosen(["a"] * 4, [False] * 4) == [-1, -1, -1, -1]


def test_one_right_gives_it_to_the_others_not_to_itself():
    assert _chosen(["a"] * 4, [False, False, True, False]) == [2, 2, -1, 2]
    assert _chosen(["a"] * 4, [False, False, True, False], exclude_self=False) == [2, 2, 2, 2]


def test_two_right_each_gets_the_other_and_the_wrong_ones_the_first():
    assert _chosen(["a"] * 5, [False, True, False, True, False]) == [1, 3, 1, 1, 1]


def test_three_right_first_other_in_batch_order():
    assert _chosen(["g"] * 4, [True, True, True, False]) == [1, 0, 0, 0]


def test_interleaved_groups_in_any_row_order():
    uids = np.array(["a", "b", "a", "c", "b", "a", "c", "b"], dtype=object)
    success = [False, True, True, False, False, True, False, True]
    assert _chosen(uids, success) == [2, 7, 5, -1, 1, 2, -1, 1]
    assert _chosen(uids, success, exclude_self=False) == [2, 1, 2, -1, 1, 2, -1, 1]
    rng = np.random.default_rng(0)
    for _ in range(20):  # whatever the row order: same group, successful, not itself, the first such; -1 iff none
        order = rng.permutation(len(uids))
        u, ok = uids[order], np.array(success)[order]
        chosen = choose_successful_siblings(u, ok)
        for row, j in enumerate(chosen):
            eligible = [c for c in range(len(u)) if u[c] == u[row] and ok[c] and c != row]
            assert j == (eligible[0] if eligible else -1)


def test_integer_uids_and_torch_bool_success():
    success = torch.tensor([True, False, False, True])
    assert choose_successful_siblings([7, 7, 9, 9], success).tolist() == [-1, 0, 3, -1]


def test_non_bool_success_and_length_mismatch_are_refused():
    with pytest.raises(TypeError, match="success_reward_threshold"):
        choose_successful_siblings(["a", "a"], np.array([1.0, 0.0]))
    with pytest.raises(ValueError, match=r"\[B\]"):
        choose_successful_siblings(["a", "a", "a"], np.array([True, False]))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>\nlet me see\n2+2=4\n</think>\n\nThe answer is \\boxed{4}.", "The answer is \\boxed{4}."),
        ("No thinking here.", "No thinking here."),
        ("Intro <think>a</think> end", "Intro end"),
        ("<think>a</think>x<think>b\n</think>  y", "xy"),
        ("<think>never closed, answer 4", "<think>never closed, answer 4"),  # lasgroup keeps an unclosed block
        ("stray </think> answer", "stray </think> answer"),
        ("<think>a</think>b</think>c", "b</think>c"),  # non-greedy: the first closing tag ends the block
    ],
)
def test_strip_thinking(text, expected):
    assert strip_thinking(text) == expected


def test_teacher_message_published_wording():
    message = sibling_teacher_message("What is 2+2? Put the answer in \\boxed{}.", "2+2=4, so \\boxed{4}.")
    assert message == (
        "What is 2+2? Put the answer in \\boxed{}."
        "\nCorrect solution:\n\n"
        "2+2=4, so \\boxed{4}."
        "\n\nCorrectly solve the original question."
    )


def test_teacher_message_keeps_braces_in_texts_verbatim():
    message = sibling_teacher_message("Prove {x} {prompt}", "{solution} \\frac{1}{2}")
    assert message.startswith("Prove {x} {prompt}\nCorrect solution:\n\n{solution} \\frac{1}{2}\n\n")


def test_feedback_is_a_non_blank_string_kept_as_it_is():
    assert row_feedback("  Test 2 failed.\n") == "  Test 2 failed.\n"  # lasgroup checks strip() but keeps the text
    assert [row_feedback(value) for value in ("", "  \n", None, 3, float("nan"))] == [None] * 5


def test_feedback_message_published_wording_and_rules():
    prompt, solution, feedback = "What is 2+2?", "2+2=4, so \\boxed{4}.", "Your answer 5 is wrong {x}."
    section = "\nThe following is feedback from your unsuccessful earlier attempt:\n\n" + feedback
    end = "\n\nCorrectly solve the original question."
    assert feedback_teacher_message(prompt, feedback, None) == prompt + section + end
    # environment_feedback_only_without_solution (published True): a row with a solution shows it alone.
    assert feedback_teacher_message(prompt, feedback, solution) == sibling_teacher_message(prompt, solution)
    both = feedback_teacher_message(prompt, feedback, solution, only_without_solution=False)
    assert both == prompt + "\nCorrect solution:\n\n" + solution + section + end
    assert feedback_teacher_message(prompt, None, None) is None  # neither: the plain prompt, no context
