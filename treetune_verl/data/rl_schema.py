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
"""verl's RL parquet schema as this project writes it, and the validator every run applies at start-up.

One row::

    data_source: str                      # the reward route key (see treetune_verl/utils/reward_score/math_answer.py)
    prompt: [{role, content}, ...]        # optional system message, then the user message: question + instruction
    ability: str                          # "math" (training files; validation files may leave it out)
    reward_model: {style: "rule", ground_truth: str}   # the final answer only
    extra_info: {index: int, split: str, question: str, solution: str | None, subject: str | None,
                 level: str | None}

``extra_info.solution`` is the full worked solution that CPO puts into the hint prompt; training files need it,
validation files may leave it empty. ``extra_info.question`` is optional: the hint builder falls back to the last
user message of ``prompt``. Every file is written with the same Arrow schema, so verl can concatenate validation
files from different preparation scripts (``datasets.concatenate_datasets`` needs identical features).

:func:`validate_rl_dataframe` lists every problem of a loaded dataset; :func:`check_rl_files` runs it on the files
of a run config and raises (the recipes call it before Ray starts). The command line is
``python -m treetune_scripts.data.validate_rl_parquet``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from treetune_verl.utils.reward_score.answer_extraction import last_boxed_content

DEFAULT_INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{}."
ABILITY = "math"
REWARD_STYLE = "rule"

MESSAGE_TYPE = pa.struct([("role", pa.string()), ("content", pa.string())])
RL_PARQUET_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(MESSAGE_TYPE)),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        (
            "extra_info",
            pa.struct(
                [
                    ("index", pa.int64()),
                    ("split", pa.string()),
                    ("question", pa.string()),
                    ("solution", pa.string()),
                    ("subject", pa.string()),
                    ("level", pa.string()),
                ]
            ),
        ),
    ]
)


def build_prompt(question: str, instruction: str = DEFAULT_INSTRUCTION, system_prompt: str | None = None) -> list:
    """Chat messages for one problem: an optional system message, then ``question + instruction`` as the user."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": question + instruction})
    return messages


def final_answer_from_solution(solution: str | None) -> str | None:
    """The content of the last ``\\boxed{}`` of a worked solution (``None`` when it has none or it is empty)."""
    if not solution:
        return None
    boxed = last_boxed_content(solution)
    return boxed or None


def _optional_text(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def build_row(
    *,
    data_source: str,
    question: str,
    ground_truth: str,
    solution: str | None,
    split: str,
    index: int,
    instruction: str = DEFAULT_INSTRUCTION,
    system_prompt: str | None = None,
    subject: Any = None,
    level: Any = None,
) -> dict:
    """One row in the schema of this module."""
    return {
        "data_source": data_source,
        "prompt": build_prompt(question, instruction, system_prompt),
        "ability": ABILITY,
        "reward_model": {"style": REWARD_STYLE, "ground_truth": str(ground_truth).strip()},
        "extra_info": {
            "index": int(index),
            "split": split,
            "question": question,
            "solution": _optional_text(solution),
            "subject": _optional_text(subject),
            "level": _optional_text(level),
        },
    }


def write_rl_parquet(rows: Sequence[dict], path: str | Path) -> Path:
    """Writes rows with :data:`RL_PARQUET_SCHEMA` (creating parent folders) and returns the path."""
    if not rows:
        raise ValueError(f"no rows to write to {path}: the input had no usable problems.")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(list(rows), schema=RL_PARQUET_SCHEMA), path)
    return path


REQUIRED_COLUMNS = ("data_source", "prompt", "reward_model", "extra_info")
#: Required in training files only (verl's dataset does not read it; validation files may leave it out).
TRAINING_COLUMNS = ("ability",)
MESSAGE_ROLES = ("system", "user", "assistant")


def _is_nonempty_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _as_sequence(value: Any) -> list | None:
    """A list for list-like cells (parquet gives numpy arrays), else ``None``."""
    if isinstance(value, list | tuple):
        return list(value)
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        converted = value.tolist()
        return converted if isinstance(converted, list) else None
    return None


def _prompt_problems(prompt: Any) -> list[tuple[str, str]]:
    messages = _as_sequence(prompt)
    if not messages:
        return [("prompt", f"must be a non-empty list of {{role, content}} messages, got {type(prompt).__name__}")]
    problems = []
    for position, message in enumerate(messages):
        column = f"prompt[{position}]"
        if not isinstance(message, Mapping):
            problems.append((column, f"must be a {{role, content}} mapping, got {type(message).__name__}"))
            continue
        if message.get("role") not in MESSAGE_ROLES:
            problems.append((f"{column}.role", f"must be one of {MESSAGE_ROLES}, got {message.get('role')!r}"))
        if not _is_nonempty_text(message.get("content")):
            problems.append((f"{column}.content", "must be non-empty text"))
    roles = [message.get("role") for message in messages if isinstance(message, Mapping)]
    if roles and roles[-1] != "user":
        problems.append(("prompt", f"the last message must be the user's question, got role {roles[-1]!r}"))
    return problems


def _row_problems(row: Mapping[str, Any], require_solution: bool, require_ability: bool) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if not _is_nonempty_text(row.get("data_source")):
        problems.append(("data_source", "must be non-empty text naming the reward route"))
    problems.extend(_prompt_problems(row.get("prompt")))
    if require_ability and not _is_nonempty_text(row.get("ability")):
        problems.append(("ability", "must be non-empty text (e.g. 'math')"))

    reward_model = row.get("reward_model")
    if not isinstance(reward_model, Mapping):
        problems.append(("reward_model", "must be a {style, ground_truth} mapping"))
    else:
        if reward_model.get("style") != "rule":
            problems.append(("reward_model.style", f"must be 'rule', got {reward_model.get('style')!r}"))
        if not _is_nonempty_text(reward_model.get("ground_truth")):
            problems.append(("reward_model.ground_truth", "must be the non-empty final answer"))

    extra_info = row.get("extra_info")
    if not isinstance(extra_info, Mapping):
        return problems + [("extra_info", "must be a {index, split, question, solution} mapping")]
    index = extra_info.get("index")
    if isinstance(index, bool) or not isinstance(index, int | float) or index != int(index):
        problems.append(("extra_info.index", f"must be an integer, got {index!r}"))
    if not _is_nonempty_text(extra_info.get("split")):
        problems.append(("extra_info.split", "must be non-empty text (e.g. 'train')"))
    question = extra_info.get("question")  # optional: the hint builder falls back to the last user message
    if question is not None and not isinstance(question, str):
        problems.append(("extra_info.question", f"must be text or null, got {type(question).__name__}"))
    solution = extra_info.get("solution")
    if require_solution and not _is_nonempty_text(solution):
        problems.append(("extra_info.solution", "missing or empty; training rows need the full worked solution"))
    elif solution is not None and not isinstance(solution, str):
        problems.append(("extra_info.solution", f"must be text or null, got {type(solution).__name__}"))
    return problems


def validate_rl_dataframe(df: pd.DataFrame, require_solution: bool = True, require_ability: bool = True) -> list[str]:
    """Every schema problem of a loaded RL dataset.

    Args:
        df: the rows, e.g. ``pd.read_parquet(path)``.
        require_solution: demand a non-empty ``extra_info.solution`` (training files) or allow null (validation).
        require_ability: demand the ``ability`` column (training files); validation files may leave it out.

    Returns:
        One message per problem, ``"row <i>, column <name>: <what is wrong>"`` (row = position in ``df``);
        empty when the data is valid.
    """
    columns = [*REQUIRED_COLUMNS, *(TRAINING_COLUMNS if require_ability else ())]
    missing = [column for column in columns if column not in df.columns]
    if missing:
        return [f"column {column}: missing (the file has {list(df.columns)})" for column in missing]
    if df.empty:
        return ["the dataset has no rows"]
    problems = []
    for position, row in enumerate(df[columns].to_dict(orient="records")):
        for column, message in _row_problems(row, require_solution, require_ability):
            problems.append(f"row {position}, column {column}: {message}")
    return problems


def read_local_rl_files(files: Any, what: str) -> list[tuple[str, pd.DataFrame]]:
    """``(path, rows)`` of every local file of a config file list (remote ``xx://`` paths are left to verl).

    Raises:
        ValueError: naming ``what`` (the config key) when a local file does not exist.
    """
    if files is None:
        return []
    paths = [files] if isinstance(files, str | Path) else list(files)
    frames = []
    for path in map(str, paths):
        if "://" in path:
            continue
        if not Path(path).exists():
            raise ValueError(f"{what}: file {path} does not exist.")
        frames.append((path, pd.read_parquet(path)))
    return frames


def check_rl_files(
    files: Any,
    require_solution: bool = True,
    what: str = "data files",
    max_listed: int = 20,
    require_ability: bool = True,
) -> list[tuple[str, pd.DataFrame]]:
    """Validates parquet files before a run starts and raises on the first file with problems.

    Args:
        files: one path or a list of paths (``str``, ``Path``, an OmegaConf ``ListConfig``); ``None`` is skipped, and
            so are remote paths (``hdfs://...``), which verl copies later.
        require_solution: demand ``extra_info.solution`` on every row (training files).
        what: the config key the files come from, used in the message (e.g. ``"data.train_files"``).
        max_listed: how many problems the message lists (the command line lists them all).
        require_ability: demand ``ability`` on every row (training files).

    Returns:
        ``(path, rows)`` of every local file checked, for further checks without reading them again.

    Raises:
        ValueError: naming the config key, the file, the problem count and the first problems.
    """
    frames = read_local_rl_files(files, what)
    for path, frame in frames:
        problems = validate_rl_dataframe(frame, require_solution=require_solution, require_ability=require_ability)
        if problems:
            listed = "\n  ".join(problems[:max_listed])
            more = f"\n  ... and {len(problems) - max_listed} more" if len(problems) > max_listed else ""
            flags = ("" if require_solution else " --no-require-solution") + (
                "" if require_ability else " --no-require-ability"
            )
            raise ValueError(
                f"{what}: {path} has {len(problems)} schema problems:\n  {listed}{more}\n"
                f"List them all with: python -m treetune_scripts.data.validate_rl_parquet{flags} {path}"
            )
    return frames


def prompt_token_lengths(frame: pd.DataFrame, tokenizer, chat_template_kwargs: Mapping | None = None) -> list[int]:
    """Token count of every row's chat prompt as verl's dataset measures it (chat template, generation prompt).

    Args:
        frame: RL rows with a ``prompt`` column of ``{role, content}`` messages.
        tokenizer: the actor's Hugging Face tokenizer.
        chat_template_kwargs: ``data.apply_chat_template_kwargs``.
    """
    # SYNC WARNING: verl/utils/dataset/rl_dataset.py:RLHFDataset.maybe_filter_out_long_prompts (doc2len, 0.9.1
    # l.248-262, 0.7.1 l.241-255)
    conversations = [[dict(message) for message in _as_sequence(prompt) or []] for prompt in frame["prompt"]]
    kwargs = dict(chat_template_kwargs or {})
    if getattr(tokenizer, "chat_template", None):
        texts = tokenizer.apply_chat_template(conversations, add_generation_prompt=True, tokenize=False, **kwargs)
        return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    texts = ["\n".join(str(message.get("content", "")) for message in messages) for messages in conversations]
    return [len(ids) for ids in tokenizer(texts)["input_ids"]]


def overlong_prompt_problems(
    frames: Sequence[tuple[str, pd.DataFrame]],
    tokenizer,
    max_prompt_length: int,
    what: str,
    chat_template_kwargs: Mapping | None = None,
    max_listed: int = 10,
) -> list[str]:
    """One message per file whose prompts exceed ``max_prompt_length`` tokens, naming the rows and their lengths."""
    problems = []
    for path, frame in frames:
        lengths = prompt_token_lengths(frame, tokenizer, chat_template_kwargs)
        rows = [(row, length) for row, length in enumerate(lengths) if length > max_prompt_length]
        if rows:
            listed = ", ".join(f"row {row} ({length} tokens)" for row, length in rows[:max_listed])
            more = f" and {len(rows) - max_listed} more" if len(rows) > max_listed else ""
            problems.append(
                f"{what}: {path}: {len(rows)} prompt(s) longer than data.max_prompt_length={max_prompt_length}: "
                f"{listed}{more}. verl would not drop them (data.filter_overlong_prompts=false) and its agent loop "
                "fails on them after the first rollout. Set data.filter_overlong_prompts=true, raise "
                "data.max_prompt_length, or shorten those rows."
            )
    return problems
