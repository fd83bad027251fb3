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

One scenario, shared by the assertions (each run costs about a minute):

1. run A trains with a checkpoint every step; once step 1 is logged, a second run on the same folder is started
   (it must stop at start-up, naming A), then A gets SIGTERM;
2. run B resumes the same folder and metrics file; once it logged its first new step, it gets SIGINT.

After each signal, every process A or B had started (Ray's included) must be gone.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from treetune_recipe.cpo import ENTRY_MODULE
from treetune_verl.run_folder import COMPLETE_MARKER, LOCK_FILE
from treetune_verl.tiny_assets import build_tiny_assets
from treetune_verl.tiny_run import METRICS_FILE, tiny_run_overrides

STEPS = 200  # far more than both runs reach (a step takes ~2 s on CPU): each is stopped by its signal
STEP_TIMEOUT_S = 480
EXIT_GRACE_S = 60
#: Each run starts its own Ray instance: a plain ray.init() would join another job's cluster on the machine.
OWN_RAY_ENV = {**os.environ, "RAY_ADDRESS": "local"}


def command(assets_dir: Path, run_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        ENTRY_MODULE,
        "platform=cpu",
        *tiny_run_overrides(assets_dir, run_dir, total_training_steps=STEPS, experiment_name="e2e_interrupted"),
        "actor_rollout_ref.rollout.n=4",
        "trainer.save_freq=1",
        "trainer.resume_mode=auto",
        f"hydra.run.dir={run_dir / 'hydra'}",
    ]


def logged_steps(metrics_path: Path) -> list[int]:
    if not metrics_path.exists():
        return []
    return [json.loads(line)["step"] for line in metrics_path.read_text().splitlines() if line.strip()]


def run_until_step_then_signal(cmd, run_dir: Path, log_path: Path, step: int, signum: int, while_running=None):
    """Start a run, wait until the metrics file reaches ``step`` (a later step counts too, so a skipped step fails the
    history checks at once instead of a wait for the time-out), call ``while_running``, send ``signum``.

    Returns:
        (exit status, processes of the run still alive ``EXIT_GRACE_S`` after the driver exited, while_running's
        result).
    """
    with open(log_path, "w") as log:
        driver = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=run_dir, env=OWN_RAY_ENV)
    metrics_path = run_dir / METRICS_FILE
    deadline = time.monotonic() + STEP_TIMEOUT_S
    try:
        while max(logged_steps(metrics_path), default=0) < step:
            assert driver.poll() is None, f"run ended early ({driver.returncode}):\n{log_path.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"step {step} not reached:\n{log_path.read_text()[-4000:]}"
            time.sleep(1)
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
    cmd = command(assets_dir, run_dir)

    def second_run(driver):
        return driver.pid, subprocess.run(
            cmd, capture_output=True, text=True, timeout=180, cwd=run_dir, env=OWN_RAY_ENV
        )

    a_status, a_survivors, (a_pid, second) = run_until_step_then_signal(
        cmd, run_dir, run_dir / "a.log", 1, signal.SIGTERM, while_running=second_run
    )
    after_a = logged_steps(run_dir / METRICS_FILE)
    metrics_a = (run_dir / METRICS_FILE).read_text()
    b_status, b_survivors, _ = run_until_step_then_signal(
        cmd, run_dir, run_dir / "b.log", after_a[-1] + 1, signal.SIGINT
    )
    return {
        "run_dir": run_dir,
        "a_pid": a_pid,
        "second": second,
        "a_status": a_status,
        "a_survivors": a_survivors,
        "after_a": after_a,
        "metrics_a": metrics_a,
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
    assert after_a == list(range(1, len(after_a) + 1))  # every completed step of the killed run A
    # and its console lines. The last step's may be missing: Ray forwards the trainer's output to the driver
    # asynchronously, and the signal can stop the driver before that line arrives (it is in the metrics file).
    a_log = (run_dir / "a.log").read_text()
    assert [step for step in after_a[:-1] if f"step:{step} -" not in a_log] == []
    final = logged_steps(run_dir / METRICS_FILE)
    assert final == list(range(1, len(final) + 1)) and len(final) > len(after_a)  # continued, none duplicated
    # A's records are still there, unchanged, ahead of B's.
    assert (run_dir / METRICS_FILE).read_text().startswith(interrupted_runs["metrics_a"])
    b_log = (run_dir / "b.log").read_text()
    assert f"global_step_{after_a[-1]}" in b_log  # B loaded A's last checkpoint


@pytest.mark.e2e
@pytest.mark.timeout(3 * STEP_TIMEOUT_S)
def test_row2_every_finished_save_is_marked_complete(interrupted_runs):
    checkpoints = interrupted_runs["run_dir"] / "checkpoints"
    last = interrupted_runs["after_a"][-1]
    assert (checkpoints / f"global_step_{last}" / COMPLETE_MARKER).is_file()
    assert (checkpoints / f"global_step_{last}" / "data.pt").exists()  # dataloader state: no sample replayed
