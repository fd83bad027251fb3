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
"""The teacher's prompt of a distribution-level method: the same responses under a prompt holding its privileged
context (``Method.context``), and which rows have one.

- ``gold_solution``: the hint-guided prompt of :func:`treetune_recipe.cpo.teacher.hint.build_hint_batch` (the dataset's
  worked solution); a row of a group without a solution (``cpo.hint.on_missing=skip``) has no context.
- ``successful_sibling``: SDPO's re-prompt (:mod:`treetune_recipe.cpo.teacher.sibling`): the row's own chat messages,
  the last one followed by a response of the same group that the verifier accepted (thinking stripped), chosen by
  :func:`choose_successful_siblings`; a row without such a sibling has no context. A teacher prompt longer than its
  limit also leaves its row without one (counted in ``cpo/context_too_long_frac``).

The teacher prompt's limit (:func:`resolved_hint_config`) is ``cpo.hint.max_prompt_length`` when set; otherwise
``data.max_prompt_length`` + ``cpo.hint.max_prompt_length_margin`` (512) for the gold solution, and for a sibling
``data.max_prompt_length + data.max_response_length`` + the margin, so that a whole sibling response fits beside the
prompt and the re-prompt's own words, as in SDPO's official runs (prompt limit 10,240 = 2,048 + 8,192, no margin).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from verl import DataProto

from treetune_recipe.cpo.methods.method import Method
from treetune_recipe.cpo.teacher.hint import HintConfig, build_hint_batch, left_pad, plain_mapping, reprompted_batch
from treetune_recipe.cpo.teacher.sibling import choose_successful_siblings, sibling_teacher_message, strip_thinking


def resolved_hint_config(
    hint: HintConfig, method: Method, max_prompt_length: int, max_response_length: int
) -> HintConfig:
    """``hint`` with the teacher prompt's limit of ``method``'s context set (see the module docstring)."""
    if method.context == "successful_sibling" and hint.max_prompt_length is None:
        limit = int(max_prompt_length) + int(max_response_length) + hint.max_prompt_length_margin
        return dataclasses.replace(hint, max_prompt_length=limit)
    return hint.resolve(max_prompt_length)


def build_teacher_batch(
    method: Method,
    knobs: Any,
    batch: DataProto,
    *,
    success: torch.Tensor,
    tokenizer,
    hint_config: HintConfig,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> tuple[DataProto, torch.Tensor, dict[str, float]]:
    """The teacher batch of ``batch`` (same rows, same responses) under ``method``'s context.

    Args:
        success: bool ``[B]``, the rows the verifier accepted (``seq_reward == cpo.success_value``).
        hint_config: resolved (``max_prompt_length`` set); the width limit of every teacher prompt.

    Returns:
        ``(teacher_batch, has_context bool [B], metrics)``; metrics: ``cpo/context_frac`` and the builder's own.
    """
    if method.context == "gold_solution":
        teacher_batch, metrics = build_hint_batch(batch, tokenizer, hint_config, chat_template_kwargs)
        has_context = ~torch.as_tensor(teacher_batch.non_tensor_batch["hint_missing"].astype(bool))
    else:
        siblings = choose_successful_siblings(
            batch.non_tensor_batch["uid"], success.cpu().numpy().astype(bool), exclude_self=knobs.exclude_self
        )
        teacher_batch, has_context, metrics = build_sibling_batch(
            batch, siblings, tokenizer, hint_config.max_prompt_length, chat_template_kwargs
        )
    metrics["cpo/context_frac"] = has_context.float().mean().item()
    return teacher_batch, has_context, metrics


def sibling_text(tokenizer, token_ids: list[int]) -> str:
    """A sibling's response as the teacher reads it: decoded without special tokens (the end-of-turn token), then
    its thinking blocks stripped. ``<think>``/``</think>`` are kept through the decoding even where a tokenizer marks
    them special (Qwen3's are not), so the stripping finds them."""
    think_ids = {tokenizer.convert_tokens_to_ids(tag) for tag in ("<think>", "</think>")} - {tokenizer.unk_token_id}
    dropped = set(tokenizer.all_special_ids) - think_ids
    return strip_thinking(tokenizer.decode([i for i in token_ids if i not in dropped], skip_special_tokens=False))


def build_sibling_batch(
    batch: DataProto,
    siblings: np.ndarray,
    tokenizer,
    max_prompt_length: int,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> tuple[DataProto, torch.Tensor, dict[str, float]]:
    """Row i's prompt becomes its chat with the last message followed by sibling ``siblings[i]``'s decoded response
    (:func:`sibling_teacher_message`); ``siblings[i] = -1`` or a prompt over ``max_prompt_length`` tokens keeps the
    row's own prompt and marks it without context. Layout as :func:`build_hint_batch`'s (left-padded prompts, the
    input's responses, positions continued from the new prompt's end).

    Returns:
        ``(teacher_batch, has_context bool [B], metrics)``: ``cpo/context_too_long_frac``,
        ``cpo/context_prompt_len_mean``.
    """
    raw_prompts = batch.non_tensor_batch.get("raw_prompt")
    if raw_prompts is None:
        raise ValueError("a sibling context needs the chat messages of every row (non_tensor_batch['raw_prompt']).")
    responses, response_mask = batch.batch["responses"], batch.batch["response_mask"].bool()
    decoded = {
        int(j): sibling_text(tokenizer, responses[j][response_mask[j]].tolist()) for j in set(siblings.tolist()) - {-1}
    }
    template_kwargs = dict(plain_mapping(chat_template_kwargs) or {})
    prompt_width = batch.batch["prompts"].shape[1]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rows, has_context, too_long = [], torch.zeros(len(batch), dtype=torch.bool), 0
    for row, sibling in enumerate(siblings.tolist()):
        own = batch.batch["prompts"][row][batch.batch["attention_mask"][row, :prompt_width].bool()].tolist()
        if sibling < 0:
            rows.append(own)
            continue
        messages = [dict(message) for message in raw_prompts[row]]
        messages[-1]["content"] = sibling_teacher_message(str(messages[-1]["content"]), decoded[sibling])
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
