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
"""Pause points: named moments of a training run where a fault-injection harness can stop it at an exact place.

A process started with ``TREETUNE_PAUSE_AT=<point>@<step>`` and ``TREETUNE_PAUSE_FILE=<path>`` pauses the first time
it reaches that point at that step: it writes ``{"point", "step", "pid"}`` to the file (atomically) and sleeps until it
is killed. Without those variables (every real run) :func:`pause_point` returns at once. The kill sweep
(``treetune_scripts/kill_sweep.py``) and the interrupted-runs e2e test kill runs there; the points are the write
boundaries of a step, in the order verl's ``fit()`` reaches them:

==================== ==========================================================================================
``teacher_update``   a moving teacher has just changed its weights (a refresh before the reference pass, or an EMA
                     step after the actor update); a recipe calls it
``update``           after the step's rollout, rewards and advantages, right before the actor update
``checkpoint_saved`` verl's save of ``global_step_N`` returned; not yet marked complete
``checkpoint_complete`` the folder is marked complete; the step's metrics record is not written yet
``validation``       a validation starts (``test_freq``, the last step, or before training under the resume step)
``metrics_record``   the step's metrics record is about to be written to the file logger's file
==================== ==========================================================================================
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

POINTS = ("update", "checkpoint_saved", "checkpoint_complete", "validation", "metrics_record", "teacher_update")
PAUSE_AT_ENV = "TREETUNE_PAUSE_AT"
PAUSE_FILE_ENV = "TREETUNE_PAUSE_FILE"
#: A paused process that nobody kills ends itself after this long (a harness that died).
PAUSE_LIMIT_S = 1800


def requested_pause() -> tuple[str, int] | None:
    """``(point, step)`` from ``TREETUNE_PAUSE_AT``, or None when unset.

    Raises:
        ValueError: on a malformed value or an unknown point.
    """
    value = os.environ.get(PAUSE_AT_ENV, "")
    if not value:
        return None
    point, _, step = value.partition("@")
    if point not in POINTS or not step.isdigit():
        raise ValueError(f"{PAUSE_AT_ENV}={value!r}: expected <point>@<step> with a point of {', '.join(POINTS)}.")
    return point, int(step)


def pause_point(point: str, step: int) -> None:
    """Pause here when this process was asked to pause at ``point`` of ``step``; otherwise return at once."""
    if requested_pause() != (point, int(step)):
        return
    pause_file = Path(os.environ[PAUSE_FILE_ENV])
    temporary = pause_file.with_name(pause_file.name + f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps({"point": point, "step": int(step), "pid": os.getpid()}))
    os.replace(temporary, pause_file)
    print(f"[pause_point] paused at {point} of step {step} (pid {os.getpid()}); waiting to be killed", flush=True)
    time.sleep(PAUSE_LIMIT_S)
    raise SystemExit(f"[pause_point] nobody killed this process within {PAUSE_LIMIT_S} s of {point}@{step}")


def pause_overrides(point: str, step: int, pause_file: str | Path) -> list[str]:
    """Hydra overrides that make a verl run's Ray processes pause at ``point`` of ``step`` (they read the variables
    through Ray's runtime environment, which reaches the TaskRunner actor where the trainer runs)."""
    if point not in POINTS:
        raise ValueError(f"unknown pause point {point!r}; one of {', '.join(POINTS)}")
    env = "++ray_kwargs.ray_init.runtime_env.env_vars"
    return [f"{env}.{PAUSE_AT_ENV}={point}@{int(step)}", f"{env}.{PAUSE_FILE_ENV}={Path(pause_file).resolve()}"]
