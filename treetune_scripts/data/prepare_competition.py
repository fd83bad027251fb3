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
"""Prepare competition sets (AIME 2024, AIME 2025, AMC 2023) in verl's RL parquet schema.

Examples::

    python -m treetune_scripts.data.prepare_competition --preset aime2024 --input aime2024.jsonl \
        --output data/test_aime2024.parquet
    python -m treetune_scripts.data.prepare_competition --preset amc23 --output data/test_amc23.parquet   # from the hub

Input records need a question (``problem``/``question``) and an ``answer`` (else the last ``\\boxed{}`` of a
``solution``). The solution is kept when present; these are validation sets, so it may be missing. The hub names
below are defaults for machines with internet access; pass ``--hf-dataset`` when a mirror uses another name.
"""

from __future__ import annotations

from treetune_verl.data.presets import Preset, run_preset_cli

PRESETS = {
    "aime2024": Preset("aime2024", "test", "HuggingFaceH4/aime_2024", "train"),
    "aime2025": Preset("aime2025", "test", "math-ai/aime25", "test"),
    "amc23": Preset("amc23", "test", "math-ai/amc23", "test"),
}


def main(argv: list[str] | None = None) -> None:
    run_preset_cli(PRESETS, __doc__, argv)


if __name__ == "__main__":
    main()
