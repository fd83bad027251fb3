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
"""SDPO's teacher context: a successful sibling's response from the same prompt group, put into the teacher's prompt.

Follows ``lasgroup/SDPO`` @ 0e6d5106abe69f578c63bf38a9394e22905c8773 (a verl fork),
``verl/trainer/ppo/ray_trainer.py`` ``_collect_solutions_by_uid`` / ``_remove_thinking_trace`` / ``_get_solution`` /
``_maybe_build_self_distillation_batch`` (l.636-796) and the templates of ``verl/trainer/config/actor/actor.yaml``
(l.79-147), the published configuration: ``dont_reprompt_on_self_success: True``,
``remove_thinking_from_demonstration: True``, ``success_reward_threshold: 0.5`` (a row succeeds when its summed reward
is ≥ the threshold: the caller's ``success``).

Outside this module (the caller's): the teacher's chat is the original prompt's earlier messages (system) plus one user
message, :func:`sibling_teacher_message`, rendered with the chat template (``add_generation_prompt=True``, the data's
``enable_thinking``), truncated to ``max_reprompt_len`` = 10240 tokens (right side) and followed by the student's own
response tokens; a row without a sibling (−1) keeps its plain prompt and is masked out of the distillation loss
(``self_distillation_mask``). SDPO's environment-feedback section (``include_environment_feedback``) is the
``environment_feedback`` context (:mod:`treetune_recipe.cpo.teacher.feedback`); with math rewards there is no feedback
text, and with the published ``environment_feedback_only_without_solution`` a row with a solution never uses it.
"""

import re
from collections.abc import Hashable, Sequence

import numpy as np

# lasgroup's regex: a closed block and the whitespace after it; an unclosed "<think>" (or a lone "</think>") is kept.
_THINK_BLOCK = re.compile(r"<think>.*?</think>\s*", flags=re.DOTALL)

# actor.yaml's block scalars (``|-``: no final newline), as Hydra loads them; the dataclass defaults in
# verl/workers/config/actor.py differ (a trailing "\n\n" after the solution and "\n" at the end) but are overridden.
SOLUTION_SECTION = "\nCorrect solution:\n\n{successful_previous_attempt}"
REPROMPT_TEMPLATE = "{prompt}{solution}{feedback}\n\nCorrectly solve the original question."


def strip_thinking(text: str) -> str:
    """Remove every ``<think>…</think>`` block and the whitespace that follows it (regex ``<think>.*?</think>\\s*``,
    non-greedy, across lines).

    lasgroup's ``_remove_thinking_trace`` (``ray_trainer.py:646-648``), applied to the sibling's decoded response
    when ``remove_thinking_from_demonstration`` (published: True). As there: an unclosed ``<think>`` is left in place
    (the whole text is kept), text before a block keeps its whitespace, and the result is not otherwise stripped
    (TRL's port strips the result; lasgroup does not).
    """
    return _THINK_BLOCK.sub("", text)


def choose_successful_siblings(
    uids: Sequence[Hashable] | np.ndarray, success: Sequence[bool] | np.ndarray, *, exclude_self: bool = True
) -> np.ndarray:
    """j(i) = min{ j : uid_j = uid_i, success_j, (j ≠ i if exclude_self) }, −1 when the set is empty. ``[B] -> [B]``.

    lasgroup's ``_get_solution`` (``ray_trainer.py:650-669``): the successful rows of each uid in batch order
    (``_collect_solutions_by_uid``, l.636-643), the row itself dropped when ``dont_reprompt_on_self_success``
    (published: True; ``exclude_self``), then the FIRST one. Deterministic, no random draw: the official comment
    notes that the first of i.i.d. samples is effectively a random one. So a correct row gets another correct
    sibling (−1 if it is its group's only success), every other row of a group with a success gets the group's
    first success, and all rows of a group without one get −1 (masked out of the loss).

    Args:
        uids: ``[B]`` prompt-group ids (any hashable values, e.g. verl's ``non_tensor_batch["uid"]``).
        success: ``[B]`` bool, the row's summed reward ≥ ``success_reward_threshold``.
        exclude_self: never pick the row itself.

    Returns:
        ``[B]`` int64 index into the batch of the sibling whose response is the row's teacher context, or −1.
    """
    uids = list(uids)
    success = np.asarray(success)
    if success.dtype != np.bool_:
        raise TypeError(
            f"success must be a bool array, got dtype {success.dtype}; pass rewards >= success_reward_threshold "
            "(SDPO publishes 0.5)"
        )
    if success.shape != (len(uids),):
        raise ValueError(f"uids and success must both be [B]; got {len(uids)} uids and success of {success.shape}")
    successes_by_uid: dict[Hashable, list[int]] = {}
    for row, (uid, ok) in enumerate(zip(uids, success)):
        if ok:
            successes_by_uid.setdefault(uid, []).append(row)
    chosen = np.full(len(uids), -1, dtype=np.int64)
    for row, uid in enumerate(uids):
        for candidate in successes_by_uid.get(uid, ()):
            if not (exclude_self and candidate == row):
                chosen[row] = candidate
                break
    return chosen


def sibling_teacher_message(prompt_text: str, sibling_response_text: str) -> str:
    """prompt + "\\nCorrect solution:\\n\\n" + sibling response + "\\n\\nCorrectly solve the original question."

    The teacher's user message (lasgroup ``_build_teacher_message``, ``ray_trainer.py:710-745``, with ``actor.yaml``'s
    ``reprompt_template`` and ``solution_template``, l.130-141, and no feedback section). ``prompt_text`` is the
    content of the original prompt's LAST message (``raw_prompt[-1]["content"]``: the user question with whatever
    instruction the dataset appends); earlier messages stay as they are. ``sibling_response_text`` is the sibling's
    decoded response (``skip_special_tokens=True``), passed through :func:`strip_thinking` first under the published
    configuration.
    """
    solution = SOLUTION_SECTION.format(successful_previous_attempt=sibling_response_text)
    return REPROMPT_TEMPLATE.format(prompt=prompt_text, solution=solution, feedback="")
