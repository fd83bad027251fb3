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
"""SDPO's environment-feedback section: the reward function's feedback on a row's own response, in the teacher's
re-prompt (the ``environment_feedback`` context of :mod:`treetune_recipe.cpo.teacher.contexts`).

Follows ``lasgroup/SDPO`` @ 0e6d5106abe69f578c63bf38a9394e22905c8773, ``verl/trainer/ppo/ray_trainer.py``:

- ``_collect_feedback`` (l.610-634): the feedback of row i is ``reward_extra_infos_dict["feedback"][i]``, kept only
  when it is a non-empty string once stripped (the text itself is used unstripped); anything else is no feedback.
  The recipe reads the same values where verl 0.9.1 keeps the reward function's extra dict,
  ``batch.non_tensor_batch[key]`` (``verl/trainer/ppo/reward.py:extract_reward``), ``key`` = ``cpo.feedback.key``.
- ``_build_teacher_message`` (l.710-745): ``use_feedback = has_feedback and (not
  environment_feedback_only_without_solution or not has_solution)``; the user message is ``reprompt_template`` filled
  with the solution section (when a successful sibling exists) and the feedback section (when used), or the plain
  prompt when neither; earlier messages (system) stay.
- the distillation mask (l.766-778): a row is distilled when it has a solution or uses its feedback.
- the templates of ``verl/trainer/config/actor/actor.yaml`` (l.119-148, block scalars ``|-``): ``feedback_template``
  ``"\\nThe following is feedback from your unsuccessful earlier attempt:\\n\\n{feedback_raw}"``, the solution and
  re-prompt templates of :mod:`treetune_recipe.cpo.teacher.sibling`; published ``include_environment_feedback: True``
  and ``environment_feedback_only_without_solution: True``.

The recipe's context shows the feedback alone by default (``cpo.feedback.with_solution=false``): a row without
feedback has no context. ``cpo.feedback.with_solution=true`` is lasgroup's whole re-prompt: a successful sibling's
solution section too, with ``cpo.feedback.only_without_solution`` deciding whether a row with a sibling also shows
its feedback (published: it does not).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from treetune_recipe.cpo.teacher.sibling import REPROMPT_TEMPLATE, SOLUTION_SECTION
from treetune_verl.config_block import check_field_types, dataclass_from_block

#: actor.yaml's ``feedback_template`` as Hydra loads it (a leading newline, no trailing one).
FEEDBACK_SECTION = "\nThe following is feedback from your unsuccessful earlier attempt:\n\n{feedback_raw}"


def _config_field(default: Any, help_text: str) -> Any:
    return dataclasses.field(default=default, metadata={"help": help_text})


@dataclasses.dataclass(frozen=True)
class FeedbackConfig:
    """``cpo.feedback.*``: the environment-feedback context (see the module docstring)."""

    key: str = _config_field(
        "feedback",
        "Key of the reward function's extra info holding the feedback text (verl keeps it in "
        "non_tensor_batch[key]); lasgroup's reward functions return it as 'feedback'.",
    )
    with_solution: bool = _config_field(
        False,
        "Also show a successful sibling's response before the feedback, as lasgroup's SDPO re-prompt does "
        "(include_environment_feedback); false: the feedback alone, and a row without feedback has no context.",
    )
    only_without_solution: bool = _config_field(
        True,
        "With with_solution: a row that shows a sibling's solution does not show its feedback "
        "(lasgroup's environment_feedback_only_without_solution, published true).",
    )

    def __post_init__(self):
        check_field_types(self, "cpo.feedback")
        if not self.key:
            raise ValueError(f"cpo.feedback.key must be a non-empty string, got {self.key!r}.")

    @classmethod
    def from_config(cls, config: Any = None) -> FeedbackConfig:
        """Build from the ``cpo.feedback`` block (dict, OmegaConf node, ``FeedbackConfig`` or None: all defaults)."""
        return dataclass_from_block(cls, config, "cpo.feedback")


def row_feedback(value: Any) -> str | None:
    """A row's feedback as lasgroup keeps it: the string itself when it is non-empty once stripped, else None."""
    return value if isinstance(value, str) and value.strip() else None


def feedback_used(has_feedback: bool, has_solution: bool, only_without_solution: bool) -> bool:
    """lasgroup's ``use_feedback``: feedback exists, and either it may sit beside a solution or there is none."""
    return has_feedback and (not only_without_solution or not has_solution)


def feedback_teacher_message(
    prompt_text: str, feedback: str | None, solution: str | None, *, only_without_solution: bool = True
) -> str | None:
    """The teacher's user message of a row (lasgroup's ``_build_teacher_message``), or None when the row shows
    neither a solution nor its feedback (it then has no context).

    Args:
        prompt_text: the content of the row's last chat message.
        feedback: the row's feedback (:func:`row_feedback`), or None.
        solution: a successful sibling's response text (thinking stripped), or None.
        only_without_solution: ``environment_feedback_only_without_solution``.
    """
    use_feedback = feedback_used(feedback is not None, solution is not None, only_without_solution)
    if not use_feedback and solution is None:
        return None
    return REPROMPT_TEMPLATE.format(
        prompt=prompt_text,
        solution=SOLUTION_SECTION.format(successful_previous_attempt=solution) if solution is not None else "",
        feedback=FEEDBACK_SECTION.format(feedback_raw=feedback) if use_feedback else "",
    )
