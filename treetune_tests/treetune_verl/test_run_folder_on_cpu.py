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
"""``treetune_verl.run_folder``: run locks across processes, complete checkpoints, resume fallback, metrics
history (no Ray; subprocesses stand in for runs and are killed for real). SIGTERM and SIGINT as a clean exit:
``test_clean_exit_on_cpu.py``."""

import errno
import json
import os
import shutil
import signal
import socket
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from treetune_tests.support.child_process import start_python
from treetune_verl import run_folder
from treetune_verl.checkpoint_saves import CheckpointSaveError, CompleteCheckpointsMixin
from treetune_verl.metrics_history import keep_metrics_up_to
from treetune_verl.run_folder import (
    COMPLETE_MARKER,
    LOCK_FILE,
    TRACKER_FILE,
    OutputNotWritableError,
    ResumeError,
    RunFolderInUseError,
    RunLock,
    prepare_run_folder,
    resolve_resume_step,
)

HOLD_LOCK = """
    import sys, time
    from treetune_verl.run_folder import RunLock
    lock = RunLock(sys.argv[1], "test folder").acquire()
    print("ready", flush=True)
    time.sleep(600)
"""


def test_row1_second_run_stops_naming_the_holder_and_a_killed_holder_is_taken_over(tmp_path):
    lock_path = tmp_path / "ckpt" / LOCK_FILE
    holder = start_python(HOLD_LOCK, str(lock_path))
    try:
        with pytest.raises(RunFolderInUseError) as error:
            RunLock(lock_path, "trainer.default_local_dir=X").acquire()
        message = str(error.value)
        assert f"pid {holder.pid} on host {socket.gethostname()}, started 20" in message
        assert "trainer.default_local_dir" in message and "Wait for it to finish" in message
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with pytest.warns(UserWarning, match=f"taking over the lock of a run that is gone \\(pid {holder.pid}"):
        lock = RunLock(lock_path, "trainer.default_local_dir=X").acquire()
    assert json.loads(lock_path.read_text())["pid"] == os.getpid()
    lock.release()
    assert lock_path.read_text() == ""  # a clean end leaves nothing to take over
    with RunLock(lock_path, "again"):
        pass


def make_checkpoint(folder: Path, step: int, complete: bool = True) -> Path:
    step_folder = folder / f"global_step_{step}"
    (step_folder / "actor").mkdir(parents=True)
    if complete:
        run_folder.mark_checkpoint_complete(step_folder, step)
    return step_folder


def test_row2_pointer_to_a_missing_checkpoint_falls_back_to_the_newest_complete_one(tmp_path):
    for step in (1, 2, 3):
        make_checkpoint(tmp_path, step)
    (tmp_path / TRACKER_FILE).write_text("4")
    with pytest.warns(UserWarning, match="points to step 4.*global_step_3"):
        assert resolve_resume_step(tmp_path) == 3
    assert (tmp_path / TRACKER_FILE).read_text() == "3"  # verl now loads global_step_3, not scratch
    assert resolve_resume_step(tmp_path) == 3  # and the pointer is sound again: no warning needed


def test_row2_pointer_to_an_incomplete_checkpoint_falls_back(tmp_path):
    make_checkpoint(tmp_path, 1)
    make_checkpoint(tmp_path, 2, complete=False)
    (tmp_path / TRACKER_FILE).write_text("2")
    with pytest.warns(UserWarning, match="global_step_1"):
        assert resolve_resume_step(tmp_path) == 1


def test_row2_checkpoints_without_any_complete_one_stop_instead_of_training_from_scratch(tmp_path):
    make_checkpoint(tmp_path, 1, complete=False)
    (tmp_path / TRACKER_FILE).write_text("1")
    with pytest.raises(ResumeError) as error:
        resolve_resume_step(tmp_path)
    assert "global_step_1" in str(error.value) and "trainer.resume_mode=disable" in str(error.value)
    assert resolve_resume_step(tmp_path / "fresh") == 0


SAVE_AND_DIE = """
    import os, sys, time
    from pathlib import Path
    from omegaconf import OmegaConf
    from treetune_verl.checkpoint_saves import CompleteCheckpointsMixin

    folder, step, pause_at = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

    class UpstreamLikeTrainer:  # the order of RayPPOTrainer._save_checkpoint: actor state, data.pt, pointer
        def _save_checkpoint(self):
            step_folder = folder / f"global_step_{self.global_steps}"
            (step_folder / "actor").mkdir(parents=True)
            (step_folder / "actor" / "model.pt").write_bytes(b"half")
            if pause_at == "actor":
                print("ready", flush=True); time.sleep(600)
            (step_folder / "data.pt").write_bytes(b"data")
            (folder / "latest_checkpointed_iteration.txt").write_text(str(self.global_steps))
            if pause_at == "pointer":
                print("ready", flush=True); time.sleep(600)

    class Trainer(CompleteCheckpointsMixin, UpstreamLikeTrainer):
        config = OmegaConf.create({"trainer": {"default_local_dir": str(folder)}})
        global_steps = step

    Trainer()._save_checkpoint()
    print("ready", flush=True)
"""


@pytest.mark.parametrize("pause_at", ["actor", "pointer"])
def test_row2_a_save_killed_half_way_is_never_resumed_from(tmp_path, pause_at):
    saver = start_python(SAVE_AND_DIE, str(tmp_path), "1", "none")  # a complete save of step 1
    saver.wait()
    assert (tmp_path / "global_step_1" / COMPLETE_MARKER).is_file()
    saver = start_python(SAVE_AND_DIE, str(tmp_path), "2", pause_at)
    saver.send_signal(signal.SIGKILL)
    saver.wait()
    assert not (tmp_path / "global_step_2" / COMPLETE_MARKER).exists()
    if pause_at == "pointer":  # verl's pointer already names the unfinished step 2
        with pytest.warns(UserWarning, match="global_step_1"):
            assert resolve_resume_step(tmp_path) == 1
    else:
        assert resolve_resume_step(tmp_path) == 1
    assert (tmp_path / TRACKER_FILE).read_text() == "1"


def test_row3_metrics_after_the_resume_step_and_cut_lines_are_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": step, "data": {"x": step}}) for step in (1, 2, 3, 4)]
    path.write_text("\n".join(lines) + '\n{"step": 5, "da')
    assert keep_metrics_up_to(path, 2) == 3
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]


def test_row3_file_logger_appends(tmp_path, monkeypatch):
    import verl.utils.tracking as tracking

    from treetune_verl.patches import append_file_logger

    # The patch replaces a module global: restored after the test, or every later test in this process (the other
    # files of this xdist worker) would see the patched logger.
    monkeypatch.setattr(tracking, "FileLogger", tracking.FileLogger)
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "data": {"x": 1.0}}) + "\n")
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    append_file_logger()
    tracker = tracking.Tracking(project_name="p", experiment_name="e", default_backend=["file"])
    tracker.log(data={"x": 2.0}, step=2)
    tracker.logger["file"].finish()
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]


def run_config(tmp_path: Path, resume_mode: str = "auto"):
    return OmegaConf.create(
        {
            "trainer": {
                "default_local_dir": str(tmp_path / "ckpt"),
                "resume_mode": resume_mode,
                "resume_from_path": None,
                "logger": ["console", "file"],
                "project_name": "p",
                "experiment_name": "e",
            },
            "ray_kwargs": {
                "ray_init": {"runtime_env": {"env_vars": {"VERL_FILE_LOGGER_PATH": str(tmp_path / "m.jsonl")}}}
            },
        }
    )


def training_record(step: int) -> str:
    """A metrics line as verl's fit() logs a training step (its data always holds ``training/global_step``)."""
    return json.dumps({"step": step, "data": {"training/global_step": step, "actor/pg_loss": 0.1 * step}}) + "\n"


def validation_record(step: int) -> str:
    """The validation-only line verl logs before training: under step 0, or under the resume step of a resumed run."""
    return json.dumps({"step": step, "data": {"val-core/acc": 0.5}}) + "\n"


def test_prepare_run_folder_locks_both_paths_and_trims_to_the_resume_step(tmp_path):
    make_checkpoint(tmp_path / "ckpt", 2)
    (tmp_path / "ckpt" / TRACKER_FILE).write_text("2")
    (tmp_path / "m.jsonl").write_text("".join(training_record(s) for s in (1, 2, 3)))
    with prepare_run_folder(run_config(tmp_path)) as folder:
        assert folder.resume_step == 2 and folder.metrics_path == tmp_path / "m.jsonl"
        assert [json.loads(line)["step"] for line in (tmp_path / "m.jsonl").read_text().splitlines()] == [1, 2]
        with pytest.raises(RunFolderInUseError, match="trainer.default_local_dir"):
            prepare_run_folder(run_config(tmp_path))
        other = run_config(tmp_path)
        other.trainer.default_local_dir = str(tmp_path / "other")
        with pytest.raises(RunFolderInUseError, match="metrics file"):  # same metrics file, other folder
            prepare_run_folder(other)
    with prepare_run_folder(run_config(tmp_path, resume_mode="disable")) as folder:
        assert folder.resume_step == 0 and (tmp_path / "m.jsonl").read_text() == ""  # a fresh run starts a fresh file


# -------------------------------------------------------------- a checkpoint is complete only with its step's record


def test_row2_a_complete_checkpoint_one_step_ahead_of_the_metrics_file_is_not_resumed_from(tmp_path):
    # Killed between step 2's save (marked complete) and step 2's metrics line: fit() saves, validates, then logs.
    for step in (1, 2):
        make_checkpoint(tmp_path / "ckpt", step)
    (tmp_path / "ckpt" / TRACKER_FILE).write_text("2")
    metrics = tmp_path / "m.jsonl"
    metrics.write_text(validation_record(0) + training_record(1))
    with pytest.warns(UserWarning, match="global_step_2 .*no training record of step 2.*global_step_1"):
        with prepare_run_folder(run_config(tmp_path)) as folder:
            assert folder.resume_step == 1  # step 2 is trained again, and logged once
    assert (tmp_path / "ckpt" / TRACKER_FILE).read_text() == "1"
    assert not (tmp_path / "ckpt" / "global_step_2" / COMPLETE_MARKER).exists()  # never taken for complete again
    assert (tmp_path / "ckpt" / "global_step_2" / "actor").is_dir()  # nothing of verl's deleted
    assert metrics.read_text() == validation_record(0) + training_record(1)


def test_row2_a_resumes_validation_record_does_not_count_as_the_steps_record(tmp_path):
    # The new user's case: killed after step 2's save; a resume from it logged only its validation under step 2, and
    # was killed again. The file holds a record "of step 2", but no training record of step 2.
    for step in (1, 2):
        make_checkpoint(tmp_path / "ckpt", step)
    metrics = tmp_path / "m.jsonl"
    metrics.write_text(validation_record(0) + training_record(1) + validation_record(2))
    with pytest.warns(UserWarning, match="no training record of step 2"):
        with prepare_run_folder(run_config(tmp_path)) as folder:
            assert folder.resume_step == 1
    assert metrics.read_text() == validation_record(0) + training_record(1)


def test_row2_the_first_steps_checkpoint_without_its_record_starts_the_run_again_at_step_1(tmp_path):
    make_checkpoint(tmp_path / "ckpt", 1)
    (tmp_path / "ckpt" / TRACKER_FILE).write_text("1")
    (tmp_path / "m.jsonl").write_text(validation_record(0))
    with pytest.warns(UserWarning, match="no training record of step 1.*resumes from global_step_0"):
        with prepare_run_folder(run_config(tmp_path)) as folder:
            assert folder.resume_step == 0
    assert not (tmp_path / "ckpt" / "global_step_1" / COMPLETE_MARKER).exists()
    assert not (tmp_path / "ckpt" / TRACKER_FILE).exists()  # verl starts at step 1
    assert (tmp_path / "m.jsonl").read_text() == validation_record(0)
    shutil.rmtree(tmp_path / "ckpt")  # the same with an unfinished save of step 1 (no marker)
    make_checkpoint(tmp_path / "ckpt", 1, complete=False)
    with pytest.warns(UserWarning, match="unfinished save of step 1"):
        assert resolve_resume_step(tmp_path / "ckpt", tmp_path / "m.jsonl") == 0
    make_checkpoint(tmp_path / "ckpt", 2)  # but not when a later folder exists, nor without the metrics file
    with pytest.raises(ResumeError):
        resolve_resume_step(tmp_path / "ckpt", tmp_path / "m.jsonl")
    shutil.rmtree(tmp_path / "ckpt" / "global_step_2")
    with pytest.raises(ResumeError):
        resolve_resume_step(tmp_path / "ckpt", tmp_path / "missing.jsonl")


def test_row2_with_no_checkpoint_behind_the_metrics_the_resume_stops_instead_of_losing_a_step(tmp_path):
    # max_actor_ckpt_to_keep=1 deleted step 1's checkpoint when step 2 was saved; step 2 was never logged.
    make_checkpoint(tmp_path / "ckpt", 2)
    (tmp_path / "m.jsonl").write_text(training_record(1))
    with pytest.raises(ResumeError, match="global_step_2.*no training record of step 2.*resume_path"):
        prepare_run_folder(run_config(tmp_path))
    assert (tmp_path / "ckpt" / "global_step_2" / COMPLETE_MARKER).is_file()  # refused, nothing changed


# ----------------------------------------------------------------------------------------------- damaged folders

SAVED_FILES = {
    "model shard": "actor/model_world_size_1_rank_0.pt",
    "optimizer state": "actor/optim_world_size_1_rank_0.pt",
    "data-loader state": "data.pt",
}


def make_saved_checkpoint(folder: Path, step: int) -> Path:
    """A checkpoint folder with verl's files (random bytes), marked complete and logged in ``folder/../m.jsonl``."""
    step_folder = folder / f"global_step_{step}"
    for index, name in enumerate(SAVED_FILES.values()):
        path = step_folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(4096 + index))
    run_folder.mark_checkpoint_complete(step_folder, step)
    with open(folder.parent / "m.jsonl", "a") as metrics:
        metrics.write(training_record(step))
    return step_folder


@pytest.mark.parametrize("damage", ["truncated", "corrupted", "missing"])
@pytest.mark.parametrize("kind", list(SAVED_FILES))
def test_row4_a_damaged_checkpoint_file_stops_the_resume_with_one_line_naming_it(tmp_path, kind, damage):
    make_saved_checkpoint(tmp_path / "ckpt", 1)
    step_folder = make_saved_checkpoint(tmp_path / "ckpt", 2)
    damaged = step_folder / SAVED_FILES[kind]
    content = damaged.read_bytes()
    if damage == "truncated":
        damaged.write_bytes(content[:1000])
    elif damage == "corrupted":  # same size, one byte flipped
        damaged.write_bytes(content[:2000] + bytes([content[2000] ^ 0xFF]) + content[2001:])
    else:
        damaged.unlink()
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    with pytest.raises(ResumeError) as error:
        prepare_run_folder(run_config(tmp_path))
    message = str(error.value)
    assert "\n" not in message and f"checkpoint file {damaged} " in message
    assert {"truncated": "truncated", "corrupted": "corrupted", "missing": "is missing"}[damage] in message
    assert f"move {step_folder} out of" in message  # the fix: the resume then takes global_step_1
    after = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file() and path.suffix != ".lock"}
    assert after == {path: data for path, data in before.items() if path.suffix != ".lock"}  # nothing overwritten
    shutil.move(step_folder, tmp_path / "damaged")
    with pytest.warns(UserWarning, match="no training record of step 2|global_step_1"):
        with prepare_run_folder(run_config(tmp_path)) as folder:
            assert folder.resume_step == 1


def test_row4_without_digests_a_truncated_file_is_still_found_and_a_same_size_change_is_not(tmp_path, monkeypatch):
    monkeypatch.setenv(run_folder.HASH_ENV, "0")
    step_folder = make_saved_checkpoint(tmp_path / "ckpt", 1)
    marker = json.loads((step_folder / COMPLETE_MARKER).read_text())
    assert all(set(entry) == {"bytes"} for entry in marker["files"].values())
    shard = step_folder / SAVED_FILES["model shard"]
    shard.write_bytes(bytes(len(shard.read_bytes())))  # same size, other bytes: not seen without the digest
    with prepare_run_folder(run_config(tmp_path)) as folder:
        assert folder.resume_step == 1
    shard.write_bytes(b"cut")
    with pytest.raises(ResumeError, match="truncated"):
        prepare_run_folder(run_config(tmp_path))


def test_row4_the_same_checkpoint_undamaged_is_resumed_from(tmp_path):
    make_saved_checkpoint(tmp_path / "ckpt", 1)
    make_saved_checkpoint(tmp_path / "ckpt", 2)
    (tmp_path / "ckpt" / TRACKER_FILE).write_text("2")
    with prepare_run_folder(run_config(tmp_path)) as folder:
        assert folder.resume_step == 2


def test_row4_an_output_folder_that_cannot_be_written_stops_with_one_line(tmp_path):
    (tmp_path / "a_file").write_text("not a folder")
    config = run_config(tmp_path)
    config.trainer.default_local_dir = str(tmp_path / "a_file" / "ckpt")
    with pytest.raises(OutputNotWritableError) as error:
        prepare_run_folder(config)
    message = str(error.value)
    assert "\n" not in message and f"trainer.default_local_dir={tmp_path / 'a_file' / 'ckpt'}" in message
    assert "Not a directory" in message and "Choose a folder this user can write" in message
    assert (tmp_path / "a_file").read_text() == "not a folder"


class DiskFullTrainer:
    """Stands in for RayPPOTrainer: its save writes verl's files, then runs out of disk at ``fail_at``."""

    def __init__(self, folder: Path, fail_at: str):
        self.config = OmegaConf.create({"trainer": {"default_local_dir": str(folder)}})
        self.global_steps = 3
        self.fail_at = fail_at

    def _save_checkpoint(self):
        shard = Path(self.config.trainer.default_local_dir) / "global_step_3" / "actor" / "model.pt"
        shard.parent.mkdir(parents=True)
        if self.fail_at == "shard":
            raise OSError(errno.ENOSPC, "No space left on device", str(shard))
        shard.write_bytes(b"weights")


class MarkedDiskFullTrainer(CompleteCheckpointsMixin, DiskFullTrainer):
    pass


@pytest.mark.parametrize("fail_at", ["shard", "marker"])
def test_row4_a_full_disk_during_a_save_stops_with_one_line_and_leaves_the_folder_unmarked(
    tmp_path, monkeypatch, fail_at
):
    trainer = MarkedDiskFullTrainer(tmp_path, fail_at)
    if fail_at == "marker":

        def no_space(*args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device", "marker")

        monkeypatch.setattr(run_folder.json, "dump", no_space)
    with pytest.raises(CheckpointSaveError) as error:
        trainer._save_checkpoint()
    message = str(error.value)
    assert "\n" not in message and f"no space left on the device while saving {tmp_path / 'global_step_3'}" in message
    assert "not marked complete" in message and "Free space" in message
    assert [path.name for path in (tmp_path / "global_step_3").iterdir()] == ["actor"]  # no marker, no temporary


def test_row4_other_save_errors_pass_through_unchanged(tmp_path):
    class Failing(CompleteCheckpointsMixin):
        config = OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path)}})
        global_steps = 1

        def _save_checkpoint(self):
            return super()._save_checkpoint()

    with pytest.raises(AttributeError):
        Failing()._save_checkpoint()


# ------------------------------------------------------------------------------------------------------ pause points

PAUSE_CHILD = """
    from treetune_verl.fault_points import pause_point
    pause_point("checkpoint_complete", 1)
    print("ready", flush=True)  # not the requested step: went on
    pause_point("checkpoint_complete", 2)
    print("went on", flush=True)
"""


def test_pause_point_pauses_only_at_its_point_and_step_until_killed(tmp_path):
    pause_file = tmp_path / "paused.json"
    env = {**os.environ, "TREETUNE_PAUSE_AT": "checkpoint_complete@2", "TREETUNE_PAUSE_FILE": str(pause_file)}
    child = start_python(PAUSE_CHILD, env=env)
    try:
        for _ in range(600):
            if pause_file.exists():
                break
            time.sleep(0.05)
        assert json.loads(pause_file.read_text()) == {"point": "checkpoint_complete", "step": 2, "pid": child.pid}
        assert child.poll() is None
    finally:
        child.kill()
    assert "went on" not in child.stdout.read()


def test_pause_point_refuses_an_unknown_point(monkeypatch):
    from treetune_verl.fault_points import pause_point

    monkeypatch.setenv("TREETUNE_PAUSE_AT", "checkpoint@2")
    with pytest.raises(ValueError, match="expected <point>@<step> with a point of update, checkpoint_saved"):
        pause_point("update", 2)
