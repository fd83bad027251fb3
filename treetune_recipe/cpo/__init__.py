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
"""The CPO recipe: GRPO with hint-guided advantage shaping.

Entry point ``main_cpo`` (Hydra config ``config/cpo_trainer.yaml``) runs upstream ``run_ppo`` with ``CPOTaskRunner``,
which trains with ``RayCPOTrainer`` (``trainer.ray_trainer``: difficulty labels, hint batch from ``teacher.hint``,
hinted log-probs). On the workers ``methods.loss`` shapes the advantages with the wrapper chosen by ``cpo.method``
(``methods.cpo_wrappers``) and the token selection of ``cpo.loss_position`` (``methods.core_algos``, which also
registers the ``cpo`` advantage estimator), then calls upstream ``ppo_loss``. ``config`` validates the ``cpo`` block,
``preflight`` checks a run before Ray starts, ``reports.credit_dump`` writes per-token credit and ``credit_report``
renders it as one HTML page, ``cpu_run`` launches the recipe on CPU, ``experiments`` holds the CPU experiments' library
(warm start, task settings, CPO vs GRPO). The constants below name the config and the entry point for launchers and
tests.
"""

from pathlib import Path

#: The recipe's Hydra config folder (``--config-path``), its config and its entry point.
CONFIG_DIR = Path(__file__).resolve().parent / "config"
CONFIG_NAME = "cpo_trainer"
ENTRY_MODULE = "treetune_recipe.cpo.main_cpo"
