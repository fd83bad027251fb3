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
"""verl's RL parquet schema as this project writes it, and the helpers every preparation script shares.

One row::

    data_source: str                      # the reward route key (see treetune_verl/utils/reward_score/math_answer.py)
    prompt: [{role, content}, ...]        # optional system message, then the user message: question + instruction
    ability: str                          # "math"
    reward_model: {style: "rule", ground_truth: str}   # the final answer only
    extra_info: {index: int, split: str, question: str, solution: str | None, subject: str | None,
                 level: str | None}

``extra_info.solution`` is the full worked solution that CPO puts into the hint prompt; training files need it,
validation files may leave it empty. Every file is written with the same Arrow schema, so verl can concatenate
validation files from different preparation scripts (``datasets.concatenate_datasets`` needs identical features).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

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


def read_local_records(paths: Iterable[str | Path]) -> list[dict]:
    """Records from local ``.jsonl``, ``.json`` (a list of objects) or ``.parquet`` files, in order."""
    records: list[dict] = []
    for path in map(Path, paths):
        if not path.exists():
            raise SystemExit(f"input file {path} does not exist.")
        if path.suffix == ".jsonl":
            with path.open(encoding="utf-8") as handle:
                records.extend(json.loads(line) for line in handle if line.strip())
        elif path.suffix == ".json":
            loaded = json.loads(path.read_text(encoding="utf-8"))
            records.extend(loaded if isinstance(loaded, list) else [loaded])
        elif path.suffix == ".parquet":
            records.extend(pq.read_table(path).to_pylist())
        else:
            raise SystemExit(f"input file {path}: unsupported format; use .jsonl, .json or .parquet.")
    return records


def load_hf_records(name: str, split: str, config: str | None = None) -> list[dict]:
    """Records of a Hugging Face dataset split (needs the ``datasets`` package and network access)."""
    try:
        import datasets
    except ImportError as error:
        raise SystemExit("loading from the Hugging Face hub needs `pip install datasets`; or pass --input.") from error
    try:
        dataset = datasets.load_dataset(name, config, split=split)
    except Exception as error:
        raise SystemExit(
            f"could not load {name!r} (config {config!r}, split {split!r}) from the Hugging Face hub: {error}\n"
            "Without internet access, download the data elsewhere and pass the files with --input."
        ) from error
    return [dict(record) for record in dataset]


def first_field(record: dict, names: Sequence[str]) -> Any:
    """The value of the first of ``names`` present in ``record`` with a non-empty value (else ``None``)."""
    for name in names:
        value = record.get(name)
        if value is not None and value != "":
            return value
    return None


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """The input, output and prompt flags shared by the preparation scripts."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--input", nargs="+", help="local .jsonl/.json/.parquet files (default: the Hugging Face hub)")
    source.add_argument("--hf-dataset", help="Hugging Face dataset name (overrides the preset's)")
    parser.add_argument("--hf-config", default=None, help="Hugging Face dataset config")
    parser.add_argument("--hf-split", default=None, help="Hugging Face split (overrides the preset's)")
    parser.add_argument("--output", required=True, help="output parquet path")
    parser.add_argument("--data-source", default=None, help="data_source to write (overrides the preset's)")
    parser.add_argument("--split", default=None, help="extra_info.split to write (overrides the preset's)")
    parser.add_argument(
        "--zero-one", action="store_true", help="append '01' to data_source: the reward then scores 1/0, not +1/-1"
    )
    parser.add_argument(
        "--instruction",
        default=DEFAULT_INSTRUCTION,
        help="text appended to every question in the user message (default: the reference's boxed instruction)",
    )
    parser.add_argument(
        "--system-prompt",
        default=None,
        help="optional system message (the reference files used 'You are a helpful assistant.')",
    )
    parser.add_argument("--limit", type=int, default=None, help="keep only the first N problems")


def load_records(args: argparse.Namespace, hf_dataset: str, hf_split: str) -> list[dict]:
    """Records from ``--input`` files, or else from the hub (``--hf-dataset`` or the preset's), cut to ``--limit``."""
    if args.input:
        records = read_local_records(args.input)
    else:
        records = load_hf_records(args.hf_dataset or hf_dataset, args.hf_split or hf_split, args.hf_config)
    return records[: args.limit] if args.limit is not None else records


def resolve_data_source(args: argparse.Namespace, preset_data_source: str) -> str:
    data_source = args.data_source or preset_data_source
    return data_source + "01" if args.zero_one and not data_source.endswith("01") else data_source
