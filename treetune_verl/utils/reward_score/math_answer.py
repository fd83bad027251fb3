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
"""Rule-based reward for math, competition and multiple-choice answers, usable as verl's custom reward function.

Use it with::

    reward.custom_reward_function.path=pkg://treetune_verl.utils.reward_score.math_answer
    reward.custom_reward_function.name=compute_score
    # optional: +reward.custom_reward_function.reward_kwargs.format=zero_one

Routes (by ``data_source``, case-insensitive; ``route`` in the returned dict says which one was taken):

==================  =====================================================================  =====================
route               data_source                                                            answer check
==================  =====================================================================  =====================
``math``            hendrycks_math, math500, math, lighteval/MATH, math_dapo, ...          math-verify or string
``competition``     aime2024, aime2025, amc23, and any name starting with ``aime``/``amc``  math-verify or string
``multiple_choice`` gpqa and any name starting with ``gpqa``                               option letter
``generic_math``    anything else (logged once per name)                                   math-verify or string
==================  =====================================================================  =====================

The reference raised ``NotImplementedError`` for unknown names (and for ``amc2301``); here they take the generic math
route so that one odd validation file cannot stop a run, and ``route == "generic_math"`` makes that visible. The
reference graded AIME/AMC by strict string equality; here they use the same equivalence as MATH.

Scores: +1 / -1 by default; 0 / 1 with ``format="zero_one"``. A name ending in ``01`` whose stem is a known name
(``hendrycks_math01``, ``aime202401``, ``amc2301``, ...) selects ``zero_one`` when ``format`` is not given, as the
reference's ``*01`` datasets did.

Equivalence of a math answer: the normalised string rule (:mod:`.string_normalize`) or math-verify (``parse`` +
``verify``); the cheap string rule runs first so math-verify only runs when it can change the verdict. math-verify's
own signal-based timeouts are switched off (they fail outside the main thread, where verl's reward loop calls this
function) and :mod:`.math_verify_guard` enforces a hard limit per call instead (a ``SIGALRM`` in the main thread, a
helper process elsewhere). The function never raises on any response or ground truth; a bad ``format`` or
``timeout_s`` raises ``ValueError`` at once.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from treetune_verl.utils.reward_score.answer_extraction import (
    extract_choice_letter,
    extract_math_answer,
    parse_choices,
    unbox_ground_truth,
)
from treetune_verl.utils.reward_score.math_verify_guard import math_verify_equivalent
from treetune_verl.utils.reward_score.string_normalize import normalize_answer, strings_equivalent

logger = logging.getLogger(__name__)

ROUTE_MATH = "math"
ROUTE_COMPETITION = "competition"
ROUTE_MULTIPLE_CHOICE = "multiple_choice"
ROUTE_GENERIC = "generic_math"

FORMAT_PLUS_MINUS = "plus_minus"
FORMAT_ZERO_ONE = "zero_one"
_SCORE_VALUES = {FORMAT_PLUS_MINUS: (1.0, -1.0), FORMAT_ZERO_ONE: (1.0, 0.0)}

DEFAULT_TIMEOUT_S = 3.0
# ``pred`` is kept for majority voting and logs; a longer one is cut to this many characters.
MAX_PRED_CHARS = 512

_MATH_SOURCES = frozenset(
    {
        "hendrycks_math",
        "hendrycks_math:train_math-500:test",
        "math500",
        "math",
        "lighteval/math",
        "digitallearninggmbh/math-lighteval",
        "huggingfaceh4/math-500",
        "math_dapo",
        "math_dapo_reasoning",
    }
)
_COMPETITION_SOURCES = frozenset({"aime2024", "aime2025", "amc23"})
_COMPETITION_PREFIXES = ("aime", "amc")
_MULTIPLE_CHOICE_SOURCES = frozenset({"gpqa"})
_MULTIPLE_CHOICE_PREFIXES = ("gpqa",)
_ZERO_ONE_SUFFIX = "01"

_warned_unknown_sources: set[str] = set()
_warned_lock = threading.Lock()


def _known_route(name: str) -> str | None:
    if name in _MATH_SOURCES:
        return ROUTE_MATH
    if name in _COMPETITION_SOURCES:
        return ROUTE_COMPETITION
    if name in _MULTIPLE_CHOICE_SOURCES:
        return ROUTE_MULTIPLE_CHOICE
    return None


def resolve_route(data_source: str) -> tuple[str, bool]:
    """Which grader a data source uses.

    Args:
        data_source: the dataset's ``data_source`` value, e.g. ``"math500"`` or ``"aime202401"``.

    Returns:
        (route, zero_one_by_name): the route name and whether the name is a ``*01`` twin that asks for 0/1 scores.
    """
    name = str(data_source).strip().lower()
    route = _known_route(name)
    zero_one_by_name = False
    if route is None and name.endswith(_ZERO_ONE_SUFFIX):
        route = _known_route(name[: -len(_ZERO_ONE_SUFFIX)])
        zero_one_by_name = route is not None
    if route is None and name.startswith(_COMPETITION_PREFIXES):
        route = ROUTE_COMPETITION
    if route is None and name.startswith(_MULTIPLE_CHOICE_PREFIXES):
        route = ROUTE_MULTIPLE_CHOICE
    if route is None:
        route = ROUTE_GENERIC
        with _warned_lock:
            if name not in _warned_unknown_sources:
                _warned_unknown_sources.add(name)
                logger.warning("data_source %r has no reward route; grading it as generic math.", data_source)
    return route, zero_one_by_name


@dataclass(frozen=True)
class Grade:
    """The verdict on one response. ``pred`` is the normalised answer (or option letter) that was compared."""

    acc: bool
    pred: str
    extraction: str
    verify_timeout: bool = False
    parse_failed: bool = False


def grade_math(response: str, ground_truth: str, timeout_s: float, use_math_verify: bool = True) -> Grade:
    """Grades a math response: extraction, then the string rule, then math-verify."""
    extracted = extract_math_answer(response)
    prediction = normalize_answer(extracted.text)
    gold = unbox_ground_truth(ground_truth)
    if not extracted.text:
        return Grade(acc=False, pred="", extraction=extracted.method)
    if strings_equivalent(extracted.text, gold):
        return Grade(acc=True, pred=prediction, extraction=extracted.method)
    if not use_math_verify:
        return Grade(acc=False, pred=prediction, extraction=extracted.method)
    verdict = math_verify_equivalent(extracted.text, gold, timeout_s)
    return Grade(
        acc=verdict.equal,
        pred=prediction,
        extraction=extracted.method,
        verify_timeout=verdict.timed_out,
        parse_failed=verdict.parse_failed,
    )


def grade_multiple_choice(response: str, ground_truth: str, question: str | None) -> Grade:
    """Grades a multiple-choice response by its option letter (options parsed from ``question`` when given)."""
    choices = parse_choices(question)
    extracted = extract_choice_letter(response, choices)
    gold = unbox_ground_truth(ground_truth).strip("() .").upper()
    return Grade(acc=bool(extracted.text) and extracted.text == gold, pred=extracted.text, extraction=extracted.method)


def _score_format(format: str | None, zero_one_by_name: bool) -> str:  # noqa: A002  (the reward kwarg's name)
    if format is None or format == "auto":
        return FORMAT_ZERO_ONE if zero_one_by_name else FORMAT_PLUS_MINUS
    if format not in _SCORE_VALUES:
        raise ValueError(
            f"reward_kwargs.format={format!r} is not supported; use 'plus_minus' (+1/-1), 'zero_one' (1/0) or "
            "leave it unset (zero_one for *01 data sources, plus_minus otherwise)."
        )
    return format


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    format: str | None = None,  # noqa: A002  (the reward kwarg's name)
    timeout_s: float = DEFAULT_TIMEOUT_S,
    use_math_verify: bool = True,
    **kwargs: Any,
) -> dict[str, Any]:
    """Scores one response; the signature verl's reward managers call.

    Args:
        data_source: the row's ``data_source``; selects the route (see the module doc).
        solution_str: the decoded response.
        ground_truth: ``reward_model.ground_truth``: a final answer (``"\\frac{1}{2}"``, ``"204"``, ``"C"``); a
            boxed answer is unboxed; a list/array of answers accepts any of them.
        extra_info: the row's ``extra_info``; ``question`` is used to read multiple-choice option texts.
        format: ``None``/``"auto"``, ``"plus_minus"`` or ``"zero_one"``.
        timeout_s: hard wall-clock limit of the math-verify step per call (``<= 0`` disables it).
        use_math_verify: False compares math answers by the string rule only.
        **kwargs: further keywords verl passes (e.g. ``reward_router_address``); ignored.

    Returns:
        ``{"score": float, "acc": bool, "pred": str, "route": str, "extraction": str, "verify_timeout": int,
        "parse_failed": int}`` with the same keys for every route.
    """
    route, zero_one_by_name = resolve_route(data_source)
    correct_score, wrong_score = _SCORE_VALUES[_score_format(format, zero_one_by_name)]
    if timeout_s is not None and not isinstance(timeout_s, int | float):
        raise ValueError(f"reward_kwargs.timeout_s must be a number of seconds, got {timeout_s!r}.")

    response = _as_text(solution_str)
    answers = [_as_text(item) for item in ground_truth] if isinstance(ground_truth, list | tuple) else None
    if answers is None and hasattr(ground_truth, "tolist") and not isinstance(ground_truth, str):
        answers = [_as_text(item) for item in ground_truth.tolist()]  # numpy arrays from parquet
    answers = answers if answers is not None else [_as_text(ground_truth)]
    question = extra_info.get("question") if isinstance(extra_info, dict) else None

    grade = Grade(acc=False, pred="", extraction="none")
    try:
        for answer in answers:
            if route == ROUTE_MULTIPLE_CHOICE:
                grade = grade_multiple_choice(response, answer, _as_text(question) if question else None)
            else:
                grade = grade_math(response, answer, timeout_s, use_math_verify)
            if grade.acc:
                break
    except Exception:  # grading must never stop a training run; the response is scored as wrong
        logger.warning("reward grading failed for data_source %r; scored as wrong.", data_source, exc_info=True)
        grade = Grade(acc=False, pred="", extraction="error", parse_failed=True)

    return {
        "score": correct_score if grade.acc else wrong_score,
        "acc": grade.acc,
        "pred": grade.pred[:MAX_PRED_CHARS],
        "route": route,
        "extraction": grade.extraction,
        "verify_timeout": int(grade.verify_timeout),
        "parse_failed": int(grade.parse_failed),
    }
