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
"""The metrics history of a run: verl's ``file`` logger's JSON lines, as every reader of this project reads them.

verl's ``fit()`` writes one line per training step, ``{"step": N, "data": {...}}``, whose data always holds
``training/global_step``. Before training it also logs the initial validation on its own line: under step 0 for a
fresh run, and under the resume step for a resumed one (verl's behaviour, kept). That second kind is a
*validation-only record*; it is not a step. Every reader tells the two apart here (:func:`is_training_record`):

* the resume point (``treetune_verl.run_folder``) counts a step as logged only by its training record;
* the per-step readers (:func:`read_metrics`, the plots, the experiment summary) take the training records, plus the
  initial validation of step 0; a resumed run's validation under an earlier step is left out (those weights were
  already validated, or not, when that step was logged).

A line that is not a complete JSON record (a write cut by a kill) is skipped by every reader.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

#: The key verl's ``fit()`` puts in the data of every training step's record, and of no other record.
# SYNC WARNING: verl/trainer/ppo/ray_trainer.py:RayPPOTrainer.fit (metrics["training/global_step"], 0.9.1 l.1767,
# 0.7.1 l.1573)
TRAINING_STEP_KEY = "training/global_step"


def file_logger_path(config: Any) -> Path | None:
    """Where verl's ``file`` logger writes, or None when the run does not use it."""
    # SYNC WARNING: verl/utils/tracking.py:FileLogger.__init__ (VERL_FILE_LOGGER_PATH, else
    # VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl)
    loggers = config.trainer.get("logger") or []
    if "file" not in ([loggers] if isinstance(loggers, str) else list(loggers)):
        return None
    env_vars = config.get("ray_kwargs", {}).get("ray_init", {}).get("runtime_env", {}).get("env_vars", {}) or {}
    path = env_vars.get("VERL_FILE_LOGGER_PATH") or os.environ.get("VERL_FILE_LOGGER_PATH")
    if path:
        return Path(path).expanduser().resolve()
    root = env_vars.get("VERL_FILE_LOGGER_ROOT") or os.environ.get("VERL_FILE_LOGGER_ROOT", ".")
    trainer = config.trainer
    return (Path(root).expanduser() / trainer.project_name / f"{trainer.experiment_name}.jsonl").resolve()


def parse_record(line: str) -> dict | None:
    """The record of one line (``{"step": int, "data": dict}``), or None for a line a kill cut or that is not one."""
    try:
        record = json.loads(line)
        record["step"] = int(record["step"])
    except (ValueError, KeyError, TypeError):
        return None
    return record if isinstance(record.get("data"), dict) else None


def read_records(metrics_path: str | Path) -> list[dict]:
    """Every complete record of the file, in file order (none when the file does not exist)."""
    metrics_path = Path(metrics_path)
    if not metrics_path.is_file():
        return []
    records = (parse_record(line) for line in metrics_path.read_text().splitlines())
    return [record for record in records if record is not None]


def is_training_record(record: dict) -> bool:
    """The record of a training step (not a validation-only record)."""
    return TRAINING_STEP_KEY in record["data"]


def training_steps(metrics_path: str | Path) -> list[int]:
    """The steps of the file's training records, in file order (a step logged twice appears twice)."""
    return [record["step"] for record in read_records(metrics_path) if is_training_record(record)]


def read_metrics(metrics_path: str | Path) -> dict[int, dict[str, Any]]:
    """``{step: {metric: value}}``: the training records and the initial validation of step 0, merged per step."""
    by_step: dict[int, dict[str, Any]] = {}
    for record in read_records(metrics_path):
        if is_training_record(record) or record["step"] == 0:
            by_step.setdefault(record["step"], {}).update(record["data"])
    return by_step


def step_times(metrics_path: str | Path) -> list[tuple[int, float]]:
    """``(step, timing_s/step)`` for every logged step."""
    return [
        (step, data["timing_s/step"])
        for step, data in sorted(read_metrics(metrics_path).items())
        if "timing_s/step" in data
    ]


def keep_metrics_up_to(metrics_path: str | Path, last_step: int) -> int:
    """Drop the records of steps after ``last_step`` (they will be logged again); returns how many were dropped.

    Lines that are not complete records (a write cut by a kill) are dropped too. Written atomically.
    """
    metrics_path = Path(metrics_path)
    if not metrics_path.is_file():
        return 0
    kept, dropped = [], 0
    for line in metrics_path.read_text().splitlines():
        record = parse_record(line)
        if record is not None and record["step"] <= last_step:
            kept.append(line)
        else:
            dropped += bool(line.strip())
    if dropped:
        temporary = metrics_path.with_name(metrics_path.name + ".tmp")
        temporary.write_text("".join(line + "\n" for line in kept))
        os.replace(temporary, metrics_path)
    return dropped
