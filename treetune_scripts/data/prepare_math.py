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
"""Prepare MATH (train/test) or MATH-500 in verl's RL parquet schema, keeping the worked solutions.

Examples::

    python -m treetune_scripts.data.prepare_math --preset math_train --input MATH_train.jsonl \
        --output data/train_math.parquet
    python -m treetune_scripts.data.prepare_math --preset math500 --output data/test_math500.parquet   # from the hub

Input records need a question (``problem``/``question``) and a worked solution (``solution``); the ground truth is
``answer`` when present, else the last ``\\boxed{}`` of the solution. Records with neither are skipped (counted).
"""

from __future__ import annotations

from treetune_verl.data.presets import Preset, run_preset_cli

PRESETS = {
    "math_train": Preset("hendrycks_math", "train", "DigitalLearningGmbH/MATH-lighteval", "train"),
    "math_test": Preset("hendrycks_math", "test", "DigitalLearningGmbH/MATH-lighteval", "test"),
    "math500": Preset("math500", "test", "HuggingFaceH4/MATH-500", "test"),
}


def main(argv: list[str] | None = None) -> None:
    run_preset_cli(PRESETS, __doc__, argv)


if __name__ == "__main__":
    main()
