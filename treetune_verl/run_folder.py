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
"""One run per output folder, resume that never silently restarts or loses a step, and metrics history kept across
resumes.

Every recipe calls :func:`prepare_run_folder` on the driver before Ray starts and keeps the returned
:class:`RunFolder` open for the run's lifetime (``with prepare_run_folder(config): run_ppo(...)``). It

1. **locks** ``trainer.default_local_dir`` and the metrics file of verl's ``file`` logger (:class:`RunLock`: an
   exclusive ``flock`` on a ``.lock`` file holding the holder's pid, host and start time). A second run stops naming
   the holder; the kernel drops the lock when the holder dies (SIGKILL included), and the next run takes it over with
   a warning. A folder that cannot be written stops the run here, naming it;
2. **resolves the resume point** (``trainer.resume_mode=auto``). A checkpoint is *complete* when everything its step
   produced is durable:

   * its ``global_step_N`` folder holds :data:`COMPLETE_MARKER`, written by the trainer's
     ``treetune_verl.checkpoint_saves.CompleteCheckpointsMixin`` after everything else of the save (verl's
     ``latest_checkpointed_iteration.txt`` included), listing every file of the folder with its size and SHA-256;
   * and, when the run logs to a metrics file, that file holds step N's *training* record
     (``treetune_verl.metrics_history``). verl's ``fit()`` saves step N, validates, and only then logs step N: a run
     killed in between leaves a marked folder with no record. That folder is not resumed from: its marker is removed
     (with a warning), the run resumes from the checkpoint before it (or from the start, when no step was logged yet)
     and trains step N again, so step N is logged exactly once. With logged steps but no checkpoint left behind step
     N (``max_actor_ckpt_to_keep=1``) the run stops instead.

   The checkpoint chosen is verified against its marker's list; a missing, truncated or changed file stops the run
   with one line naming it. When verl's pointer names another folder, it is moved to the chosen one with a warning;
   when checkpoints exist but none is complete, the run stops: it never trains from scratch over them;
3. **keeps the metrics history**: records of steps after the resume point (they will be recomputed) and lines cut by a
   kill are dropped from the metrics file, and the file logger appends and syncs each record
   (``treetune_verl.patches.append_file_logger``), so steps continue and none is duplicated.

The trainer's side, marking each save complete, is :mod:`treetune_verl.checkpoint_saves`; how the driver ends cleanly
(signals, Ray's processes) is :mod:`treetune_verl.clean_exit`.
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import json
import os
import re
import socket
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from treetune_verl.metrics_history import file_logger_path, keep_metrics_up_to, training_steps

#: Written last into ``global_step_N/`` by ``checkpoint_saves.CompleteCheckpointsMixin``: the checkpoint is complete.
COMPLETE_MARKER = "treetune_checkpoint_complete.json"
#: verl's pointer to the latest checkpoint, inside ``trainer.default_local_dir``.
# SYNC WARNING: verl/utils/checkpoint/checkpoint_manager.py:get_checkpoint_tracker_filename (file name)
TRACKER_FILE = "latest_checkpointed_iteration.txt"
#: Lock file of a run folder (inside it) and suffix of a metrics file's lock (next to it).
LOCK_FILE = ".treetune_run.lock"
#: ``0`` in the trainer's environment: checkpoint markers list file sizes without SHA-256 (a faster save and resume).
HASH_ENV = "TREETUNE_CHECKPOINT_SHA256"
_STEP_FOLDER = re.compile(r"global_step_(\d+)$")


class RunFolderError(RuntimeError):
    """A run folder problem that stops the run; its message is one line naming the path and the fix."""


class RunFolderInUseError(RunFolderError):
    """Another live run holds the lock of this output folder or metrics file."""


class OutputNotWritableError(RunFolderError):
    """The output folder or the metrics file's folder cannot be written."""


class ResumeError(RunFolderError):
    """No checkpoint can be resumed from as it is (none complete, or the chosen one damaged); training from scratch
    would overwrite them."""


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
        try:
            self.lock_path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(self.lock_path, "a+")
        except OSError as error:
            raise OutputNotWritableError(
                f"{self.what} cannot be written ({error.strerror}: {error.filename or self.lock_path}). Choose a "
                "folder this user can write, or fix its permissions."
            ) from None
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


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def checkpoint_manifest(step_folder: str | Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {"bytes", "sha256"}}`` of every file under ``step_folder`` but the marker.

    Hashing reads the checkpoint back once, on up to 8 threads (``hashlib`` releases the GIL; about 1.1 GB/s per core
    on the project's CI machine). ``TREETUNE_CHECKPOINT_SHA256=0`` in the trainer's environment records sizes only:
    a truncated file is still found at resume, a corrupted one of the same size is not.
    """
    step_folder = Path(step_folder)
    files = sorted(
        path for path in step_folder.rglob("*") if path.is_file() and not path.name.startswith(COMPLETE_MARKER)
    )
    manifest = {str(path.relative_to(step_folder)): {"bytes": path.stat().st_size} for path in files}
    if os.environ.get(HASH_ENV, "1") != "0":
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            for path, digest in zip(files, pool.map(_sha256, files), strict=True):
                manifest[str(path.relative_to(step_folder))]["sha256"] = digest
    return manifest


def mark_checkpoint_complete(step_folder: str | Path, step: int) -> None:
    """Write :data:`COMPLETE_MARKER` into ``step_folder`` atomically (temporary file, fsync, rename), listing every
    file of the folder with its size and SHA-256 (:func:`verify_checkpoint` checks them at resume)."""
    step_folder = Path(step_folder)
    marker = {
        "step": step,
        "saved": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "files": checkpoint_manifest(step_folder),
    }
    temporary = step_folder / (COMPLETE_MARKER + ".tmp")
    try:
        with open(temporary, "w") as handle:
            json.dump(marker, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, step_folder / COMPLETE_MARKER)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def verify_checkpoint(step_folder: str | Path) -> None:
    """Check every file the marker lists: present, same size, same SHA-256 (a marker without a list, written before
    lists existed, is trusted as it is).

    Raises:
        ResumeError: one line naming the first damaged file and the fix.
    """
    step_folder = Path(step_folder)
    marker = json.loads((step_folder / COMPLETE_MARKER).read_text())
    for name, expected in marker.get("files", {}).items():
        path = step_folder / name
        if not path.is_file():
            problem = "is missing"
        elif path.stat().st_size != expected["bytes"]:
            problem = f"has {path.stat().st_size} bytes, {expected['bytes']} when it was saved (truncated or cut)"
        elif "sha256" in expected and _sha256(path) != expected["sha256"]:
            problem = "differs from the file that was saved (its SHA-256 changed: corrupted)"
        else:
            continue
        raise ResumeError(
            f"checkpoint file {path} {problem}, so global_step_{marker['step']} cannot be resumed from. Restore the "
            f"file, or move {step_folder} out of {step_folder.parent} to resume from the checkpoint before it; "
            "nothing was changed."
        )


def _pointed_step(tracker: Path) -> int | None:
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    return int(text) if text.isdigit() else None


def resolve_resume_step(checkpoint_dir: str | Path, metrics_path: str | Path | None = None) -> int:
    """The step an ``auto`` resume will start from (0: fresh), repairing verl's pointer when it must.

    Args:
        checkpoint_dir: ``trainer.default_local_dir``.
        metrics_path: the run's metrics file, or None when it logs none: then a complete marker is enough.

    Raises:
        ResumeError: when ``global_step_N`` folders exist but none is complete (marked, and logged in the metrics
            file), or when the chosen one fails :func:`verify_checkpoint`.
    """
    checkpoint_dir = Path(checkpoint_dir)
    steps = checkpoint_steps(checkpoint_dir)
    tracker = checkpoint_dir / TRACKER_FILE
    pointed = _pointed_step(tracker)
    marked = sorted(step for step, folder in steps.items() if is_complete_checkpoint(folder))
    logged = set(training_steps(metrics_path)) if metrics_path is not None else set(marked)
    complete = [step for step in marked if step in logged]
    ahead = [step for step in marked if step > max(complete, default=0)]
    # Step 1's save, killed before step 1's line (marked or not): no step was logged, so starting at step 1 again
    # loses nothing. Any other folder without a logged step is a history this run cannot see: stop.
    first_step_killed = set(steps) == {1} and not logged and metrics_path is not None and Path(metrics_path).is_file()
    if ahead and not complete and not first_step_killed:
        newest = ahead[-1]
        raise ResumeError(
            f"{steps[newest]} was saved, but {metrics_path} holds no training record of step {newest} (the run was "
            f"killed before logging it) and no earlier complete checkpoint is left to train step {newest} again from. "
            "To resume from it anyway, without that step's metrics: trainer.resume_mode=resume_path "
            f"trainer.resume_from_path={steps[newest]}; to start over: trainer.resume_mode=disable."
        )
    resume = complete[-1] if complete else 0
    for step in ahead:
        warnings.warn(
            f"{steps[step]} was saved, but {metrics_path} holds no training record of step {step} (the run was killed "
            f"between the save and the step's metrics line): its complete marker is removed and the run resumes from "
            f"global_step_{resume}, training step {step} again so that it is logged once.",
            stacklevel=2,
        )
        (steps[step] / COMPLETE_MARKER).unlink()
    if resume:
        verify_checkpoint(steps[resume])
        if pointed != resume:
            if not ahead:
                problem = (
                    f"points to step {pointed}, whose checkpoint is missing or incomplete (a save that did not "
                    "finish, or a clean-up)"
                    if pointed is not None
                    else "is missing"
                )
                warnings.warn(
                    f"{tracker} {problem}; resuming from the newest complete checkpoint, global_step_{resume}.",
                    stacklevel=2,
                )
            tracker.write_text(str(resume))
        return resume
    if steps and not first_step_killed:
        listed = ", ".join(folder.name for _, folder in sorted(steps.items()))
        raise ResumeError(
            f"trainer.default_local_dir={checkpoint_dir} holds checkpoints ({listed}) but none is complete (no "
            f"{COMPLETE_MARKER}: their save did not finish, or they predate it). Training from scratch would "
            "overwrite them. Move them away or choose another trainer.default_local_dir; set "
            "trainer.resume_mode=disable to start over; or, if one is known to be good, resume from it with "
            "trainer.resume_mode=resume_path trainer.resume_from_path=<its folder>."
        )
    if first_step_killed and not ahead:
        warnings.warn(
            f"{steps[1]} is an unfinished save of step 1 and {metrics_path} holds no training step: the run starts at "
            "step 1 again.",
            stacklevel=2,
        )
    if pointed is not None:
        if not ahead and not first_step_killed:
            warnings.warn(
                f"{tracker} points to step {pointed}, but there is no complete checkpoint: training from the start.",
                stacklevel=2,
            )
        tracker.unlink()
    return 0


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
        OutputNotWritableError: the output folder or the metrics file's folder cannot be written.
        ResumeError: checkpoints exist but none is complete, or the chosen one is damaged (``resume_mode=auto``).
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
            resume_step = resolve_resume_step(checkpoint_dir, metrics_path)
        elif mode == "resume_path":
            match = re.search(r"global_step_(\d+)", str(trainer.get("resume_from_path") or ""))
            resume_step = int(match.group(1)) if match else 0
        else:
            resume_step = 0
        dropped = keep_metrics_up_to(metrics_path, resume_step) if metrics_path is not None else 0
        if resume_step:
            print(
                f"[run_folder] resuming from {checkpoint_dir / f'global_step_{resume_step}'}"
                + (f"; {dropped} metrics line(s) after step {resume_step} dropped" if dropped else ""),
                flush=True,
            )
    except BaseException:
        for lock in reversed(held):
            lock.release()
        raise
    return RunFolder(checkpoint_dir, resume_step, metrics_path, held)
