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
"""Command lines that prepare and validate RL parquet files; the schema itself is :mod:`treetune_verl.data.rl_schema`.

``prepare_math`` (MATH train/test, MATH-500, keeping the worked solutions), ``prepare_competition`` (AIME 2024, AIME
2025, AMC 2023) and ``prepare_gpqa`` (multiple choice) read a local JSONL file or the hub and write parquet;
``validate_rl_parquet`` checks existing files. The input records and flags they share are
:mod:`treetune_verl.data.records`, the preset-based conversion :mod:`treetune_verl.data.presets`.
"""
