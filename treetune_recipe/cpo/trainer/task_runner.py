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
"""The Ray TaskRunner of the CPO recipe.

verl's ``TaskRunner.run`` (0.9.1: ``main_ppo_v0``, the v0 path; 0.7.1: ``main_ppo``) builds the trainer from its
module global ``RayPPOTrainer``. This subclass swaps that global for ``RayCPOTrainer`` inside its own Ray actor process
(the one documented patch, ``treetune_verl.patches.use_trainer_class``), makes verl's file logger append
(``append_file_logger``: the driver already dropped the steps a resume recomputes), maps the actor role to
``TeacherWorker`` (a teacher refreshed from the actor) and otherwise reuses ``run``
unchanged: no copy of upstream code. Its base is the undecorated ``TaskRunner``
(``treetune_verl.verl_compat.task_runner_base``). It lives in an importable module (not ``__main__``) because Ray
pickles the class by reference.
"""

import ray

from treetune_recipe.cpo.trainer.ray_trainer import RayCPOTrainer
from treetune_verl.patches import append_file_logger, use_trainer_class
from treetune_verl.teacher_worker import TeacherWorker
from treetune_verl.verl_compat import task_runner_base


class CPOTaskRunner(task_runner_base()):
    """``TaskRunner`` whose ``run`` trains with ``RayCPOTrainer`` and appends to the metrics file."""

    def __init__(self, cpo_config=None):
        """``cpo_config``: the ``CPOConfig`` the driver built and checked (``main_cpo``), handed to the trainer; None
        (a GRPO run of another entry point) builds it from the config's ``cpo`` block."""
        # Defined here so that Ray finds ``__init__`` by reference. Inherited, it would be verl 0.9.1's
        # ``TaskRunner.__init__``, which cloudpickle cannot find under its name (the module's ``TaskRunner`` is the
        # Ray actor class): it would ship a copy of the function whose ``super()`` names a copy of the class, and fail
        # with "super(type, obj): obj must be an instance or subtype of type".
        super().__init__()
        self.cpo_config = cpo_config

    def add_actor_rollout_worker(self, config):
        """verl's actor worker, as a ``TeacherWorker`` (a ``refreshed`` teacher copies the actor's weights
        into the reference; otherwise it is verl's ``ActorRolloutRefWorker`` unchanged)."""
        # SYNC WARNING: verl/trainer/main_ppo_v0.py:TaskRunner.add_actor_rollout_worker maps one role to
        # ray.remote(ActorRolloutRefWorker) and returns (worker class, worker group class)
        from verl.trainer.ppo.ray_trainer import Role
        from verl.workers.engine_workers import ActorRolloutRefWorker

        worker_class, group_class = super().add_actor_rollout_worker(config)
        if worker_class is not ActorRolloutRefWorker:
            raise TypeError(f"the CPO recipe runs on verl's engine ActorRolloutRefWorker, got {worker_class!r}")
        role = Role.ActorRolloutRef if Role.ActorRolloutRef in self.role_worker_mapping else Role.ActorRollout
        self.role_worker_mapping[role] = ray.remote(TeacherWorker)
        return TeacherWorker, group_class

    def run(self, config):
        use_trainer_class(RayCPOTrainer, cpo_config=self.cpo_config)
        append_file_logger()
        return super().run(config)
