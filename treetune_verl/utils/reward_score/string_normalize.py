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
"""Normalised string comparison of final answers (the rule-based fallback of the math grader).

The rules follow the reference's normaliser (its ``utils.strip_string``),
applied in the same order, with three deliberate changes:

* ``and`` is deleted only as a whole word (the reference deleted every substring, which turns ``\\langle`` into
  ``\\le``);
* a number written with thousands separators (``1,000,000``) loses its commas, so it equals ``1000000``;
* the normaliser never raises: the steps are plain string and regex operations on a ``str``.
"""

from __future__ import annotations

import re

_TRAILING_TEXT_GROUP = re.compile(r"\\text\{.*?\}$")
_MBOX_GROUP = re.compile(r"\\mbox\{.*?\}")
_WORD_AND = re.compile(r"\band\b")
_DECIMAL_ZEROS_INSIDE = re.compile(r"(\d+)\.0+([^\d])")
_DECIMAL_ZEROS_AT_END = re.compile(r"(\d+)\.0+$")
_SQRT_WITHOUT_BRACES = re.compile(r"\\sqrt(\w+)")
_THOUSANDS_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_INTEGER = re.compile(r"-?\d+")


def _read_frac_argument(text: str, start: int) -> tuple[str, int]:
    """Reads one ``\\frac`` argument at ``start``: a balanced ``{...}`` group or a single character.

    Returns:
        (argument without braces, index after it); ("", start) when there is nothing to read.
    """
    if start >= len(text):
        return "", start
    if text[start] != "{":
        return text[start], start + 1
    depth = 0
    for position in range(start, len(text)):
        if text[position] == "{":
            depth += 1
        elif text[position] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : position], position + 1
    return text[start + 1 :], len(text)


def _brace_fractions(text: str) -> str:
    """Rewrites ``\\frac12``, ``\\frac1{2}`` and ``\\frac{1}2`` as ``\\frac{1}{2}``."""
    pieces = text.split("\\frac")
    rebuilt = [pieces[0]]
    for piece in pieces[1:]:
        numerator, after_numerator = _read_frac_argument(piece, 0)
        denominator, after_denominator = _read_frac_argument(piece, after_numerator)
        if not numerator or not denominator:
            rebuilt.append("\\frac" + piece)
            continue
        rebuilt.append("\\frac{" + numerator + "}{" + denominator + "}" + piece[after_denominator:])
    return "".join(rebuilt)


def _slash_to_frac(text: str) -> str:
    """Rewrites ``a/b`` as ``\\frac{a}{b}`` when both parts are integers or contain ``sqrt``."""
    if text.count("/") != 1:
        return text
    numerator, denominator = text.split("/")
    both_integers = bool(_INTEGER.fullmatch(numerator)) and bool(_INTEGER.fullmatch(denominator))
    has_root = ("sqrt" in numerator or "sqrt" in denominator) and numerator and denominator
    if both_integers or has_root:
        return "\\frac{" + numerator + "}{" + denominator + "}"
    return text


def normalize_answer(answer: str | None) -> str:
    """Normalises a final answer string for exact comparison.

    Args:
        answer: an extracted answer or a ground truth, e.g. ``"\\dfrac{1}{2}"`` or ``"10\\text{ cm}"``.

    Returns:
        The normalised string, e.g. ``"\\frac{1}{2}"`` or ``"10"``; ``""`` for ``None`` or blank input.
    """
    if answer is None:
        return ""
    text = str(answer).strip().replace("\n", "").rstrip(".")
    text = text.replace("\\!", "").replace("\\ ", "")
    text = text.replace("\\\\", "\\").replace("\\\\", "\\")
    text = text.replace("tfrac", "frac").replace("dfrac", "frac")
    text = text.replace("\\left", "").replace("\\right", "")

    without_unit = _TRAILING_TEXT_GROUP.sub("", text).strip()
    if without_unit:
        text = without_unit
    for token in ("^{\\circ}", "^\\circ", "\\$", "$", "\\text", "x\\in", "\\%", "%"):
        text = text.replace(token, "")

    text = text.replace(" .", " 0.").replace("{.", "{0.").replace("\\cdot", "")
    text = text.replace("infinity", "\\infty")
    if "\\infty" not in text:
        text = text.replace("inf", "\\infty")
    text = _WORD_AND.sub("", text).replace("\\mathbf", "")
    text = _MBOX_GROUP.sub("", text)
    if "j" in text and "i" not in text:
        text = text.replace("j", "i")
    text = _DECIMAL_ZEROS_INSIDE.sub(r"\1\2", text)
    text = _DECIMAL_ZEROS_AT_END.sub(r"\1", text)

    if not text:
        return text
    if text[0] == ".":
        text = "0" + text
    if text.count("=") == 1:
        left, right = text.split("=")
        if len(left.strip()) <= 2:
            text = right
    text = _SQRT_WITHOUT_BRACES.sub(r"\\sqrt{\1}", text)
    text = text.replace(" ", "")
    if _THOUSANDS_NUMBER.fullmatch(text):
        text = text.replace(",", "")
    text = _brace_fractions(text)
    return _slash_to_frac(text)


def strings_equivalent(prediction: str | None, ground_truth: str | None) -> bool:
    """True when both answers are non-empty and equal after :func:`normalize_answer`."""
    normalized_prediction = normalize_answer(prediction)
    return bool(normalized_prediction) and normalized_prediction == normalize_answer(ground_truth)
