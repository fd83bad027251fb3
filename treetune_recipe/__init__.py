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
"""RL recipes built on :mod:`treetune_verl` and upstream verl, one subpackage per recipe.

A recipe brings its Hydra config (inheriting verl's ``ppo_trainer``), an entry point that runs upstream ``run_ppo``,
and the trainer, loss and checks it needs. Today there is one: :mod:`treetune_recipe.cpo` (entry point
``python -m treetune_recipe.cpo.main_cpo``).
"""
