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
"""Prepare GPQA in verl's RL parquet schema (multiple choice, ground truth = option letter).

Examples::

    python -m treetune_scripts.data.prepare_gpqa --input gpqa_diamond.jsonl --output data/test_gpqa.parquet
    python -m treetune_scripts.data.prepare_gpqa --output data/test_gpqa.parquet   # gated on the hub: log in first

Two input layouts are accepted:

* raw GPQA: ``Question``, ``Correct Answer``, ``Incorrect Answer 1..3``, ``Explanation`` (``Subdomain``). The four
  options are shuffled with a per-row seed (``--seed`` + row number), so the output is reproducible;
* already lettered: ``question``, ``choices`` (a list, option A first), ``answer`` (a letter), ``explanation``.

The question becomes ``<question>\\nChoices:\\n(A): ...\\n(B): ...`` (the reference's layout); the reward reads the
option texts back from ``extra_info.question`` to match a boxed option text to its letter.
"""

from __future__ import annotations

import argparse
import random
import string

from treetune_verl.data.records import add_common_arguments, first_field, load_records, resolve_data_source
from treetune_verl.data.rl_schema import build_row, write_rl_parquet

DATA_SOURCE = "gpqa"
HF_DATASET, HF_CONFIG, HF_SPLIT = "Idavidrein/gpqa", "gpqa_diamond", "train"
RAW_INCORRECT_FIELDS = ("Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")


def lettered_question(question: str, options: list[str]) -> str:
    lines = [f"({letter}): {option}" for letter, option in zip(string.ascii_uppercase, options)]
    return question.strip() + "\nChoices:\n" + "\n".join(lines)


def options_and_answer(record: dict, row_seed: int) -> tuple[list[str], str] | None:
    """(options in display order, correct letter), or ``None`` when the record has neither layout."""
    if record.get("Correct Answer") is not None:
        correct = str(record["Correct Answer"]).strip()
        options = [correct] + [str(record[name]).strip() for name in RAW_INCORRECT_FIELDS if record.get(name)]
        random.Random(row_seed).shuffle(options)
        return options, string.ascii_uppercase[options.index(correct)]
    choices, answer = record.get("choices"), record.get("answer")
    if choices is None or answer is None:
        return None
    options = [str(choice).strip() for choice in choices]
    letter = str(answer).strip().strip("()").upper()
    if len(letter) != 1 or letter not in string.ascii_uppercase[: len(options)]:
        return None
    return options, letter


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser)
    parser.add_argument("--seed", type=int, default=0, help="base seed of the option shuffle (raw GPQA input)")
    args = parser.parse_args(argv)
    if not args.input and not args.hf_dataset:
        args.hf_config = args.hf_config or HF_CONFIG
    records = load_records(args, HF_DATASET, HF_SPLIT)
    rows, skipped = [], 0
    for row_number, record in enumerate(records):
        question = first_field(record, ("Question", "question"))
        layout = options_and_answer(record, args.seed + row_number)
        if not question or layout is None:
            skipped += 1
            continue
        options, letter = layout
        rows.append(
            build_row(
                data_source=resolve_data_source(args, DATA_SOURCE),
                question=lettered_question(str(question), options),
                ground_truth=letter,
                solution=first_field(record, ("Explanation", "explanation", "solution")),
                split=args.split or "test",
                index=len(rows),
                instruction=args.instruction,
                system_prompt=args.system_prompt,
                subject=first_field(record, ("Subdomain", "subject")),
                level=first_field(record, ("Writer's Difficulty Estimate", "level")),
            )
        )
    path = write_rl_parquet(rows, args.output)
    print(f"wrote {len(rows)} rows to {path} (skipped {skipped} without a question or lettered options)")


if __name__ == "__main__":
    main()
