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
"""The peak memory of each test module, from a test run with ``TREETUNE_MODULE_MEMORY=<file>`` (``treetune_tests/
conftest.py`` writes one JSON line per module: its peak resident memory, process tree summed, and when it ran).

Prints a markdown table, largest peak first: the module, its peak (its process tree's resident memory, summed, so
shared pages count more than once), its wall time, the largest peak of a module that ran at the same time on the other
worker, and the most memory the whole machine had in use while the module ran (total − available).

Usage::

    TREETUNE_MODULE_MEMORY=outputs/module_memory.jsonl make test
    python -m treetune_scripts.module_memory_table outputs/module_memory.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def beside(record: dict, records: list[dict]) -> dict | None:
    """The record of another worker with the largest peak whose time overlaps ``record``'s, or None."""
    overlapping = [
        other
        for other in records
        if other["worker"] != record["worker"] and other["start"] < record["end"] and record["start"] < other["end"]
    ]
    return max(overlapping, key=lambda other: other["peak_rss_mib"], default=None)


def table(records: list[dict]) -> list[str]:
    lines = [
        "| module | peak RSS (GiB) | wall (s) | largest beside it (GiB) | machine in use (GiB) |",
        "|---|---|---|---|---|",
    ]
    for record in sorted(records, key=lambda r: -r["peak_rss_mib"]):
        other = beside(record, records)
        other_mib = other["peak_rss_mib"] if other else 0
        other_text = f"{other_mib / 1024:.1f} ({Path(other['module']).name})" if other else "-"
        lines.append(
            f"| {Path(record['module']).name} | {record['peak_rss_mib'] / 1024:.1f} | "
            f"{record['end'] - record['start']:.0f} | {other_text} | "
            f"{record['machine_used_mib'] / 1024:.1f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", type=Path, help="the file TREETUNE_MODULE_MEMORY named")
    args = parser.parse_args(argv)
    print("\n".join(table(read_records(args.records))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
