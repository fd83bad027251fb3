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
"""One run per output folder, resume that never silently restarts, and metrics history kept across resumes.

Every recipe calls :func:`prepare_run_folder` on the driver before Ray starts and keeps the returned
:class:`RunFolder` open for the run's lifetime (``with prepare_run_folder(config): run_ppo(...)``). It

1. **locks** ``trainer.default_local_dir`` and the metrics file of verl's ``file`` logger (:class:`RunLock`: an
   exclusive ``flock`` on a ``.lock`` file holding the holder's pid, host and start time). A second run stops naming
   the holder; the kernel drops the lock when the holder dies (SIGKILL included), and the next run takes it over with
   a warning;
2. **resolves the resume point** (``trainer.resume_mode=auto``): a checkpoint is *complete* when its
   ``global_step_N`` folder holds :data:`COMPLETE_MARKER`, written by :class:`CompleteCheckpointsMixin` after
   everything else of the save (including verl's ``latest_checkpointed_iteration.txt``). When that pointer names a
   missing or incomplete folder, the pointer is moved back to the newest complete checkpoint with a warning; when
   checkpoints exist but none is complete, the run stops: it never trains from scratch over them;
3. **keeps the metrics history**: records of steps after the resume point (they will be recomputed) are dropped from
   the metrics file, and the file logger appends (``treetune_verl.patches.append_file_logger``), so steps continue
   and none is duplicated.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import re
import signal
import socket
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Written last into ``global_step_N/`` by :class:`CompleteCheckpointsMixin`: the checkpoint is complete.
COMPLETE_MARKER = "treetune_checkpoint_complete.json"
#: verl's pointer to the latest checkpoint, inside ``trainer.default_local_dir``.
# SYNC WARNING: verl/utils/checkpoint/checkpoint_manager.py:get_checkpoint_tracker_filename (file name)
TRACKER_FILE = "latest_checkpointed_iteration.txt"
#: Lock file of a run folder (inside it) and suffix of a metrics file's lock (next to it).
LOCK_FILE = ".treetune_run.lock"
_STEP_FOLDER = re.compile(r"global_step_(\d+)$")


class RunFolderInUseError(RuntimeError):
    """Another live run holds the lock of this output folder or metrics file."""


class ResumeError(RuntimeError):
    """Checkpoints exist but none can be resumed from; training from scratch would overwrite them."""


# ------------------------------------------------------------------------------------------------------------- lock


class RunLock:
    """Exclusive lock of one path for the lifetime of a run, across processes (``fcntl.flock``).

    Args:
        lock_path: the lock file (created with its folder).
        what: what it protects, for messages (e.g. ``"trainer.default_local_dir=/ckpt/run1"``).
    """

    def __init__(self, lock_path: str | Path, what: str):
        self.lock_path = Path(lock_path)
        self.what = what
        self._handle = None

    def acquire(self) -> RunLock:
        """Take the lock, or raise :class:`RunFolderInUseError` naming the holder and how to proceed."""
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.lock_path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(handle)
            handle.close()
            raise RunFolderInUseError(
                f"{self.what} is in use by another run (pid {holder.get('pid', '?')} on host "
                f"{holder.get('host', '?')}, started {holder.get('started', '?')}; lock file {self.lock_path}). "
                "Wait for it to finish or stop it, or give this run its own folder (e.g. another "
                "trainer.default_local_dir / trainer.experiment_name)."
            ) from None
        previous = _read_holder(handle)
        if previous:
            warnings.warn(
                f"{self.what}: taking over the lock of a run that is gone (pid {previous.get('pid', '?')} on host "
                f"{previous.get('host', '?')}, started {previous.get('started', '?')}); it did not end cleanly.",
                stacklevel=2,
            )
        handle.seek(0)
        handle.truncate()
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        handle.write(json.dumps(holder))
        handle.flush()
        os.fsync(handle.fileno())
        self._handle = handle
        return self

    def release(self) -> None:
        """Empty the lock file (a clean end) and drop the lock; a no-op when not held."""
        if self._handle is None:
            return
        self._handle.seek(0)
        self._handle.truncate()
        self._handle.flush()
        fcntl.flock(self._handle, fcntl.LOCK_UN)
        self._handle.close()
        self._handle = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc_info) -> None:
        self.release()


def _read_holder(handle) -> dict:
    handle.seek(0)
    text = handle.read().strip()
    try:
        return json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {"pid": text}


# ------------------------------------------------------------------------------------------------------ checkpoints


def checkpoint_steps(checkpoint_dir: str | Path) -> dict[int, Path]:
    """``{N: folder}`` of every ``global_step_N`` folder in ``checkpoint_dir``."""
    folder = Path(checkpoint_dir)
    if not folder.is_dir():
        return {}
    steps = {}
    for child in folder.iterdir():
        match = _STEP_FOLDER.match(child.name)
        if match and child.is_dir():
            steps[int(match.group(1))] = child
    return steps


def is_complete_checkpoint(step_folder: str | Path) -> bool:
    """The save of this ``global_step_N`` folder finished: its marker is there, and so is its actor state."""
    step_folder = Path(step_folder)
    return (step_folder / COMPLETE_MARKER).is_file() and (step_folder / "actor").is_dir()


def mark_checkpoint_complete(step_folder: str | Path, step: int) -> None:
    """Write :data:`COMPLETE_MARKER` into ``step_folder`` atomically (temporary file, fsync, rename)."""
    step_folder = Path(step_folder)
    temporary = step_folder / (COMPLETE_MARKER + ".tmp")
    with open(temporary, "w") as handle:
        json.dump({"step": step, "saved": datetime.datetime.now(datetime.timezone.utc).isoformat()}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, step_folder / COMPLETE_MARKER)


def resolve_resume_step(checkpoint_dir: str | Path) -> int:
    """The step an ``auto`` resume will start from (0: fresh), repairing verl's pointer when it must.

    Raises:
        ResumeError: when ``global_step_N`` folders exist but none is complete.
    """
    checkpoint_dir = Path(checkpoint_dir)
    steps = checkpoint_steps(checkpoint_dir)
    tracker = checkpoint_dir / TRACKER_FILE
    pointed = None
    if tracker.is_file():
        text = tracker.read_text().strip()
        pointed = int(text) if text.isdigit() else None
    if pointed is not None and pointed in steps and is_complete_checkpoint(steps[pointed]):
        return pointed
    complete = sorted(step for step, folder in steps.items() if is_complete_checkpoint(folder))
    if complete:
        newest = complete[-1]
        warnings.warn(
            f"{tracker} points to step {pointed}, whose checkpoint is missing or incomplete (a save that did not "
            f"finish, or a clean-up); resuming from the newest complete checkpoint, global_step_{newest}.",
            stacklevel=2,
        )
        tracker.write_text(str(newest))
        return newest
    if steps:
        listed = ", ".join(folder.name for _, folder in sorted(steps.items()))
        raise ResumeError(
            f"trainer.default_local_dir={checkpoint_dir} holds checkpoints ({listed}) but none is complete (no "
            f"{COMPLETE_MARKER}: their save did not finish, or they predate it). Training from scratch would "
            "overwrite them. Move them away or choose another trainer.default_local_dir; set "
            "trainer.resume_mode=disable to start over; or, if one is known to be good, resume from it with "
            "trainer.resume_mode=resume_path trainer.resume_from_path=<its folder>."
        )
    if pointed is not None:
        warnings.warn(
            f"{tracker} points to step {pointed}, but there is no checkpoint: training from scratch.", stacklevel=2
        )
        tracker.unlink()
    return 0


class CompleteCheckpointsMixin:
    """Mix into a ``RayPPOTrainer`` subclass (before it): every checkpoint save ends by marking its folder complete."""

    def _save_checkpoint(self):
        # SYNC WARNING: verl/trainer/ppo/ray_trainer.py:RayPPOTrainer._save_checkpoint (folder global_step_N under
        # trainer.default_local_dir; writes latest_checkpointed_iteration.txt last)
        result = super()._save_checkpoint()
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        mark_checkpoint_complete(folder, self.global_steps)
        return result


# ---------------------------------------------------------------------------------------------------------- metrics


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


def keep_metrics_up_to(metrics_path: str | Path, last_step: int) -> int:
    """Drop the records of steps after ``last_step`` (they will be logged again); returns how many were dropped.

    Lines that are not complete JSON records (a write cut by a kill) are dropped too. Written atomically.
    """
    metrics_path = Path(metrics_path)
    if not metrics_path.is_file():
        return 0
    kept, dropped = [], 0
    for line in metrics_path.read_text().splitlines():
        try:
            record = json.loads(line)
            step = int(record["step"])
        except (ValueError, KeyError, TypeError):
            dropped += bool(line.strip())
            continue
        if step <= last_step:
            kept.append(line)
        else:
            dropped += 1
    if dropped:
        temporary = metrics_path.with_name(metrics_path.name + ".tmp")
        temporary.write_text("".join(line + "\n" for line in kept))
        os.replace(temporary, metrics_path)
    return dropped


# ------------------------------------------------------------------------------------------------------ entry point


@dataclass
class RunFolder:
    """What :func:`prepare_run_folder` decided, and the locks it holds until :meth:`close`."""

    checkpoint_dir: Path
    resume_step: int
    metrics_path: Path | None
    locks: list[RunLock] = field(default_factory=list)

    def close(self) -> None:
        for lock in reversed(self.locks):
            lock.release()
        self.locks.clear()

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def prepare_run_folder(config: Any) -> RunFolder:
    """Lock the run's folders, resolve the resume step and trim the metrics history (driver, before Ray).

    Args:
        config: the composed run config (``trainer.default_local_dir``, ``trainer.resume_mode``,
            ``trainer.resume_from_path``, ``trainer.logger``).

    Raises:
        RunFolderInUseError: another live run holds a lock.
        ResumeError: checkpoints exist but none is complete (``resume_mode=auto``).
    """
    trainer = config.trainer
    checkpoint_dir = Path(os.path.expanduser(str(trainer.default_local_dir))).resolve()
    metrics_path = file_logger_path(config)
    locks = [RunLock(checkpoint_dir / LOCK_FILE, f"trainer.default_local_dir={checkpoint_dir}")]
    if metrics_path is not None:
        locks.append(RunLock(metrics_path.with_name(metrics_path.name + ".lock"), f"metrics file {metrics_path}"))
    held: list[RunLock] = []
    try:
        for lock in locks:
            held.append(lock.acquire())
        mode = trainer.get("resume_mode", "auto")
        if mode == "auto":
            resume_step = resolve_resume_step(checkpoint_dir)
        elif mode == "resume_path":
            match = re.search(r"global_step_(\d+)", str(trainer.get("resume_from_path") or ""))
            resume_step = int(match.group(1)) if match else 0
        else:
            resume_step = 0
        if metrics_path is not None:
            keep_metrics_up_to(metrics_path, resume_step)
    except BaseException:
        for lock in reversed(held):
            lock.release()
        raise
    return RunFolder(checkpoint_dir, resume_step, metrics_path, held)


class Terminated(SystemExit):
    """Raised in the driver's main thread when it receives SIGTERM, so that its clean-up (``finally``) runs."""


def _raise_terminated(signum, frame):
    raise Terminated(128 + signum)


def exit_on_sigterm() -> None:
    """Make SIGTERM raise :class:`Terminated` (exit status 143) in this process, and SIGINT raise KeyboardInterrupt.

    Python's default action, and the failure handler Ray's core worker installs during ``ray.init`` (it prints a
    stack and aborts, status -6), both end the driver without running ``finally`` blocks: ``ray.shutdown()`` and the
    lock release never ran. Call it from the main thread, again after ``ray.init`` (see :class:`RearmSigterm`).

    A process that starts with SIGINT ignored keeps it ignored (Python installs its KeyboardInterrupt handler only
    over the default action): a background job of a non-interactive shell (``nohup python -m ... &`` in a script,
    ``make test &``) does, and its children inherit that. Such a driver would train on through ``kill -INT``, so an
    ignored SIGINT is given back Python's handler (:func:`signal.default_int_handler`); a handler someone installed
    is kept.
    """
    signal.signal(signal.SIGTERM, _raise_terminated)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


class RearmSigterm:
    """Wraps the Ray actor class given to verl's ``run_ppo`` to call :func:`exit_on_sigterm` once Ray is up.

    ``run_ppo`` calls ``ray.init`` and then, in the same main thread, ``task_runner_class.remote()`` (or
    ``.options(...).remote()``): the first moment after Ray installed its own SIGTERM handler.
    """

    # SYNC WARNING: verl/trainer/main_ppo.py:run_ppo (0.9.1 l.57-92, 0.7.1 l.59-98, ray.init then
    # task_runner_class[.options].remote())
    def __init__(self, actor_class):
        self._actor_class = actor_class

    def remote(self, *args, **kwargs):
        exit_on_sigterm()
        return self._actor_class.remote(*args, **kwargs)

    def options(self, *args, **kwargs):
        exit_on_sigterm()
        return self._actor_class.options(*args, **kwargs)


def shutdown_ray() -> None:
    """``ray.shutdown()`` that a second SIGINT or SIGTERM cannot cut short (it would leave Ray's processes)."""
    import ray

    if not ray.is_initialized():
        return
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        ray.shutdown()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
