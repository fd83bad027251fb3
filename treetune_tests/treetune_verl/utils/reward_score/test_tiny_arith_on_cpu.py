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
"""Tests of the dense tiny_arith reward."""

import random
import statistics
from pathlib import Path

import pytest

from treetune_verl.utils.reward_score import tiny_arith
from treetune_verl.utils.reward_score.tiny_arith import compute_score, last_boxed_content


def score(response, ground_truth="7"):
    return compute_score("tiny_arith", response, ground_truth)


@pytest.mark.parametrize(
    "response",
    [
        "3 + 4 = 7. \\boxed{7}",
        "\\boxed{7}",
        "\\boxed{ 7 }",
        "\\boxed{7.0}",
        "\\boxed{$7$}",
        "so the answer is 7",  # no box: last integer
        "\\boxed{3} no wait \\boxed{7}",  # last box wins
        "\\boxed{7} and then 9 more words 12",  # a box beats a later integer
        "<think>\n\n</think>\n\n1 + 6 = 7. \\boxed{7",  # unclosed box (truncated): last integer
    ],
)
def test_correct_scores_exactly_one(response):
    assert score(response) == {"score": 1.0, "acc": True}


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("", -1.0),
        ("no digits here", -1.0),
        ("abc12", -1.0 + 0.5 * 2 / 5),  # last integer 12 is wrong
        ("\\boxed{8}", -1.0 + 0.5 * 1 / 9),
        ("\\boxed{9} and then 7", -1.0 + 0.5 * 2 / 20),  # the box, not the later 7, is the answer
        ("\\boxed{}", -1.0),
        ("\\boxed{seven}", -1.0),
        ("77", -0.5),  # all digits, wrong answer: top of the shaped range
    ],
)
def test_wrong_scores_by_hand(response, expected):
    result = score(response)
    assert result["acc"] is False
    assert result["score"] == pytest.approx(expected, abs=1e-12)


def test_non_numeric_ground_truth_compares_text():
    assert compute_score("tiny_arith", "\\boxed{yes}", "yes")["score"] == 1.0
    assert compute_score("tiny_arith", "\\boxed{no}", "yes")["score"] == -1.0


def test_garbage_is_handled():
    assert score(None) == {"score": -1.0, "acc": False}
    huge = "9" * 10_000  # beyond Python's int-from-string digit limit
    assert score(huge) == {"score": -0.5, "acc": False}
    assert score("\\boxed{\\boxed{\\boxed{") == {"score": -1.0, "acc": False}
    assert score("}}}{{{\\boxed{{}}日本\x00")["acc"] is False
    with pytest.raises(TypeError, match="decoded response text"):
        score(b"7")


def test_return_types():
    for response in ["\\boxed{7}", "x"]:
        result = score(response)
        assert set(result) == {"score", "acc"}
        assert type(result["score"]) is float and type(result["acc"]) is bool


def test_random_strings_get_varied_rewards_in_range():
    """What a random policy produces: the dense term must separate responses so GRPO advantages are non-zero."""
    rng = random.Random(0)
    alphabet = "abcdefgh +-=.{}\\\n0123456789"
    responses = ["".join(rng.choices(alphabet, k=rng.randint(0, 40))) for _ in range(100)]
    results = [score(response, ground_truth="13") for response in responses]
    wrong = [r["score"] for r in results if not r["acc"]]
    assert len(wrong) >= 90
    assert all(-1.0 <= s <= -0.5 for s in wrong)
    assert len(set(wrong)) > 20 and statistics.pstdev(wrong) > 0.02
    # A prompt group of 4 random responses almost never ties.
    groups = [wrong[i : i + 4] for i in range(0, len(wrong) - 3, 4)]
    assert sum(len(set(group)) > 1 for group in groups) >= len(groups) - 1


def test_last_boxed_content_nested():
    assert last_boxed_content("a \\boxed{\\frac{1}{2}} b") == "\\frac{1}{2}"
    assert last_boxed_content("no box") is None


def test_loads_as_verl_custom_reward_function():
    from verl.utils.import_utils import load_extern_object

    loaded = load_extern_object(module_path=str(Path(tiny_arith.__file__)), object_name="compute_score")
    result = loaded(data_source="tiny_arith", solution_str="\\boxed{7}", ground_truth="7", extra_info={"index": 0})
    assert result == {"score": 1.0, "acc": True}


def test_half_correct_stands_in_for_a_model_right_about_half_the_time():
    """Correct when the text's CRC-32 is even (whatever the answer), else the dense score of a wrong answer."""
    import zlib

    rng = random.Random(1)
    responses = ["".join(rng.choices("abcdefgh 0123456789", k=rng.randint(1, 30))) for _ in range(400)]
    results = [tiny_arith.compute_score_half_correct("tiny_arith", text, "12345678") for text in responses]
    for text, result in zip(responses, results):
        if zlib.crc32(text.encode()) % 2 == 0:
            assert result == {"score": 1.0, "acc": True}, text
        else:
            assert result == score(text, ground_truth="12345678"), text
    assert 0.4 < statistics.fmean(result["acc"] for result in results) < 0.6
    # A response with the right answer is always correct.
    odd = next(text for text in (f"\\boxed{{7}}{' ' * k}" for k in range(9)) if zlib.crc32(text.encode()) % 2)
    assert tiny_arith.compute_score_half_correct("tiny_arith", odd, "7") == {"score": 1.0, "acc": True}


@pytest.mark.parametrize(
    ("response", "expected"),
    [("3 + 4 = 7. \\boxed{7}", (1.0, True)), ("3 + 4 = 8. \\boxed{8}", (-1.0, False)), ("", (-1.0, False))],
)
def test_binary_score_is_plus_or_minus_one(response, expected):
    result = tiny_arith.compute_binary_score("tiny_arith", response, "7")
    assert (result["score"], result["acc"]) == expected
