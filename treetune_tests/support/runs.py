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
"""The checks end-to-end tests make of a finished training run, in one place."""

import json
from pathlib import Path

from treetune_verl.metrics_history import read_metrics, training_steps
from treetune_verl.tiny_run import METRICS_FILE, TrainingRun

#: Lines of the run's log shown when it failed.
LOG_TAIL_LINES = 60


def log_tail(run: TrainingRun, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of the run's combined output."""
    return "\n".join(run.log_path.read_text().splitlines()[-lines:])


def ended_run_log(run: TrainingRun) -> str:
    """The whole log of a run that ended by itself, i.e. was not killed at its time limit (whatever its exit status);
    fails with the tail of the log otherwise."""
    assert not run.timed_out, f"run exceeded its time limit after {run.wall_s:.0f} s:\n{log_tail(run)}"
    return run.log_path.read_text()


def finished_run_log(run: TrainingRun) -> str:
    """The whole log of a run that ended by itself with exit status 0; fails with the tail of the log otherwise."""
    log = ended_run_log(run)
    assert run.returncode == 0, f"exit status {run.returncode}:\n{log_tail(run)}"
    return log


def finished_run_metrics(run: TrainingRun, run_dir: Path, steps: int | None = None) -> dict[int, dict[str, float]]:
    """The metrics by step of a run that finished (:func:`finished_run_log`) and, when ``steps`` is given, logged a
    training record of each step ``1..steps`` exactly once; fails with the tail of the run's log otherwise."""
    finished_run_log(run)
    metrics_path = Path(run_dir) / METRICS_FILE
    if steps is not None:  # each training step once (a validation-only record is not a step)
        logged = training_steps(metrics_path)
        assert logged == list(range(1, steps + 1)), f"logged steps {logged}:\n{log_tail(run)}"
    return read_metrics(metrics_path)


def step_rollouts(run_dir: Path, step: int = 1) -> list[tuple]:
    """(prompt, response, score) of every sample of ``step``, in batch order, from the run's rollout dump
    (``trainer.rollout_data_dir=<run_dir>/rollouts``)."""
    lines = (Path(run_dir) / "rollouts" / f"{step}.jsonl").read_text().splitlines()
    return [(row["input"], row["output"], row["score"]) for row in map(json.loads, lines)]
