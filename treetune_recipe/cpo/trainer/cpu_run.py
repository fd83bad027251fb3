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
"""Launch the CPO recipe on the CPU backend with the tiny-run overrides (benchmarks, experiment, e2e tests)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from treetune_recipe.cpo import CONFIG_DIR, CONFIG_NAME, ENTRY_MODULE
from treetune_verl.tiny_run import TrainingRun, launch_training, tiny_run_overrides


def cpo_cpu_overrides(
    assets_dir: str | Path, run_dir: str | Path, *, total_training_steps: int, experiment_name: str
) -> list[str]:
    """The overrides every CPU run of the recipe starts with: ``platform=cpu``,
    :func:`~treetune_verl.tiny_run.tiny_run_overrides` and ``hydra.run.dir=<run_dir>/hydra``."""
    common = tiny_run_overrides(
        assets_dir, run_dir, total_training_steps=total_training_steps, experiment_name=experiment_name
    )
    return ["platform=cpu", *common, f"hydra.run.dir={Path(run_dir).resolve() / 'hydra'}"]


def cpo_cpu_command(
    assets_dir: str | Path,
    run_dir: str | Path,
    *,
    total_training_steps: int,
    experiment_name: str,
    overrides: Sequence[str] = (),
) -> list[str]:
    """``python -m <the recipe's entry point>`` with :func:`cpo_cpu_overrides`, then ``overrides``: for a caller that
    runs the process itself (its own signals and process group)."""
    common = cpo_cpu_overrides(
        assets_dir, run_dir, total_training_steps=total_training_steps, experiment_name=experiment_name
    )
    return [sys.executable, "-m", ENTRY_MODULE, *common, *overrides]


def launch_cpo_on_cpu(
    overrides: list[str],
    log_path: str | Path,
    *,
    assets_dir: str | Path,
    run_dir: str | Path,
    total_training_steps: int,
    experiment_name: str,
    **launch_kwargs: Any,
) -> TrainingRun:
    """:func:`~treetune_verl.tiny_run.launch_training` of the CPO recipe (``main_cpo``, ``cpo_trainer``).

    Adds :func:`cpo_cpu_overrides` before ``overrides``, so the caller's overrides win, and runs in ``run_dir``
    unless ``cwd`` is given.

    Args:
        overrides: the caller's Hydra overrides, applied after the common ones.
        log_path: where to write the combined stdout/stderr.
        assets_dir: tiny assets (model and data) to train on.
        run_dir: run folder: metrics file, checkpoints and Hydra's output folder.
        total_training_steps: ``trainer.total_training_steps``.
        experiment_name: ``trainer.experiment_name``.
        **launch_kwargs: passed to ``launch_training`` (``timeout_s``, ``env``, ``echo``, ``cwd``, ``append_log``...).
    """
    common = cpo_cpu_overrides(
        assets_dir, run_dir, total_training_steps=total_training_steps, experiment_name=experiment_name
    )
    launch_kwargs.setdefault("cwd", run_dir)
    return launch_training(
        [*common, *overrides],
        log_path,
        entry_module=ENTRY_MODULE,
        config_dir=CONFIG_DIR,
        config_name=CONFIG_NAME,
        **launch_kwargs,
    )
