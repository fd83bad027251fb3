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
"""The command lines of the CPU experiments, each a set of real recipe runs on a small model.

``warm_start`` builds (or takes the shipped) model fine-tuned with verl's own SFT trainer so that RL has something to
shape, ``cpo_vs_grpo`` runs CPO against matched GRPO over seeds from that warm start, and ``summary`` turns the
experiment's ``results.csv`` into ``summary.md`` and ``curves.png``. Each parses its arguments and calls the
experiments' library, :mod:`treetune_recipe.cpo.experiments`.
"""
