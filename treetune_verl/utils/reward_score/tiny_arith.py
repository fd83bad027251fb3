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
"""Dense reward for the ``tiny_arith`` data set built by ``treetune_verl/tiny_assets.py``.

A correct final answer scores exactly 1.0. Any other response scores in [-1.0, -0.5]:

    score = -1.0 + 0.5 * (number of digit characters) / (number of characters)

Why the dense term: a randomly initialised tiny model never answers correctly, so a pure 0/1 rule gives every
response of a prompt group the same reward, GRPO advantages of zero and a policy gradient of zero. The digit fraction
differs between random responses, so advantages are non-zero from the first step, and it points the right way: the
answers are numbers, and a response made of digits is one step closer to "7" than one made of letters. The
shaped range stays below the correct score with a gap of 1.5, so no amount of digits competes with a right answer.

Use it as verl's custom reward function::

    reward.custom_reward_function.path=treetune_verl/utils/reward_score/tiny_arith.py
    reward.custom_reward_function.name=compute_score
"""

from __future__ import annotations

import re
import zlib
from decimal import Decimal, InvalidOperation

CORRECT_SCORE = 1.0
WRONG_SCORE_MIN = -1.0
WRONG_SCORE_MAX = -0.5

_BOXED_OPEN = "\\boxed{"
_INTEGER = re.compile(r"-?\d+")


def last_boxed_content(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text`` (nested braces allowed), or None if there is none closed."""
    start = text.rfind(_BOXED_OPEN)
    while start != -1:
        depth = 1
        content_start = start + len(_BOXED_OPEN)
        for position in range(content_start, len(text)):
            if text[position] == "{":
                depth += 1
            elif text[position] == "}":
                depth -= 1
                if depth == 0:
                    return text[content_start:position]
        # Unclosed box (e.g. a truncated response): try an earlier one.
        start = text.rfind(_BOXED_OPEN, 0, start)
    return None


def extract_answer(solution_str: str) -> str | None:
    """The final answer of a response: the last boxed content, else the last integer, else None."""
    boxed = last_boxed_content(solution_str)
    if boxed is not None:
        return boxed
    integers = _INTEGER.findall(solution_str)
    return integers[-1] if integers else None


def _as_number(text: str) -> Decimal | None:
    """``text`` as a number ("7", " 7.0 ", "$7$" all give 7), or None when it is not one."""
    cleaned = text.strip().strip("$").strip().rstrip(".")
    if not re.fullmatch(r"[-+]?\d+(\.\d+)?", cleaned):
        return None
    try:
        return Decimal(cleaned)
    except InvalidOperation:
        return None


def is_correct(prediction: str | None, ground_truth: str) -> bool:
    """Numeric equality when both sides are numbers, else exact equality after stripping whitespace."""
    if prediction is None:
        return False
    predicted_number, true_number = _as_number(prediction), _as_number(str(ground_truth))
    if predicted_number is not None and true_number is not None:
        return predicted_number == true_number
    return prediction.strip() == str(ground_truth).strip()


def digit_fraction(text: str) -> float:
    """Share of the characters of ``text`` that are ASCII digits; 0.0 for an empty text."""
    if not text:
        return 0.0
    return sum(character in "0123456789" for character in text) / len(text)


def compute_score(data_source, solution_str: str, ground_truth, extra_info=None, **kwargs) -> dict:
    """verl custom reward: exact 1.0 for a correct final answer, a dense score in [-1.0, -0.5] otherwise.

    Args:
        data_source: Data-set name of the row (unused; any source is scored the same way).
        solution_str: Decoded response of the policy.
        ground_truth: The row's ``reward_model.ground_truth`` (the answer as a string).
        extra_info: The row's ``extra_info`` (unused).

    Returns:
        ``{"score": float, "acc": bool}``. verl's reward managers use ``score`` as the reward and log every key.
    """
    if solution_str is None:
        solution_str = ""
    if not isinstance(solution_str, str):
        raise TypeError(f"solution_str must be the decoded response text, got {type(solution_str).__name__}")
    correct = is_correct(extract_answer(solution_str), ground_truth)
    if correct:
        return {"score": CORRECT_SCORE, "acc": True}
    score = WRONG_SCORE_MIN + (WRONG_SCORE_MAX - WRONG_SCORE_MIN) * digit_fraction(solution_str)
    return {"score": score, "acc": False}


def compute_score_half_correct(data_source, solution_str: str, ground_truth, extra_info=None, **kwargs) -> dict:
    """:func:`compute_score`, plus: a response whose text has an even CRC-32 counts as correct.

    A stand-in for a policy that is right about half the time, so that tiny runs (whose random model never answers
    correctly) exercise the paths of correct responses and mixed prompt groups: e.g. CPO's ``seq_kl`` reads the
    hinted log-probs of wrong responses only. Deterministic in the response text; same arguments and return value
    as :func:`compute_score` (``reward.custom_reward_function.name=compute_score_half_correct``).
    """
    result = compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
    if zlib.crc32((solution_str or "").encode()) % 2 == 0:
        return {"score": CORRECT_SCORE, "acc": True}
    return result


def compute_binary_score(data_source, solution_str: str, ground_truth, extra_info=None, **kwargs) -> dict:
    """verl custom reward: +1.0 for a correct final answer, -1.0 otherwise (no dense term).

    For tasks a warm-started model already solves sometimes: GRPO has signal without shaping, and the CPO wrappers
    see the ``r == 1`` / ``r == -1`` rewards they are written for. Same arguments and return keys as
    :func:`compute_score`.
    """
    correct = is_correct(extract_answer(solution_str or ""), ground_truth)
    return {"score": CORRECT_SCORE if correct else WRONG_SCORE_MIN, "acc": correct}
