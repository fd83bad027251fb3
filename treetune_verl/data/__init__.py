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
"""RL data of the library: verl's RL parquet schema as this project writes it, and the checks of data files.

The schema is :mod:`treetune_verl.data.rl_schema`: ``build_row`` and ``write_rl_parquet`` write rows;
``validate_rl_dataframe``, ``check_rl_files`` and ``overlong_prompt_problems`` are the checks a recipe's preflight
runs on its data files before Ray starts. :mod:`treetune_verl.data.records` reads the input records and holds the
flags the preparation scripts share, :mod:`treetune_verl.data.presets` converts the preset-based data sets (MATH,
MATH-500, the competition sets). The command lines that prepare and validate data sets are in
:mod:`treetune_scripts.data`; they only parse their arguments and call these modules.
"""
