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
"""The teacher's privileged contexts, as objects in a registry: the same responses under a prompt that holds the
context, and which rows have one.

A context (:class:`TeacherContext`) has a ``name`` (the value of ``cpo.context`` and of ``Method.context``), a
one-line ``describe``, the data it reads (:meth:`TeacherContext.needs`, which the preflight checks), the limit of its
teacher prompt (:meth:`TeacherContext.resolve_hint`) and :meth:`TeacherContext.build`, which turns the trainer's batch
into the teacher's batch: left-padded teacher prompts, the same responses, positions continued from each prompt's end
(the layout of :func:`treetune_recipe.cpo.teacher.hint.build_hint_batch`), and a bool ``[B]`` of the rows that have a
context. Both teacher passes of the trainer build their rows here: an advantage method's pass before the update and a
distribution-level method's teacher inside it. :data:`CONTEXTS` holds them by name, in this order:

- ``gold_solution``: the hint-guided prompt of :func:`treetune_recipe.cpo.teacher.hint.build_hint_batch` (the
  dataset's worked solution, ``extra_info.<cpo.hint.solution_key>``); a row of a group without a solution
  (``cpo.hint.on_missing=skip``) has no context.
- ``answer_only``: the dataset's final answer (``reward_model.ground_truth``) after the question, in SDPG's wording
  (:mod:`treetune_recipe.cpo.teacher.answer`); a row without an answer has no context.
- ``successful_sibling``: SDPO's re-prompt (:mod:`treetune_recipe.cpo.teacher.sibling`): the row's own chat messages,
  the last one followed by a response of the same group that the verifier accepted (thinking stripped), chosen by
  :func:`choose_successful_siblings`; a row without such a sibling has no context.
- ``environment_feedback``: SDPO's feedback section (:mod:`treetune_recipe.cpo.teacher.feedback`): the reward
  function's feedback on the row's own response (``non_tensor_batch[cpo.feedback.key]``); a row without feedback has
  no context (``cpo.feedback.with_solution`` adds a successful sibling's solution, lasgroup's whole re-prompt).

In the three re-prompted contexts a teacher prompt longer than its limit leaves its row without a context (counted in
``cpo/context_too_long_frac``); the gold solution is cut from its front instead. The limit is
``cpo.hint.max_prompt_length`` when set; otherwise ``data.max_prompt_length`` + ``cpo.hint.max_prompt_length_margin``
(512), plus ``data.max_response_length`` for the contexts that may hold a whole response (a sibling's, or feedback on
one, :attr:`TeacherContext.holds_a_response`), as in SDPO's official runs (prompt limit 10,240 = 2,048 + 8,192, no
margin, for every re-prompt).

Adding a context: a subclass with ``name``, ``describe``, ``holds_a_response``, ``needs`` and ``_build`` (usually
contents for :func:`reprompt_batch`), registered with :func:`register_context`. This module imports no method module:
the methods import it (``Method.context`` is checked against :data:`CONTEXTS`).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from verl import DataProto

from treetune_recipe.cpo.teacher.answer import ANSWER_COLUMN, ANSWER_KEY, answer_teacher_message, row_answer
from treetune_recipe.cpo.teacher.feedback import FeedbackConfig, feedback_teacher_message, feedback_used, row_feedback
from treetune_recipe.cpo.teacher.hint import HintConfig, build_hint_batch, left_pad, plain_mapping, reprompted_batch
from treetune_recipe.cpo.teacher.sibling import choose_successful_siblings, sibling_teacher_message, strip_thinking

#: What the step must hold for a sibling: the rows' success (the caller's ``success``).
SIBLING_NEED = "a response of the same prompt group that the verifier accepted (reward == cpo.success_value)"


@dataclasses.dataclass(frozen=True)
class ContextNeeds:
    """What a context reads: ``columns`` of every training row (dotted, e.g. ``extra_info.solution``: the preflight
    reads them in ``data.train_files``), and what only the step itself holds (``step``, named for the log)."""

    columns: tuple[str, ...] = ()
    step: tuple[str, ...] = ()


class TeacherContext(abc.ABC):
    """One privileged context of the teacher's prompt (see the module docstring)."""

    #: The selector value (``cpo.context``, ``Method.context``).
    name: str = ""
    #: One line for the start-up log: what the teacher is shown.
    describe: str = ""
    #: The teacher prompt may hold a whole response: its limit adds ``data.max_response_length``.
    holds_a_response: bool = False

    @abc.abstractmethod
    def needs(self, cpo: Any) -> ContextNeeds:
        """The data this context reads under the run's ``cpo`` block (its keys name the columns)."""

    def resolve_hint(self, hint: HintConfig, max_prompt_length: int, max_response_length: int) -> HintConfig:
        """``hint`` with the teacher prompt's limit set: ``hint.max_prompt_length`` when set, else
        ``max_prompt_length`` + margin, plus ``max_response_length`` when :attr:`holds_a_response`."""
        if self.holds_a_response and hint.max_prompt_length is None:
            limit = int(max_prompt_length) + int(max_response_length) + hint.max_prompt_length_margin
            return dataclasses.replace(hint, max_prompt_length=limit)
        return hint.resolve(max_prompt_length)

    def build(
        self,
        batch: DataProto,
        *,
        tokenizer,
        hint_config: HintConfig,
        success: torch.Tensor | None = None,
        cpo: Any = None,
        rows: torch.Tensor | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> tuple[DataProto, torch.Tensor, dict[str, float]]:
        """The teacher batch of ``batch``'s rows ``rows`` (same order, same responses) under this context.

        Args:
            batch: the trainer's batch (``prompts``, ``responses``, ``response_mask``, ``attention_mask``,
                ``position_ids``; ``uid``, ``raw_prompt``, ``extra_info``, ``reward_model`` and the reward's extra
                info as the context reads them).
            tokenizer: the actor's tokenizer.
            hint_config: resolved (:meth:`resolve_hint`); the width limit of every teacher prompt.
            success: bool ``[B]``, the rows the verifier accepted (``seq_reward == cpo.success_value``); a sibling
                needs it.
            cpo: the run's ``CPOConfig`` (``knobs.exclude_self`` of the method when it has one, else True;
                ``feedback``); None: the defaults.
            rows: bool ``[B]``, the rows to build (None: all); a group's other rows are still read (its siblings).
            chat_template_kwargs: the data's ``apply_chat_template_kwargs``.

        Returns:
            ``(teacher_batch [N rows], has_context bool [N], metrics)``, N = the rows built; metrics: the
            context's own and ``cpo/context_frac`` (the share of the built rows with a context).
        """
        index = np.arange(len(batch)) if rows is None else np.flatnonzero(torch.as_tensor(rows).cpu().numpy())
        selected = batch if len(index) == len(batch) else batch.select_idxs(torch.as_tensor(rows))
        teacher_batch, has_context, metrics = self._build(
            batch, selected, index, tokenizer, hint_config, success, cpo, chat_template_kwargs
        )
        metrics["cpo/context_frac"] = has_context.float().mean().item() if len(has_context) else 0.0
        return teacher_batch, has_context, metrics

    @abc.abstractmethod
    def _build(
        self,
        batch: DataProto,
        selected: DataProto,
        index: np.ndarray,
        tokenizer,
        hint_config: HintConfig,
        success: torch.Tensor | None,
        cpo: Any,
        chat_template_kwargs: Mapping[str, Any] | None,
    ) -> tuple[DataProto, torch.Tensor, dict[str, float]]:
        """The teacher rows of ``selected`` (= ``batch``'s rows ``index``)."""


CONTEXTS: dict[str, TeacherContext] = {}


def register_context(context: TeacherContext) -> TeacherContext:
    """Add ``context`` to :data:`CONTEXTS`; a name can be registered once."""
    if not context.name or context.name in CONTEXTS:
        raise ValueError(f"teacher context {context.name!r} has no name or is already registered.")
    CONTEXTS[context.name] = context
    return context


def get_context(name: str) -> TeacherContext:
    """The context registered as ``name``; ValueError listing the valid names otherwise."""
    if name not in CONTEXTS:
        raise ValueError(f"Unknown cpo.context {name!r}. Valid values: {', '.join(CONTEXTS)}.")
    return CONTEXTS[name]


class GoldSolution(TeacherContext):
    """The dataset's worked solution in the hint prompt (:func:`build_hint_batch`, ``cpo.hint.*``)."""

    name = "gold_solution"
    describe = "the dataset's gold worked solution, in the hint prompt (cpo.hint.*)"

    def needs(self, cpo: Any) -> ContextNeeds:
        return ContextNeeds(columns=(f"extra_info.{cpo.hint.solution_key}",))

    def _build(self, batch, selected, index, tokenizer, hint_config, success, cpo, chat_template_kwargs):
        teacher_batch, metrics = build_hint_batch(selected, tokenizer, hint_config, chat_template_kwargs)
        has_context = ~torch.as_tensor(teacher_batch.non_tensor_batch["hint_missing"].astype(bool))
        return teacher_batch, has_context, metrics


class AnswerOnly(TeacherContext):
    """The dataset's final answer after the question, in SDPG's wording (:mod:`treetune_recipe.cpo.teacher.answer`)."""

    name = "answer_only"
    describe = "the dataset's final answer (reward_model.ground_truth) after the question, in SDPG's wording"

    def needs(self, cpo: Any) -> ContextNeeds:
        return ContextNeeds(columns=(f"{ANSWER_COLUMN}.{ANSWER_KEY}",))

    def _build(self, batch, selected, index, tokenizer, hint_config, success, cpo, chat_template_kwargs):
        reward_models = selected.non_tensor_batch.get(ANSWER_COLUMN)
        answers = [row_answer(reward_models[row]) if reward_models is not None else "" for row in range(len(index))]
        contents = [
            answer_teacher_message(last, answer) if answer else None
            for last, answer in zip(last_messages(selected), answers)
        ]
        return reprompt_batch(selected, contents, tokenizer, hint_config.max_prompt_length, chat_template_kwargs)


class SuccessfulSibling(TeacherContext):
    """SDPO's re-prompt with a successful sibling's response (:mod:`treetune_recipe.cpo.teacher.sibling`)."""

    name = "successful_sibling"
    describe = "a response of the same prompt group that the verifier accepted, in SDPO's re-prompt"
    holds_a_response = True

    def needs(self, cpo: Any) -> ContextNeeds:
        return ContextNeeds(step=(SIBLING_NEED,))

    def _build(self, batch, selected, index, tokenizer, hint_config, success, cpo, chat_template_kwargs):
        texts = sibling_texts(batch, group_siblings(batch, success, cpo)[index], tokenizer)
        contents = [
            sibling_teacher_message(last, text) if text is not None else None
            for last, text in zip(last_messages(selected), texts)
        ]
        return reprompt_batch(selected, contents, tokenizer, hint_config.max_prompt_length, chat_template_kwargs)


class EnvironmentFeedback(TeacherContext):
    """SDPO's feedback section with the row's own feedback (:mod:`treetune_recipe.cpo.teacher.feedback`)."""

    name = "environment_feedback"
    describe = "the reward function's feedback on the row's own response, in SDPO's feedback section"
    holds_a_response = True  # feedback on a response (test output, a judge's text) is as long as one

    def needs(self, cpo: Any) -> ContextNeeds:
        config = _feedback_config(cpo)
        key = config.key
        step = (f"the reward function's extra info {key!r} (non_tensor_batch[{key!r}], cpo.feedback.key)",)
        return ContextNeeds(step=step + ((SIBLING_NEED,) if config.with_solution else ()))

    def _build(self, batch, selected, index, tokenizer, hint_config, success, cpo, chat_template_kwargs):
        config = _feedback_config(cpo)
        values = batch.non_tensor_batch.get(config.key)
        feedback = [row_feedback(values[row]) if values is not None else None for row in index.tolist()]
        solutions: list[str | None] = [None] * len(index)
        if config.with_solution:
            solutions = sibling_texts(batch, group_siblings(batch, success, cpo)[index], tokenizer)
        contents = [
            feedback_teacher_message(last, text, solution, only_without_solution=config.only_without_solution)
            for last, text, solution in zip(last_messages(selected), feedback, solutions)
        ]
        teacher_batch, has_context, metrics = reprompt_batch(
            selected, contents, tokenizer, hint_config.max_prompt_length, chat_template_kwargs
        )
        used = [
            feedback_used(text is not None, solution is not None, config.only_without_solution)
            for text, solution in zip(feedback, solutions)
        ]
        metrics["cpo/feedback_available_frac"] = float(np.mean([text is not None for text in feedback] or [0.0]))
        metrics["cpo/feedback_used_frac"] = float(np.mean(used or [0.0]))
        return teacher_batch, has_context, metrics


def _feedback_config(cpo: Any) -> FeedbackConfig:
    return getattr(cpo, "feedback", None) or FeedbackConfig()


def group_siblings(batch: DataProto, success: torch.Tensor | None, cpo: Any) -> np.ndarray:
    """Each row's successful sibling in ``batch`` (:func:`choose_successful_siblings`; −1: none), ``exclude_self`` the
    method's knob when it has one (SDPO's ``cpo.sdpo.exclude_self``), else True (lasgroup's published setting)."""
    if success is None:
        raise ValueError("a sibling context needs the rows the verifier accepted (success=).")
    exclude_self = getattr(getattr(cpo, "knobs", None), "exclude_self", True)
    return choose_successful_siblings(
        batch.non_tensor_batch["uid"], success.cpu().numpy().astype(bool), exclude_self=exclude_self
    )


def sibling_text(tokenizer, token_ids: list[int]) -> str:
    """A sibling's response as the teacher reads it: decoded without special tokens (the end-of-turn token), then
    its thinking blocks stripped. ``<think>``/``</think>`` are kept through the decoding even where a tokenizer marks
    them special (Qwen3's are not), so the stripping finds them."""
    think_ids = {tokenizer.convert_tokens_to_ids(tag) for tag in ("<think>", "</think>")} - {tokenizer.unk_token_id}
    dropped = set(tokenizer.all_special_ids) - think_ids
    return strip_thinking(tokenizer.decode([i for i in token_ids if i not in dropped], skip_special_tokens=False))


def sibling_texts(batch: DataProto, siblings: np.ndarray, tokenizer) -> list[str | None]:
    """The text of sibling ``siblings[i]`` of ``batch`` (:func:`sibling_text`, each decoded once), None for −1."""
    responses, response_mask = batch.batch["responses"], batch.batch["response_mask"].bool()
    decoded = {
        int(j): sibling_text(tokenizer, responses[j][response_mask[j]].tolist()) for j in set(siblings.tolist()) - {-1}
    }
    return [decoded[int(j)] if j >= 0 else None for j in siblings.tolist()]


def last_messages(batch: DataProto) -> list[str]:
    """The content of each row's last chat message (``raw_prompt[i][-1]["content"]``: the question with the
    dataset's instruction), the text a re-prompt extends."""
    raw_prompts = batch.non_tensor_batch.get("raw_prompt")
    if raw_prompts is None:
        raise ValueError("a re-prompted context needs the chat messages of every row (non_tensor_batch['raw_prompt']).")
    return [str(messages[-1]["content"]) for messages in raw_prompts]


def build_sibling_batch(
    batch: DataProto,
    siblings: np.ndarray,
    tokenizer,
    max_prompt_length: int,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> tuple[DataProto, torch.Tensor, dict[str, float]]:
    """Row i's prompt becomes its chat with the last message followed by sibling ``siblings[i]``'s decoded response
    (:func:`sibling_teacher_message`); ``siblings[i] = -1`` or a prompt over ``max_prompt_length`` tokens keeps the
    row's own prompt and marks it without context (:func:`reprompt_batch`)."""
    contents = [
        sibling_teacher_message(last, text) if text is not None else None
        for last, text in zip(last_messages(batch), sibling_texts(batch, siblings, tokenizer))
    ]
    return reprompt_batch(batch, contents, tokenizer, max_prompt_length, chat_template_kwargs)


def reprompt_batch(
    batch: DataProto,
    contents: Sequence[str | None],
    tokenizer,
    max_prompt_length: int,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> tuple[DataProto, torch.Tensor, dict[str, float]]:
    """Row i's prompt becomes its chat with the last message's content replaced by ``contents[i]``, rendered with the
    chat template (generation prompt on, the data's template kwargs); ``contents[i] = None`` or a prompt over
    ``max_prompt_length`` tokens keeps the row's own prompt and marks it without context. Layout as
    :func:`build_hint_batch`'s (left-padded prompts, the input's responses, positions continued from the new prompt's
    end).

    Returns:
        ``(teacher_batch, has_context bool [B], metrics)``: ``cpo/context_too_long_frac``,
        ``cpo/context_prompt_len_mean``.
    """
    raw_prompts = batch.non_tensor_batch.get("raw_prompt")
    template_kwargs = dict(plain_mapping(chat_template_kwargs) or {})
    prompt_width = batch.batch["prompts"].shape[1]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rows, has_context, too_long = [], torch.zeros(len(batch), dtype=torch.bool), 0
    for row, content in enumerate(contents):
        own = batch.batch["prompts"][row][batch.batch["attention_mask"][row, :prompt_width].bool()].tolist()
        if content is None:
            rows.append(own)
            continue
        messages = [dict(message) for message in raw_prompts[row]]
        messages[-1]["content"] = content
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, **template_kwargs)
        ids = list(ids["input_ids"] if isinstance(ids, Mapping) else ids)
        if len(ids) > max_prompt_length:
            too_long += 1
            rows.append(own)
            continue
        rows.append(ids)
        has_context[row] = True
    prompts, lengths = left_pad(rows, max(map(len, rows)), pad_id)
    teacher_batch = reprompted_batch(batch, prompts, lengths)
    context_lengths = lengths[has_context].float()
    metrics = {
        "cpo/context_too_long_frac": too_long / max(len(batch), 1),
        "cpo/context_prompt_len_mean": context_lengths.mean().item() if len(context_lengths) else 0.0,
    }
    return teacher_batch, has_context, metrics


for _context in (GoldSolution(), AnswerOnly(), SuccessfulSibling(), EnvironmentFeedback()):
    register_context(_context)
