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
"""Input records and command-line flags shared by the data preparation scripts (``treetune_scripts/data/``).

The input side of every data set: local files or a hub split, cut to ``--limit``, and the flags that choose them. The
rows the scripts write follow the library's schema, :mod:`treetune_verl.data.rl_schema` (one place for the schema
and its validator).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from treetune_verl.data.rl_schema import DEFAULT_INSTRUCTION


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
