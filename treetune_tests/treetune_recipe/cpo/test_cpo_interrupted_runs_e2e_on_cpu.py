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
"""End to end on CPU: runs that are interrupted, resumed and contended, with real Ray and the CPO recipe.

One scenario, shared by the assertions (each run costs about a minute). Both kills land at exact moments: each run
pauses at a pause point (``treetune_verl.fault_points``) and the test signals it there, so nothing depends on timing.

1. run A trains with a checkpoint every step and pauses the moment step 2's checkpoint is marked complete, before
   step 2's metrics line (the window that once lost a step for good). A second run on the same folder is started
   there (it must stop at start-up, naming A), then A gets SIGTERM;
2. run B resumes the same folder and metrics file. It must not resume from step 2's checkpoint, whose step has no
   record, but from step 1's, and train step 2 again; it pauses in the middle of step 3 (before the actor update)
   and gets SIGINT.

After each signal, every process A or B had started (Ray's included) must be gone. The kill sweep
(``treetune_scripts/kill_sweep.py``) kills at many more moments; this module keeps CI to its two runs.
"""

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from treetune_recipe.cpo.cpu_run import cpo_cpu_command
from treetune_verl.fault_points import pause_overrides
from treetune_verl.metrics_history import training_steps
from treetune_verl.run_folder import COMPLETE_MARKER, LOCK_FILE
from treetune_verl.tiny_assets import build_tiny_assets
from treetune_verl.tiny_run import METRICS_FILE

STEPS = 200  # far more than both runs reach (a step takes ~2 s on CPU): each is stopped by its signal
STEP_TIMEOUT_S = 480
EXIT_GRACE_S = 60
#: Each run starts its own Ray instance: a plain ray.init() would join another job's cluster on the machine.
OWN_RAY_ENV = {**os.environ, "RAY_ADDRESS": "local", "PYTHONUNBUFFERED": "1"}


def command(assets_dir: Path, run_dir: Path, pause_at: tuple[str, int]) -> list[str]:
    overrides = [
        "actor_rollout_ref.rollout.n=4",
        "trainer.save_freq=1",
        "trainer.resume_mode=auto",
        *pause_overrides(*pause_at, run_dir / f"paused_at_{pause_at[0]}_{pause_at[1]}.json"),
    ]
    return cpo_cpu_command(
        assets_dir, run_dir, total_training_steps=STEPS, experiment_name="e2e_interrupted", overrides=overrides
    )


def run_until_paused_then_signal(cmd, run_dir: Path, log_path: Path, signum: int, while_running=None):
    """Start a run, wait until it pauses at the pause point its command names, call ``while_running``, send
    ``signum`` to the driver.

    Returns:
        (exit status, processes of the run still alive ``EXIT_GRACE_S`` after the driver exited, while_running's
        result).
    """
    with open(log_path, "w") as log:
        driver = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=run_dir, env=OWN_RAY_ENV)
    pause_file = Path(next(arg for arg in cmd if "TREETUNE_PAUSE_FILE=" in arg).split("=", 1)[1])
    deadline = time.monotonic() + STEP_TIMEOUT_S
    try:
        while not pause_file.exists():
            assert driver.poll() is None, f"run ended early ({driver.returncode}):\n{log_path.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"{pause_file.name} not reached:\n{log_path.read_text()[-4000:]}"
            time.sleep(0.5)
        extra = while_running(driver) if while_running else None
        tree = psutil.Process(driver.pid).children(recursive=True)
        driver.send_signal(signum)
        status = driver.wait(timeout=EXIT_GRACE_S * 2)
    finally:
        if driver.poll() is None:
            for process in psutil.Process(driver.pid).children(recursive=True):
                process.kill()
            driver.kill()
    gone, alive = psutil.wait_procs(tree, timeout=EXIT_GRACE_S)
    survivors = []
    for process in alive:
        try:
            survivors.append(" ".join(process.cmdline())[:160])
            process.kill()
        except psutil.NoSuchProcess:
            pass
    return status, survivors, extra


@pytest.fixture(scope="module")
def interrupted_runs(tmp_path_factory):
    assets_dir = build_tiny_assets()
    run_dir = tmp_path_factory.mktemp("interrupted")
    cmd_a = command(assets_dir, run_dir, ("checkpoint_complete", 2))

    def second_run(driver):
        return driver.pid, subprocess.run(
            cmd_a, capture_output=True, text=True, timeout=180, cwd=run_dir, env=OWN_RAY_ENV
        )

    a_status, a_survivors, (a_pid, second) = run_until_paused_then_signal(
        cmd_a, run_dir, run_dir / "a.log", signal.SIGTERM, while_running=second_run
    )
    after_a = training_steps(run_dir / METRICS_FILE)
    metrics_a = (run_dir / METRICS_FILE).read_text()
    marked_after_a = (run_dir / "checkpoints" / "global_step_2" / COMPLETE_MARKER).is_file()
    b_status, b_survivors, _ = run_until_paused_then_signal(
        command(assets_dir, run_dir, ("update", 3)), run_dir, run_dir / "b.log", signal.SIGINT
    )
    return {
        "run_dir": run_dir,
        "a_pid": a_pid,
        "second": second,
        "a_status": a_status,
        "a_survivors": a_survivors,
        "after_a": after_a,
        "metrics_a": metrics_a,
        "marked_after_a": marked_after_a,
        "b_status": b_status,
        "b_survivors": b_survivors,
    }


@pytest.mark.e2e
@pytest.mark.timeout(3 * STEP_TIMEOUT_S)
def test_row1_a_second_run_on_the_same_folder_stops_at_start_up_naming_the_first(interrupted_runs):
    second = interrupted_runs["second"]
    output = second.stdout + second.stderr
    assert second.returncode != 0
    assert f"is in use by another run (pid {interrupted_runs['a_pid']} on host" in output
    assert "Started a local Ray instance" not in output  # stopped before Ray


@pytest.mark.e2e
@pytest.mark.timeout(3 * STEP_TIMEOUT_S)
def test_row12_sigterm_and_sigint_leave_no_process_of_the_run_behind(interrupted_runs):
    # Exited through Python (finally blocks ran), not by the signal's default action or Ray's abort (-6); Ray turns
    # the exception raised inside ray.get into SystemExit(1).
    assert interrupted_runs["a_status"] > 0
    assert interrupted_runs["a_survivors"] == []
    assert interrupted_runs["b_status"] != 0
    assert interrupted_runs["b_survivors"] == []
    run_dir = interrupted_runs["run_dir"]
    assert (run_dir / "checkpoints" / LOCK_FILE).read_text() == ""  # both released their lock


@pytest.mark.e2e
@pytest.mark.timeout(3 * STEP_TIMEOUT_S)
def test_row3_resume_keeps_the_metrics_history_and_the_killed_runs_log(interrupted_runs):
    run_dir, after_a = interrupted_runs["run_dir"], interrupted_runs["after_a"]
    # A was killed with step 2 saved and marked complete, but not logged: the window that lost step 2 for good.
    assert after_a == [1] and interrupted_runs["marked_after_a"]
    a_log = (run_dir / "a.log").read_text()
    assert "step:1 -" in a_log  # and its console line
    # B trained step 2 again from step 1's checkpoint and logged it once; it was killed inside step 3.
    assert training_steps(run_dir / METRICS_FILE) == [1, 2]
    # A's records are still there, unchanged, ahead of B's.
    assert (run_dir / METRICS_FILE).read_text().startswith(interrupted_runs["metrics_a"])
    b_log = (run_dir / "b.log").read_text()
    assert "holds no training record of step 2" in b_log and "resumes from global_step_1" in b_log
    assert f"resuming from {run_dir / 'checkpoints' / 'global_step_1'}" in b_log


@pytest.mark.e2e
@pytest.mark.timeout(3 * STEP_TIMEOUT_S)
def test_row2_every_finished_save_is_marked_complete(interrupted_runs):
    checkpoints = interrupted_runs["run_dir"] / "checkpoints"
    for step in (1, 2):  # step 1 saved by A; step 2 saved again by B, with its record
        assert (checkpoints / f"global_step_{step}" / COMPLETE_MARKER).is_file()
        assert (checkpoints / f"global_step_{step}" / "data.pt").exists()  # dataloader state: no sample replayed
    assert not (checkpoints / "global_step_3").exists()  # B was killed before step 3's save


@pytest.mark.e2e
@pytest.mark.timeout(STEP_TIMEOUT_S)
def test_row4_a_damaged_checkpoint_stops_the_resume_with_one_line_naming_the_file(interrupted_runs, tmp_path):
    # A copy of the folder the two runs left, with the newest checkpoint's model shard cut short.
    run_dir = tmp_path / "damaged"
    shutil.copytree(interrupted_runs["run_dir"], run_dir, ignore=shutil.ignore_patterns("*.lock", "hydra"))
    shard = next((run_dir / "checkpoints" / "global_step_2" / "actor").glob("model_world_size_*.pt"))
    shard.write_bytes(shard.read_bytes()[:1000])
    before = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    stop = subprocess.run(
        command(build_tiny_assets(), run_dir, ("update", 3)),
        capture_output=True, text=True, timeout=STEP_TIMEOUT_S, cwd=run_dir, env=OWN_RAY_ENV,
    )  # fmt: skip
    assert stop.returncode != 0
    last_line = stop.stderr.strip().splitlines()[-1]
    assert last_line.startswith(f"[cpo] checkpoint file {shard} has 1000 bytes"), stop.stderr[-2000:]
    assert "Restore the file, or move" in last_line and "Traceback" not in stop.stderr
    assert "Started a local Ray instance" not in stop.stdout + stop.stderr  # stopped before Ray
    # Nothing overwritten, nothing added but Hydra's record of the start and the lock files.
    after = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    assert {path: data for path, data in after.items() if "hydra" not in path.parts and path.suffix != ".lock"} == (
        {path: data for path, data in before.items() if path.suffix != ".lock"}
    )
