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
"""Entry point of the CPO recipe.

    python -m treetune_recipe.cpo.main_cpo key=value ...                          # GPU, config cpo_trainer
    python -m treetune_recipe.cpo.main_cpo platform=cpu ...                       # CPU backend profile
    python -m treetune_recipe.cpo.main_cpo -m cpo.method=seq_kl,mi3 ...      # sweep, one job after another

Any verl override works: the config inherits verl's ``ppo_trainer``. A ``cpo.*`` override of a key the block does
not have (``cpo.x=1``, ``+cpo.x=1``) or of a value it refuses (``cpo.teacher=x``) stops before Hydra composes, with
one line naming the valid keys or values; every other start-up problem stops before Ray, without a traceback.
"""

import sys

import hydra
import ray
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict
from verl.experimental.reward_loop import migrate_legacy_reward_impl
from verl.trainer.main_ppo import run_ppo
from verl.utils.device import auto_set_device

from treetune_recipe.cpo.config import apply_method_run_settings, check_cpo_overrides
from treetune_recipe.cpo.trainer.preflight import check_cpo_run
from treetune_verl.clean_exit import RearmSigterm, exit_on_sigterm, shutdown_ray
from treetune_verl.preflight import PreflightError, check_run_config
from treetune_verl.run_folder import RunFolderError, prepare_run_folder


@hydra.main(config_path="config", config_name="cpo_trainer", version_base=None)
def main(config) -> None:
    auto_set_device(config)
    config = migrate_legacy_reward_impl(config)
    # The selected method's published settings outside cpo.* (its sampling, updates per rollout, KL), unless the
    # command line sets the same key.
    settings = apply_method_run_settings(config, list(HydraConfig.get().overrides.task))
    if settings.applied:
        print(f"[cpo] {config.cpo.method}: published run settings applied: {' '.join(settings.applied)}")
    if settings.kept:
        print(f"[cpo] {config.cpo.method}: your overrides kept over the published {' '.join(settings.kept)}")
    try:
        check_run_config(config)
        cpo_config = check_cpo_run(config)
    except ValueError as error:  # every start-up check raises one (PreflightError is one) saying what to change
        sys.exit(f"[cpo] {error}")

    # The cpo block as the driver built and checked it, every default and method block included: the run's config
    # file shows it, and the TaskRunner receives the checked object itself (built once, here).
    with open_dict(config):
        config.cpo = OmegaConf.create(cpo_config.to_block())

    from treetune_recipe.cpo.trainer.task_runner import CPOTaskRunner

    # One run per output folder (locks held until the run ends), resume point and metrics history settled here.
    exit_on_sigterm()
    try:
        with prepare_run_folder(config):
            # Each job of a Hydra multirun starts its own Ray cluster, and shuts it down here.
            try:
                # SYNC WARNING: verl/trainer/main_ppo.py:run_ppo accepts task_runner_class (the recipe seam of 0.7.1)
                run_ppo(config, task_runner_class=RearmSigterm(ray.remote(num_cpus=1)(CPOTaskRunner), cpo_config))
            except BaseException:  # SIGINT, SIGTERM, an error: the trainer stops at once, before Ray's shutdown
                shutdown_ray(interrupted=True)
                raise
            shutdown_ray()
    except RunFolderError as error:  # a folder in use, unwritable or damaged, a full disk: one line, path and fix
        sys.exit(f"[cpo] {getattr(error, 'cause', None) or error}")


def cli() -> None:
    """``python -m treetune_recipe.cpo.main_cpo``: the check of the ``cpo.*`` overrides, then Hydra's :func:`main`."""
    try:
        sys.argv[1:] = check_cpo_overrides(sys.argv[1:])  # renamed keys translated, with a note
    except PreflightError as error:
        sys.exit(f"[cpo] {error}")
    main()


if __name__ == "__main__":
    cli()
