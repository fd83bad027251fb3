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
"""Check parquet files against the RL schema of :mod:`treetune_scripts.data.rl_schema`.

Usage::

    python -m treetune_scripts.data.validate_rl_parquet data/train_math.parquet
    python -m treetune_scripts.data.validate_rl_parquet --no-require-solution data/test_*.parquet

Every problem is printed as ``<file>: row <i>, column <name>: <what is wrong>``; the exit code is 1 when there is
any. :func:`validate_rl_dataframe` is the same check for a loaded ``pandas.DataFrame``; :func:`check_rl_files` runs
it on config file lists and raises (the CPO preflight calls it on the train files with ``require_solution=True`` and
on the validation files with ``require_solution=False``).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from treetune_verl.utils.reward_score.math_answer import resolve_route

REQUIRED_COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")
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


def _row_problems(row: Mapping[str, Any], require_solution: bool) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if not _is_nonempty_text(row.get("data_source")):
        problems.append(("data_source", "must be non-empty text naming the reward route"))
    problems.extend(_prompt_problems(row.get("prompt")))
    if not _is_nonempty_text(row.get("ability")):
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
    if not _is_nonempty_text(extra_info.get("question")):
        problems.append(("extra_info.question", "must be the non-empty question text (used by the hint prompt)"))
    solution = extra_info.get("solution")
    if require_solution and not _is_nonempty_text(solution):
        problems.append(("extra_info.solution", "missing or empty; training rows need the full worked solution"))
    elif solution is not None and not isinstance(solution, str):
        problems.append(("extra_info.solution", f"must be text or null, got {type(solution).__name__}"))
    return problems


def validate_rl_dataframe(df: pd.DataFrame, require_solution: bool = True) -> list[str]:
    """Every schema problem of a loaded RL dataset.

    Args:
        df: the rows, e.g. ``pd.read_parquet(path)``.
        require_solution: demand a non-empty ``extra_info.solution`` (training files) or allow null (validation).

    Returns:
        One message per problem, ``"row <i>, column <name>: <what is wrong>"`` (row = position in ``df``);
        empty when the data is valid.
    """
    missing = [column for column in REQUIRED_COLUMNS if column not in df.columns]
    if missing:
        return [f"column {column}: missing (the file has {list(df.columns)})" for column in missing]
    if df.empty:
        return ["the dataset has no rows"]
    problems = []
    for position, row in enumerate(df[list(REQUIRED_COLUMNS)].to_dict(orient="records")):
        for column, message in _row_problems(row, require_solution):
            problems.append(f"row {position}, column {column}: {message}")
    return problems


def check_rl_files(files: Any, require_solution: bool = True, what: str = "data files", max_listed: int = 20) -> None:
    """Validates parquet files before a run starts and raises on the first file with problems.

    Args:
        files: one path or a list of paths (``str``, ``Path``, an OmegaConf ``ListConfig``); ``None`` is skipped, and
            so are remote paths (``hdfs://...``), which verl copies later.
        require_solution: demand ``extra_info.solution`` on every row (training files).
        what: the config key the files come from, used in the message (e.g. ``"data.train_files"``).
        max_listed: how many problems the message lists (the command line lists them all).

    Raises:
        ValueError: naming the config key, the file, the problem count and the first problems.
    """
    if files is None:
        return
    paths = [files] if isinstance(files, str | Path) else list(files)
    for path in map(str, paths):
        if "://" in path:
            continue
        if not Path(path).exists():
            raise ValueError(f"{what}: file {path} does not exist.")
        problems = validate_rl_dataframe(pd.read_parquet(path), require_solution=require_solution)
        if problems:
            listed = "\n  ".join(problems[:max_listed])
            more = f"\n  ... and {len(problems) - max_listed} more" if len(problems) > max_listed else ""
            flag = "" if require_solution else " --no-require-solution"
            raise ValueError(
                f"{what}: {path} has {len(problems)} schema problems:\n  {listed}{more}\n"
                f"List them all with: python -m treetune_scripts.data.validate_rl_parquet{flag} {path}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", help="parquet files to check")
    parser.add_argument(
        "--no-require-solution", action="store_true", help="allow an empty extra_info.solution (validation files)"
    )
    args = parser.parse_args(argv)
    total_problems = 0
    for path in args.files:
        try:
            df = pd.read_parquet(path)
        except Exception as error:
            print(f"{path}: cannot be read as parquet: {error}")
            total_problems += 1
            continue
        problems = validate_rl_dataframe(df, require_solution=not args.no_require_solution)
        for problem in problems:
            print(f"{path}: {problem}")
        total_problems += len(problems)
        if "data_source" in df.columns:
            sources = Counter(map(str, df["data_source"]))
            routes = ", ".join(f"{name} x{n} -> {resolve_route(name)[0]}" for name, n in sorted(sources.items()))
            print(f"{path}: {len(df)} rows, {len(problems)} problems; reward routes: {routes}")
    return 1 if total_problems else 0


if __name__ == "__main__":
    sys.exit(main())
