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
"""Final-answer extraction from model responses (math and multiple choice).

Order for math answers (the reference fork's ``extract_answer_math``):

1. the content of the last ``\\boxed{...}`` / ``\\fbox{...}`` with balanced braces (``\\boxed 5`` also works);
2. otherwise the text after the last "the answer is";
3. otherwise the last number in the text (commas removed).

Thinking models: only the text after the last ``</think>`` is read. A response that opens ``<think>`` and never
closes it has no final answer (its boxes are scratch work), which the method ``"unfinished_think"`` reports.

Multiple choice reads the same places (box, then "answer is"/"answer:", then a last line holding only an option)
and accepts a letter only in an option-like form (``B``, ``(B)``, ``B)``, ``B.``, ``\\text{(B)}``, ``(B) text``). A
boxed option *text* such as ``Benzene`` or ``A decrease in pressure`` is not read as a letter; it is matched
against the option texts listed in the question instead, when those are known.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

METHOD_BOXED = "boxed"
METHOD_ANSWER_IS = "answer_is"
METHOD_LAST_NUMBER = "last_number"
METHOD_OPTION_TEXT = "option_text"
METHOD_LAST_LINE = "last_line"
METHOD_NONE = "none"
METHOD_UNFINISHED_THINK = "unfinished_think"

_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)")
_NUMBER = re.compile(r"-?\d*\.?\d+")
_ANSWER_IS = "he answer is"
_CHOICE_ANSWER_PHRASE = re.compile(r"answer\s*(?:is|:)\s*(?:option|choice)?\s*:?", re.IGNORECASE)
_LATEX_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_LETTER_ALONE = re.compile(r"[\(\[]?\s*([A-Za-z])\s*[\)\]]?")
_LETTER_IN_BRACKETS_THEN_TEXT = re.compile(r"[\(\[]\s*([A-Za-z])\s*[\)\]](?:\s|:|\.|$)")
_UPPER_LETTER_THEN_PUNCTUATION = re.compile(r"([A-Z])[\).:](?:\s|$)")
_CHOICE_LINE = re.compile(r"^\s*\(?([A-J])\)?\s*[:.)]\s*(.+?)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class ExtractedAnswer:
    """A final answer read from a response.

    Attributes:
        text: the answer as written (stripped of ``$`` delimiters, not normalised); ``""`` when none was found.
        method: where it came from: ``boxed``, ``answer_is``, ``last_number``, ``option_text``, ``last_line``,
            ``none`` or ``unfinished_think``.
    """

    text: str
    method: str


def final_segment(response: str) -> str | None:
    """The part of a response that holds the final answer.

    Returns:
        The text after the last ``</think>``; the whole text when no think tag is present; ``None`` when a
        ``<think>`` block was opened and never closed.
    """
    close_at = response.rfind(THINK_CLOSE)
    if close_at >= 0:
        return response[close_at + len(THINK_CLOSE) :]
    if THINK_OPEN in response:
        return None
    return response


def _balanced_group(text: str, open_at: int) -> str:
    """Content of the ``{...}`` group opening at ``open_at``; everything after it when the group never closes."""
    depth = 0
    for position in range(open_at, len(text)):
        character = text[position]
        if character == "{":
            depth += 1
        elif character == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : position]
    return text[open_at + 1 :]


def last_boxed_content(text: str) -> str | None:
    """Content of the last ``\\boxed``/``\\fbox`` in ``text`` (``None`` when there is none).

    ``\\boxed{a{b}c}`` gives ``a{b}c``; ``\\boxed 5$`` gives ``5`` (up to the first ``$``); an empty box gives ``""``.
    """
    last_match = None
    for last_match in _BOX_COMMAND.finditer(text):  # noqa: B007  (only the last match is wanted)
        pass
    if last_match is None:
        return None
    rest = text[last_match.end() :]
    stripped = rest.lstrip()
    if stripped.startswith("{"):
        return _balanced_group(stripped, 0).strip()
    return stripped.split("$", 1)[0].strip()


def _clean_answer_text(text: str, keep_lines: bool) -> str:
    """The reference's post-processing: first line only, one leading ``:``, trailing ``.``/``/`` dropped."""
    text = text.replace("\n", " ") if keep_lines else text.split("\n", 1)[0]
    text = text.strip()
    if text.startswith(":"):
        text = text[1:].strip()
    if text.endswith("."):
        text = text[:-1]
    if text.endswith("/"):
        text = text[:-1]
    text = text.strip()
    if len(text) >= 2 and text.startswith("$") and text.endswith("$"):
        text = text.strip("$").strip()
    return text


def extract_math_answer(response: str) -> ExtractedAnswer:
    """Reads the final math answer of a response (box, then "the answer is", then the last number).

    Args:
        response: the decoded response text (may contain ``<think>...</think>``).

    Returns:
        An :class:`ExtractedAnswer`; ``text`` is ``""`` with method ``none`` when nothing was found.
    """
    segment = final_segment(response or "")
    if segment is None:
        return ExtractedAnswer("", METHOD_UNFINISHED_THINK)
    boxed = last_boxed_content(segment)
    if boxed is not None:
        return ExtractedAnswer(_clean_answer_text(boxed, keep_lines=True), METHOD_BOXED)
    answer_at = segment.rfind(_ANSWER_IS)
    if answer_at >= 0:
        after = segment[answer_at + len(_ANSWER_IS) :]
        return ExtractedAnswer(_clean_answer_text(after, keep_lines=False), METHOD_ANSWER_IS)
    numbers = _NUMBER.findall(segment.replace(",", ""))
    if numbers:
        return ExtractedAnswer(numbers[-1], METHOD_LAST_NUMBER)
    return ExtractedAnswer("", METHOD_NONE)


def unbox_ground_truth(ground_truth: str) -> str:
    """A ground truth as a bare answer: the content of its last box when it has one, else itself, stripped."""
    boxed = last_boxed_content(ground_truth)
    return (boxed if boxed is not None else ground_truth).strip()


def parse_choices(question: str | None) -> dict[str, str]:
    """Option texts listed in a question, one per line: ``(A): text``, ``A) text``, ``A. text``.

    Returns:
        ``{"A": "text", ...}`` when the lines form a run A, B, C, ... of at least two options, else ``{}``.
    """
    if not question:
        return {}
    choices: dict[str, str] = {}
    for match in _CHOICE_LINE.finditer(question):
        letter, option_text = match.group(1), match.group(2)
        if ord(letter) - ord("A") == len(choices):
            choices[letter] = option_text
        elif letter == "A":
            choices = {"A": option_text}  # a later, complete list wins over an earlier stray "A." line
    return choices if len(choices) >= 2 else {}


def _strip_markup(text: str) -> str:
    previous = None
    while previous != text:
        previous = text
        text = _LATEX_TEXT_WRAPPER.sub(r"\1", text)
    for token in ("**", "$", "\\(", "\\)", "\\[", "\\]"):
        text = text.replace(token, "")
    return text.strip()


def letter_from_option_text(candidate: str, valid_letters: str) -> str | None:
    """The option letter written in ``candidate``, or ``None`` when it is not written as an option.

    Accepted: ``B``, ``(B)``, ``[B]``, ``B)``, ``(B) some text``, ``B. some text``, ``B: some text`` (upper case for
    the last three). Rejected: ``Benzene``, ``A decrease in pressure``, letters outside ``valid_letters``.
    """
    cleaned = _strip_markup(candidate)
    for pattern in (_LETTER_ALONE, _LETTER_IN_BRACKETS_THEN_TEXT, _UPPER_LETTER_THEN_PUNCTUATION):
        match = pattern.fullmatch(cleaned) if pattern is _LETTER_ALONE else pattern.match(cleaned)
        if match and match.group(1).upper() in valid_letters:
            return match.group(1).upper()
    return None


def _normalize_option_text(text: str) -> str:
    return " ".join(_strip_markup(text).lower().rstrip(".").split())


def extract_choice_letter(response: str, choices: dict[str, str] | None = None) -> ExtractedAnswer:
    """Reads the chosen option letter of a multiple-choice response.

    Args:
        response: the decoded response text.
        choices: the options ``{"A": text, ...}`` from :func:`parse_choices`; when given, only their letters are
            valid and a boxed/stated option text is mapped to its letter.

    Returns:
        An :class:`ExtractedAnswer` whose ``text`` is an upper-case letter, or ``""`` when none was found.
    """
    segment = final_segment(response or "")
    if segment is None:
        return ExtractedAnswer("", METHOD_UNFINISHED_THINK)
    valid_letters = "".join(choices) if choices else "ABCDEFGHIJ"

    stated: list[tuple[str, str]] = []
    boxed = last_boxed_content(segment)
    if boxed is not None:
        stated.append((boxed, METHOD_BOXED))
    else:
        phrases = list(_CHOICE_ANSWER_PHRASE.finditer(segment))
        if phrases:
            stated.append((_clean_answer_text(segment[phrases[-1].end() :], keep_lines=False), METHOD_ANSWER_IS))
    for candidate, method in stated:
        letter = letter_from_option_text(candidate, valid_letters)
        if letter:
            return ExtractedAnswer(letter, method)
        if choices:
            wanted = _normalize_option_text(candidate)
            for option_letter, option_text in choices.items():
                if wanted and wanted == _normalize_option_text(option_text):
                    return ExtractedAnswer(option_letter, METHOD_OPTION_TEXT)
    if not stated:
        lines = [line for line in segment.strip().splitlines() if line.strip()]
        if lines:
            letter = letter_from_option_text(_clean_answer_text(lines[-1], keep_lines=False), valid_letters)
            if letter:
                return ExtractedAnswer(letter, METHOD_LAST_LINE)
    return ExtractedAnswer("", METHOD_NONE)
