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
"""Where the supported verl releases keep the pieces a recipe builds on (the few seams that moved).

=====================  ==========================================  =============================================
seam                   verl 0.9.1 (default)                        verl 0.7.1
=====================  ==========================================  =============================================
TaskRunner module      ``verl.trainer.main_ppo_v0`` (v0 path,       ``verl.trainer.main_ppo``
                       ``trainer.use_v1=false``)
TaskRunner class       ``@ray.remote``: subclass the undecorated    plain class
                       class Ray keeps in ``__ray_actor_class__``
worker implementation  engine workers only (no legacy workers;      legacy ``fsdp_workers`` unless
                       the key is gone)                             ``trainer.use_legacy_worker_impl=disable``
=====================  ==========================================  =============================================
"""

from __future__ import annotations

import importlib
from types import ModuleType

from treetune_verl.version import verl_is


def trainer_module() -> ModuleType:
    """The verl module whose ``TaskRunner.run`` builds its trainer from the module global ``RayPPOTrainer``."""
    # SYNC WARNING: verl/trainer/main_ppo_v0.py (0.9.1 l.25 import, l.218 use); 0.7.1 verl/trainer/main_ppo.py (l.343)
    return importlib.import_module("verl.trainer.main_ppo" if verl_is("0.7.1") else "verl.trainer.main_ppo_v0")


def task_runner_base() -> type:
    """verl's ``TaskRunner`` as a plain class, to subclass (then wrap the subclass with ``ray.remote``).

    verl 0.9.1 decorates it with ``@ray.remote``, and Ray refuses to subclass an actor class; the undecorated class
    is kept by Ray as ``__ray_actor_class__``. Subclassing it reuses ``run`` unchanged instead of copying it.
    """
    # SYNC WARNING: verl/trainer/main_ppo_v0.py:TaskRunner (0.9.1 l.136-137, @ray.remote); 0.7.1 main_ppo.py l.108
    runner = trainer_module().TaskRunner
    return getattr(runner, "__ray_actor_class__", runner)


def uses_engine_workers(config) -> bool:
    """True when a run of ``config`` builds verl's engine workers (the path the recipes need)."""
    # SYNC WARNING: verl/trainer/main_ppo.py:TaskRunner.add_actor_rollout_worker (0.7.1 l.123-131, legacy workers
    # unless use_legacy_worker_impl=disable); verl 0.9.1 has engine workers only
    return not verl_is("0.7.1") or config.trainer.get("use_legacy_worker_impl", "auto") == "disable"
