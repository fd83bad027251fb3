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
"""Answer extraction: boxes, "the answer is", last number, think tags, option letters."""

import pytest

from treetune_verl.utils.reward_score.answer_extraction import (
    extract_choice_letter,
    extract_math_answer,
    final_segment,
    last_boxed_content,
    letter_from_option_text,
    parse_choices,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("\\boxed{a{b{c}}d}", "a{b{c}}d"),
        ("\\boxed{1} and \\boxed{2}", "2"),
        ("\\boxed{1} and \\fbox{3}", "3"),
        ("\\boxed 7$ done", "7"),
        ("\\boxed{}", ""),
        ("\\boxed{\\frac{1}{2", "\\frac{1}{2"),  # never closed: the rest, as the reference
        ("no box", None),
    ],
)
def test_last_boxed_content(text, expected):
    assert last_boxed_content(text) == expected


@pytest.mark.parametrize(
    "response, text, method",
    [
        ("So $\\boxed{5}$.", "5", "boxed"),
        ("So \\boxed{\\begin{pmatrix}1\\\\\n2\\end{pmatrix}}", "\\begin{pmatrix}1\\\\ 2\\end{pmatrix}", "boxed"),
        ("Thus the answer is: $x=4$.\nDone", "x=4", "answer_is"),
        ("Therefore The answer is 7/", "7", "answer_is"),
        ("first 3, then 1,234.5 apples", "1234.5", "last_number"),
        ("nothing here", "", "none"),
        ("", "", "none"),
        ("<think>\\boxed{1}</think>\\boxed{2}", "2", "boxed"),
        ("<think>\\boxed{1}", "", "unfinished_think"),
    ],
)
def test_extract_math_answer(response, text, method):
    extracted = extract_math_answer(response)
    assert (extracted.text, extracted.method) == (text, method)


def test_final_segment():
    assert final_segment("a</think>b</think>c") == "c"
    assert final_segment("<think>open") is None
    assert final_segment("plain") == "plain"


def test_parse_choices():
    question = "Q?\nChoices:\n(A): one\n(B): two\n(C): three\n(D): four"
    assert parse_choices(question) == {"A": "one", "B": "two", "C": "three", "D": "four"}
    assert parse_choices("A. only one line") == {}
    assert parse_choices(None) == {}


@pytest.mark.parametrize(
    "candidate, expected",
    [
        ("B", "B"),
        ("(B)", "B"),
        ("[B]", "B"),
        ("B)", "B"),
        ("\\text{B}", "B"),
        ("\\textbf{(C)}", "C"),
        ("**D**", "D"),
        ("(B) Benzene", "B"),
        ("B. Benzene", "B"),
        ("C: text", "C"),
        ("b", "B"),
        ("Benzene", None),
        ("A decrease in pressure", None),
        ("a. lower case with a dot", None),
        ("E", None),  # not an option of a four-option question
        ("", None),
    ],
)
def test_letter_from_option_text(candidate, expected):
    assert letter_from_option_text(candidate, "ABCD") == expected


def test_extract_choice_letter_maps_option_text_only_with_known_options():
    choices = {"A": "Cyclohexane", "B": "Benzene"}
    assert extract_choice_letter("\\boxed{benzene.}", choices).text == "B"
    assert extract_choice_letter("\\boxed{benzene}", None).text == ""
    assert extract_choice_letter("The answer is (A) since ...", choices).text == "A"
    assert extract_choice_letter("Some reasoning.\n\n**(B)**", choices).text == "B"
