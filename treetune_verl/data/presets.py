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
"""Data sets described by a preset (data source, split, hub name): records with a question, a worked solution and an
answer (MATH, MATH-500, the competition sets) -> rows of :mod:`treetune_verl.data.rl_schema`.

:func:`run_preset_cli` is the command line that the preset-based preparation scripts share
(``python -m treetune_scripts.data.prepare_math``, ``python -m treetune_scripts.data.prepare_competition``): each
script passes its own presets.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from treetune_verl.data.records import add_common_arguments, first_field, load_records, resolve_data_source
from treetune_verl.data.rl_schema import build_row, final_answer_from_solution, write_rl_parquet


@dataclass(frozen=True)
class Preset:
    data_source: str
    split: str
    hf_dataset: str
    hf_split: str


QUESTION_FIELDS = ("problem", "question")
SOLUTION_FIELDS = ("solution",)
ANSWER_FIELDS = ("answer", "ground_truth", "final_answer")
SUBJECT_FIELDS = ("subject", "type")
LEVEL_FIELDS = ("level",)


def convert_records(records: list[dict], args: argparse.Namespace, preset: Preset) -> tuple[list[dict], int]:
    """Rows for the records that have a question and a ground truth; also returns how many were skipped."""
    rows, skipped = [], 0
    data_source = resolve_data_source(args, preset.data_source)
    for record in records:
        question = first_field(record, QUESTION_FIELDS)
        solution = first_field(record, SOLUTION_FIELDS)
        answer = first_field(record, ANSWER_FIELDS) or final_answer_from_solution(solution)
        if not question or answer is None:
            skipped += 1
            continue
        rows.append(
            build_row(
                data_source=data_source,
                question=str(question).strip(),
                ground_truth=str(answer),
                solution=solution,
                split=args.split or preset.split,
                index=len(rows),
                instruction=args.instruction,
                system_prompt=args.system_prompt,
                subject=first_field(record, SUBJECT_FIELDS),
                level=first_field(record, LEVEL_FIELDS),
            )
        )
    return rows, skipped


def run_preset_cli(presets: dict[str, Preset], description: str, argv: list[str] | None) -> None:
    """Command line shared by the preset-based prep scripts: ``--preset`` plus the common flags, then convert."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(presets), required=True, help="which dataset the input is")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    preset = presets[args.preset]
    rows, skipped = convert_records(load_records(args, preset.hf_dataset, preset.hf_split), args, preset)
    path = write_rl_parquet(rows, args.output)
    print(f"wrote {len(rows)} rows to {path} (skipped {skipped} without a question or an answer)")
