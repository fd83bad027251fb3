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
"""The hint-guided batch of CPO: the same responses, scored under a prompt that contains the gold solution.

After verl has computed the advantages, CPO needs ``teacher_log_probs[i, t] = log pi_old(y_t | hint prompt_i, y_<t)``
for every rollout row ``i`` and its *unchanged* response tokens ``y``. :func:`build_hint_batch` turns the trainer's
batch into a second ``DataProto`` that verl's ``_compute_old_log_prob`` accepts; its ``old_log_probs`` are the
``teacher_log_probs``.

How a hint prompt is made (once per prompt group, i.e. per ``uid``, then broadcast to the group's n rows):

1. question = ``extra_info[question_key]``; if absent, the text of the last user message of ``raw_prompt`` (verl 0.7.1's
   agent loop copies every row's chat messages there, whatever ``data.return_raw_chat`` says);
   solution = ``extra_info[solution_key]``.
2. user message = ``user_template`` with ``{question}`` and ``{solution}`` filled in; messages = optional ``system``
   message + user message, rendered with the tokenizer's own chat template (``add_generation_prompt=True``, the
   data's ``apply_chat_template_kwargs``; ``enable_thinking`` overridable). Tokenizers without a chat template get
   the plain text ``system + "\\n\\n" + user + "\\n\\n"``.
3. A prompt longer than ``max_prompt_length`` loses solution tokens from the *front* (the end holds the final answer),
   and is re-rendered until it fits.

Groups without a solution: ``on_missing="error"`` raises; ``"skip"`` keeps the group's original prompt in the hint
batch and marks its rows in ``hint_batch.non_tensor_batch["hint_missing"]`` (bool ``[B]``). The trainer then uses the
plain ``old_log_probs`` as ``teacher_log_probs`` on those rows, so their log-ratio is exactly 0::

    gw = torch.where(torch.as_tensor(hint_missing)[:, None], batch.batch["old_log_probs"], hint_old_log_probs)
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from verl import DataProto

from treetune_verl.config_block import check_field_types, dataclass_from_block

#: The hint prompt's default system message and user template (``cpo.hint.system``, ``cpo.hint.user_template``). The
#: tiny tokenizer learns a frozen copy of them (``treetune_verl/tiny_assets.py``, ``TOKENIZER_HINT_USER_TEMPLATE``).
DEFAULT_SYSTEM = "You are a helpful assistant."
DEFAULT_USER_TEMPLATE = r"""Problem:
{question}

Worked solution (private; for your reference only):
{solution}

Solve the problem yourself, step by step, and reach the same final answer as the worked solution. Write the way a \
person thinks aloud while tackling the problem for the first time: a first-person train of thought, in real time.

Rules for your reply:
1. Start working right away. No preamble, no closing summary, no repetition of these rules.
2. Never mention, quote or hint at the worked solution, and do not suggest that you had any help or are acting.
3. Do not just restate the worked solution: derive each step, and show intermediate results, why you choose each \
approach, the checks you make, and any corrections.
4. Write the final answer inside \boxed{}."""

RESCORE_MODES = ("needed", "all")  # cpo.hint.rescore
_TEMPLATE_FIELD = re.compile(r"\{(question|solution)\}")
# Truncation converges in one or two rounds (a cut can shift a token boundary); this only guards against a bug.
_MAX_TRUNCATION_ROUNDS = 32


def _config_field(default: Any, help_text: str) -> Any:
    return dataclasses.field(default=default, metadata={"help": help_text})


@dataclasses.dataclass(frozen=True)
class HintConfig:
    """``cpo.hint.*``: how the hint-guided prompt is built (see the module docstring)."""

    question_key: str = _config_field(
        "question", "extra_info key with the bare question; missing -> last user message of raw_prompt."
    )
    solution_key: str = _config_field("solution", "extra_info key with the gold solution shown in the hint prompt.")
    system: str | None = _config_field(DEFAULT_SYSTEM, "System message of the hint prompt; null or '' = none.")
    user_template: str | None = _config_field(
        DEFAULT_USER_TEMPLATE,
        "User message; null = DEFAULT_USER_TEMPLATE. Only {question} and {solution} are substituted; every other "
        "brace is literal (\\boxed{}).",
    )
    enable_thinking: bool | None = _config_field(
        None, "Chat-template enable_thinking for the hint prompt; null = as in data.apply_chat_template_kwargs."
    )
    max_prompt_length: int | None = _config_field(
        None, "Longest hint prompt (tokens); null = data.max_prompt_length + max_prompt_length_margin."
    )
    max_prompt_length_margin: int = _config_field(
        512, "Extra tokens over data.max_prompt_length for the hint prompt when max_prompt_length is null."
    )
    on_missing: str = _config_field(
        "error", "Group without a solution: 'error' (raise) or 'skip' (teacher_log_probs = old_log_probs for it)."
    )
    allow_all_missing: bool = _config_field(
        False, "With on_missing=skip, start even when no training row has a solution (the run is then plain GRPO)."
    )
    rescore: str = _config_field(
        "needed",
        "Rows scored under the hint: 'needed' (only those whose shaped advantages read teacher_log_probs, see "
        "methods.registry.rows_reading_hint; the others get teacher_log_probs = old_log_probs) or 'all'.",
    )

    def __post_init__(self):
        check_field_types(self, "cpo.hint")
        if self.user_template is None:  # null = the built-in wording
            object.__setattr__(self, "user_template", DEFAULT_USER_TEMPLATE)
        for key in ("question_key", "solution_key"):
            if not getattr(self, key):
                raise ValueError(f"cpo.hint.{key} must be a non-empty string, got {getattr(self, key)!r}.")
        missing_fields = {"question", "solution"} - set(_TEMPLATE_FIELD.findall(self.user_template))
        if missing_fields:
            raise ValueError(
                f"cpo.hint.user_template must contain the field(s) {sorted(missing_fields)} written as "
                "'{question}' and '{solution}'."
            )
        if self.on_missing not in ("error", "skip"):
            raise ValueError(f"cpo.hint.on_missing must be 'error' or 'skip', got {self.on_missing!r}.")
        if self.rescore not in RESCORE_MODES:
            raise ValueError(f"cpo.hint.rescore must be one of {', '.join(RESCORE_MODES)}, got {self.rescore!r}.")
        if self.max_prompt_length is not None and self.max_prompt_length <= 0:
            raise ValueError(f"cpo.hint.max_prompt_length must be positive or null, got {self.max_prompt_length}.")
        if self.max_prompt_length_margin < 0:
            raise ValueError(f"cpo.hint.max_prompt_length_margin must be >= 0, got {self.max_prompt_length_margin}.")

    @classmethod
    def from_config(cls, config: Any = None) -> HintConfig:
        """Build from the ``cpo.hint`` block (dict, OmegaConf node, ``HintConfig`` or None: all defaults); an unknown
        key is an error naming the valid ones. ``CPOConfig`` builds it as part of the ``cpo`` block."""
        return dataclass_from_block(cls, config, "cpo.hint")

    def chat_messages(self, question: str, solution: str) -> list[dict[str, str]]:
        """The hint prompt's chat messages: the system message (if set), then the filled user template."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return [*head, {"role": "user", "content": fill_user_template(self.user_template, question, solution)}]

    def resolve(self, data_max_prompt_length: int) -> HintConfig:
        """Return a copy whose ``max_prompt_length`` is set (``data_max_prompt_length + margin`` when null)."""
        if self.max_prompt_length is not None:
            return self
        return dataclasses.replace(self, max_prompt_length=int(data_max_prompt_length) + self.max_prompt_length_margin)


def plain_mapping(config: Any) -> Any:
    """OmegaConf nodes -> plain containers (resolved); anything else unchanged."""
    return OmegaConf.to_container(config, resolve=True) if isinstance(config, DictConfig) else config


def fill_user_template(template: str, question: str, solution: str) -> str:
    """Substitute ``{question}`` and ``{solution}`` in one pass (inserted text is never re-scanned)."""
    values = {"question": question, "solution": solution}
    return _TEMPLATE_FIELD.sub(lambda match: values[match.group(1)], template)


def build_hint_batch(
    batch: DataProto,
    tokenizer,
    hint_config: HintConfig,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> tuple[DataProto, dict[str, float]]:
    """Build the hint-guided batch for ``batch`` (one row per rollout, same order, same responses).

    Args:
        batch: the trainer's batch after ``compute_advantage``. Tensors: ``prompts [B, P]`` (left-padded),
            ``responses [B, T]``, ``response_mask [B, T]``, ``attention_mask [B, P+T]``, ``position_ids [B, P+T]``.
            Non-tensors: ``uid [B]``, ``extra_info [B]`` (dicts), optionally ``raw_prompt [B]`` and ``index [B]``.
        tokenizer: a fast Hugging Face tokenizer (the actor's).
        hint_config: a resolved :class:`HintConfig` (``max_prompt_length`` set, see :meth:`HintConfig.resolve`).
        chat_template_kwargs: extra ``apply_chat_template`` arguments of the data (``data.apply_chat_template_kwargs``);
            ``hint_config.enable_thinking``, when set, overrides their ``enable_thinking``.

    Returns:
        ``(hint_batch, metrics)``. ``hint_batch`` has ``prompts [B, W]`` (W = the longest hint prompt of the batch,
        at most ``hint_config.max_prompt_length``; left-padded with the pad id, or EOS without one), ``responses``
        and ``response_mask [B, T]`` (the input's), ``input_ids``, ``attention_mask`` and ``position_ids [B, W+T]``
        (response part of the attention mask and response positions relative to the prompt end are the input's),
        ``non_tensor_batch["hint_missing"]`` (bool ``[B]``), and ``meta_info`` = a copy of the input's with
        ``global_token_num`` recomputed. ``metrics`` has ``cpo/hint_prompt_len_mean``, ``cpo/hint_prompt_len_max``
        (over rows with a hint), ``cpo/hint_truncated_frac`` and ``cpo/hint_missing_frac`` (fractions of rows).
    """
    width = hint_config.max_prompt_length
    if width is None:
        raise ValueError(
            "hint_config.max_prompt_length is null: call HintConfig.resolve(data.max_prompt_length) first."
        )
    if not getattr(tokenizer, "is_fast", False):
        raise TypeError("build_hint_batch needs a fast tokenizer (token offsets are used to truncate solutions).")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        raise ValueError("The tokenizer has neither a pad token nor an EOS token to left-pad hint prompts with.")
    if batch.batch["position_ids"].dim() != 2:
        raise NotImplementedError("Hint batches support text-only position_ids of shape [B, P+T] (no multimodal rope).")

    group_first_row, row_to_group = _group_rows(batch.non_tensor_batch["uid"])
    groups = _GroupTexts.collect(batch, group_first_row, hint_config)
    group_ids: list[list[int]] = [[] for _ in group_first_row]
    hinted = np.flatnonzero(~groups.missing)
    truncated_groups = []
    if len(hinted):
        renderer = _HintRenderer(tokenizer, hint_config, chat_template_kwargs)
        hinted_ids, truncated = _render_to_width(
            renderer,
            [groups.questions[g] for g in hinted],
            [groups.solutions[g] for g in hinted],
            width,
            [groups.labels[g] for g in hinted],
        )
        for group, ids in zip(hinted, hinted_ids):
            group_ids[group] = ids
        truncated_groups = hinted[sorted(truncated)]
    for group in np.flatnonzero(groups.missing):
        group_ids[group] = _original_prompt_ids(batch, int(group_first_row[group]), width, groups.labels[group])

    # Only as wide as the longest prompt: padding columns would cost memory and transfer, and compute where the actor
    # does not unpad.
    group_prompts, group_lengths = left_pad(group_ids, max(map(len, group_ids)), pad_id)
    row_index = torch.as_tensor(row_to_group)
    hint_prompt_len = group_lengths[row_index]
    row_missing = groups.missing[row_to_group]
    hint_batch = reprompted_batch(
        batch, group_prompts.index_select(0, row_index), hint_prompt_len, non_tensors={"hint_missing": row_missing}
    )

    hinted_lengths = hint_prompt_len[torch.as_tensor(~row_missing)].float()
    metrics = {
        "cpo/hint_prompt_len_mean": hinted_lengths.mean().item() if len(hinted_lengths) else 0.0,
        "cpo/hint_prompt_len_max": hinted_lengths.max().item() if len(hinted_lengths) else 0.0,
        "cpo/hint_truncated_frac": float(np.isin(row_to_group, truncated_groups).mean()),
        "cpo/hint_missing_frac": float(row_missing.mean()),
    }
    return hint_batch, metrics


def _group_rows(uids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (first row of each uid, in order of first appearance; group index of every row)."""
    _, first_row, inverse = np.unique(
        np.asarray(uids, dtype=object).astype(str), return_index=True, return_inverse=True
    )
    order = np.argsort(first_row, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return first_row[order], rank[inverse.reshape(-1)]


@dataclasses.dataclass
class _GroupTexts:
    """Question, solution and an error label (row, dataset index, uid) for every prompt group."""

    questions: list[str]
    solutions: list[str]
    missing: np.ndarray  # bool [num_groups]: no usable solution and on_missing == "skip"
    labels: list[str]

    @classmethod
    def collect(cls, batch: DataProto, group_first_row: np.ndarray, config: HintConfig) -> _GroupTexts:
        non_tensor = batch.non_tensor_batch
        extra_infos = non_tensor.get("extra_info")
        # SYNC WARNING: verl/experimental/agent_loop/agent_loop.py:AgentLoopWorker._agent_loop_postprocess
        # (copies each row's chat messages into extra_fields["raw_prompt"], whatever data.return_raw_chat says)
        raw_prompts = non_tensor.get("raw_prompt")
        questions, solutions, labels = [], [], []
        for row in group_first_row:
            extra_info = extra_infos[row] if extra_infos is not None and extra_infos[row] is not None else {}
            label = _row_label(row, extra_info, non_tensor)
            solution = _as_text(extra_info.get(config.solution_key))
            question = ""
            if solution:
                question = _as_text(extra_info.get(config.question_key))
                if not question and raw_prompts is not None:
                    question = _last_user_text(raw_prompts[row])
                if not question:
                    raise ValueError(
                        f"{label}: no question found: extra_info[{config.question_key!r}] is missing and there is no "
                        "user message in non_tensor_batch['raw_prompt']. Add the question to extra_info."
                    )
            elif config.on_missing == "error":
                raise ValueError(
                    f"{label}: extra_info[{config.solution_key!r}] is missing or empty, so no hint prompt can be "
                    "built. Add the gold solution to the data, or set cpo.hint.on_missing=skip."
                )
            questions.append(question)
            solutions.append(solution)
            labels.append(label)
        missing = np.array([not solution for solution in solutions], dtype=bool)
        return cls(questions, solutions, missing, labels)


def _row_label(row: int, extra_info: Mapping, non_tensor: Mapping[str, np.ndarray]) -> str:
    index = extra_info.get("index")
    if index is None and "index" in non_tensor:
        index = non_tensor["index"][row]
    return f"row {row} (dataset index {index}, uid {non_tensor['uid'][row]})"


def _as_text(value: Any) -> str:
    """A usable string, or '' for None / NaN / blank."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    text = value if isinstance(value, str) else str(value)
    return text if text.strip() else ""


def _last_user_text(messages: Any) -> str:
    """Text of the last user message of a chat (content as a string or a list of typed parts)."""
    if messages is None or isinstance(messages, str):
        return ""
    for message in reversed(list(messages)):
        if not isinstance(message, Mapping) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, Sequence | np.ndarray):
            return "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    return ""


class _HintRenderer:
    """Renders (question, solution) pairs into hint-prompt token ids: one template pass and one tokenizer call."""

    def __init__(self, tokenizer, config: HintConfig, chat_template_kwargs: Mapping[str, Any] | None):
        self.tokenizer = tokenizer
        self.config = config
        self.template_kwargs = dict(plain_mapping(chat_template_kwargs) or {})
        if config.enable_thinking is not None:
            self.template_kwargs["enable_thinking"] = config.enable_thinking
        self.has_chat_template = bool(getattr(tokenizer, "chat_template", None))

    def __call__(self, questions: Sequence[str], solutions: Sequence[str]) -> list[list[int]]:
        system = self.config.system
        if self.has_chat_template:
            conversations = [self.config.chat_messages(q, s) for q, s in zip(questions, solutions)]
            texts = self.tokenizer.apply_chat_template(
                conversations, tokenize=False, add_generation_prompt=True, **self.template_kwargs
            )
            add_special_tokens = False  # the chat template writes its own BOS, as transformers does when tokenizing
        else:
            users = [fill_user_template(self.config.user_template, q, s) for q, s in zip(questions, solutions)]
            texts = [f"{system}\n\n{user}\n\n" if system else f"{user}\n\n" for user in users]
            add_special_tokens = True
        return self.tokenizer(texts, add_special_tokens=add_special_tokens, return_attention_mask=False)["input_ids"]


def _render_to_width(
    render: _HintRenderer, questions: list[str], solutions: list[str], width: int, labels: list[str]
) -> tuple[list[list[int]], set[int]]:
    """Render every prompt; cut the front of the solutions whose prompt exceeds ``width`` until all fit.

    Each round drops ``overflow`` more solution tokens (cut at the token's character offset in the solution), then
    re-renders only the prompts still too long.

    Returns:
        (token ids of every prompt, indices of the truncated prompts).
    """
    prompt_ids = render(questions, solutions)
    too_long = [i for i, ids in enumerate(prompt_ids) if len(ids) > width]
    if not too_long:
        return prompt_ids, set()
    truncated = set(too_long)
    offsets = render.tokenizer([solutions[i] for i in too_long], add_special_tokens=False, return_offsets_mapping=True)[
        "offset_mapping"
    ]
    token_starts = {i: [start for start, _ in pairs] for i, pairs in zip(too_long, offsets)}
    dropped = dict.fromkeys(too_long, 0)
    current = {i: solutions[i] for i in too_long}
    for _ in range(_MAX_TRUNCATION_ROUNDS):
        for i in too_long:
            if not current[i]:
                raise ValueError(
                    f"{labels[i]}: the hint prompt needs {len(prompt_ids[i])} tokens even with an empty solution, "
                    f"more than cpo.hint.max_prompt_length={width}. Raise cpo.hint.max_prompt_length (or "
                    "max_prompt_length_margin) or shorten cpo.hint.system / user_template."
                )
            dropped[i] += len(prompt_ids[i]) - width
            starts = token_starts[i]
            current[i] = solutions[i][starts[dropped[i]] :] if dropped[i] < len(starts) else ""
        rerendered = render([questions[i] for i in too_long], [current[i] for i in too_long])
        for i, ids in zip(too_long, rerendered):
            prompt_ids[i] = ids
        too_long = [i for i in too_long if len(prompt_ids[i]) > width]
        if not too_long:
            return prompt_ids, truncated
    raise RuntimeError(
        f"Hint truncation did not converge in {_MAX_TRUNCATION_ROUNDS} rounds for {labels[too_long[0]]}."
    )


def _original_prompt_ids(batch: DataProto, row: int, width: int, label: str) -> list[int]:
    """The row's own prompt tokens (used for groups skipped for lack of a solution)."""
    prompt_width = batch.batch["prompts"].shape[1]
    valid = batch.batch["attention_mask"][row, :prompt_width].bool()
    ids = batch.batch["prompts"][row][valid].tolist()
    if len(ids) > width:
        raise ValueError(
            f"{label}: its original prompt ({len(ids)} tokens) exceeds cpo.hint.max_prompt_length={width}."
        )
    return ids


def left_pad(token_lists: Sequence[Sequence[int]], width: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists into ``(ids [N, width] int64, lengths [N] int64)``."""
    lengths = torch.tensor([len(ids) for ids in token_lists], dtype=torch.long)
    flat = np.fromiter(itertools.chain.from_iterable(token_lists), dtype=np.int64, count=int(lengths.sum()))
    mask = torch.arange(width)[None, :] >= (width - lengths)[:, None]
    ids = torch.full((len(token_lists), width), pad_id, dtype=torch.long)
    ids[mask] = torch.from_numpy(flat)  # row-major order of the mask = concatenation order of the lists
    return ids, lengths


def reprompted_batch(
    batch: DataProto, prompts: torch.Tensor, prompt_len: torch.Tensor, non_tensors: Mapping[str, Any] | None = None
) -> DataProto:
    """``batch``'s responses under new prompts (``[B, W]``, left-padded, lengths ``[B]``), as a batch verl's log-prob
    passes score: the tensors of :func:`_assemble_rows`, ``non_tensors``, and a copy of ``batch``'s ``meta_info`` with
    ``global_token_num`` recomputed. The hint batch and a distribution-level method's teacher batch are built so."""
    tensors = _assemble_rows(batch, prompts, prompt_len)
    meta_info = dict(batch.meta_info)
    # SYNC WARNING: verl/trainer/ppo/ray_trainer.py:RayPPOTrainer.fit (global_token_num = per-row attention sums)
    meta_info["global_token_num"] = tensors["attention_mask"].sum(dim=-1).tolist()
    return DataProto.from_dict(tensors=tensors, non_tensors=dict(non_tensors or {}), meta_info=meta_info)


def _assemble_rows(batch: DataProto, hint_prompts: torch.Tensor, hint_prompt_len: torch.Tensor) -> dict:
    """Hint prompts ``[B, W]`` (left-padded, lengths ``[B]``) + the batch's responses -> the hint batch's tensors.

    Every ``[B, W+T]`` tensor is written once, in place (these are the largest tensors of the step).
    """
    prompt_width = batch.batch["prompts"].shape[1]
    responses, attention_mask, position_ids = (batch.batch[k] for k in ("responses", "attention_mask", "position_ids"))
    num_rows, width = hint_prompts.shape
    total_width = width + responses.shape[1]
    first_token_col = (width - hint_prompt_len)[:, None]
    columns = torch.arange(width)[None, :]

    input_ids = torch.empty((num_rows, total_width), dtype=batch.batch["input_ids"].dtype)
    input_ids[:, :width] = hint_prompts
    input_ids[:, width:] = responses
    hint_attention = torch.empty((num_rows, total_width), dtype=attention_mask.dtype)
    torch.ge(columns, first_token_col, out=hint_attention[:, :width])
    hint_attention[:, width:] = attention_mask[:, prompt_width:]
    # verl's left-pad convention on the prompt (0 on padding, then 0..L-1); the response keeps its offset from the
    # prompt end, i.e. its positions are shifted by (hint prompt length - original prompt length).
    hint_positions = torch.empty((num_rows, total_width), dtype=position_ids.dtype)
    torch.sub(columns, first_token_col, out=hint_positions[:, :width]).clamp_(min=0)
    original_prompt_len = attention_mask[:, :prompt_width].sum(dim=-1)
    shift = (hint_prompt_len - original_prompt_len)[:, None]
    torch.add(position_ids[:, prompt_width:], shift, out=hint_positions[:, width:])
    return {
        "prompts": hint_prompts.to(batch.batch["prompts"].dtype),
        "responses": responses,
        "response_mask": batch.batch["response_mask"],
        "input_ids": input_ids,
        "attention_mask": hint_attention,
        "position_ids": hint_positions,
    }


def hint_solution(extra_info: Mapping | None, solution_key: str) -> str:
    """The solution a hint prompt shows: ``extra_info[solution_key]`` as text, ``''`` when missing, NaN or blank."""
    return _as_text((extra_info or {}).get(solution_key))


def mapping_text(mapping: Mapping | None, key: str) -> str:
    """``mapping[key]`` as text: ``''`` when the mapping or the key is missing, or the value is NaN or blank."""
    return _as_text((mapping or {}).get(key))


def hint_question(extra_info: Mapping | None, messages: Any, question_key: str) -> str:
    """The question a hint prompt shows: ``extra_info[question_key]``, else the last user message (``''`` if none)."""
    return _as_text((extra_info or {}).get(question_key)) or _last_user_text(messages)


def shortest_hint_prompt_lengths(
    tokenizer, config: HintConfig, questions: Sequence[str], chat_template_kwargs: Mapping[str, Any] | None = None
) -> list[int]:
    """Token count of each question's hint prompt with an empty solution: the least width truncation can reach."""
    render = _HintRenderer(tokenizer, config, chat_template_kwargs)
    return [len(ids) for ids in render(list(questions), [""] * len(questions))]
