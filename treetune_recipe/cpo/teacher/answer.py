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
"""The answer-only teacher context: the dataset's final answer (``reward_model.ground_truth``) after the question.

The wording is SDPG's (``lauyikfung/SDPG`` @ f71329e, ``README.md`` l.30-52, the context its SDPG, OPSD and RLSD runs
share)::

    The correct answer to this problem is: {answer}
    Use this to verify your reasoning, but show your full solution process.

SDPG stores it in the data: the first user message is ``question + "[TEACHER_CONTEXT_TOKEN]" + context``, and its
dataset (``verl/utils/dataset/rl_dataset.py`` l.367-394, ``_split_teacher_context``) gives the student the text before
the sentinel and the teacher the same message with the sentinel removed: the context is appended to the question inside
the user message, with no separator besides what the context text itself holds. The recipe builds it from the row
instead: the last message of the row's chat (``raw_prompt[-1]``, the question with the dataset's instruction), then
``"\\n\\n"``, then the filled wording; earlier messages (a system prompt) stay as they are. A row whose answer is
missing, NaN or blank has no context.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from treetune_recipe.cpo.teacher.hint import mapping_text

#: SDPG's teacher context (README.md l.49-53), ``{answer}`` the dataset's final answer.
ANSWER_TEMPLATE = (
    "The correct answer to this problem is: {answer}\nUse this to verify your reasoning, but show your full "
    "solution process."
)
#: Between the question and the context (SDPG's data holds the separator inside its context text).
ANSWER_SEPARATOR = "\n\n"
#: Where verl's dataset keeps a row's answer: ``non_tensor_batch["reward_model"][i]["ground_truth"]``.
ANSWER_COLUMN = "reward_model"
ANSWER_KEY = "ground_truth"


def row_answer(reward_model: Mapping[str, Any] | None) -> str:
    """The answer a row's teacher is shown: ``reward_model["ground_truth"]`` as text, ``''`` when missing or blank."""
    return mapping_text(reward_model if isinstance(reward_model, Mapping) else None, ANSWER_KEY)


def answer_teacher_message(prompt_text: str, answer: str) -> str:
    """prompt + "\\n\\n" + SDPG's context with ``answer`` (inserted verbatim: braces in it stay as they are)."""
    return prompt_text + ANSWER_SEPARATOR + ANSWER_TEMPLATE.replace("{answer}", answer)
