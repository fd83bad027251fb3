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
The runs train on 8 prompts, 4 per step (every second step ends an epoch), with an ``ema`` teacher (SDPO's), which the
checkpoints keep.

1. run A trains with a checkpoint every step and pauses the moment it is about to write step 3's metrics record, its
   checkpoint marked complete (the window that once lost a step for good). A second run on the same folder is started
   there (it must stop at start-up, naming A), then A gets SIGTERM;
2. run B resumes the same folder and metrics file. It must not resume from step 3's checkpoint, whose step has no
   record, but from step 2's, the end of the first epoch, and train step 3 again: the first step of the second epoch,
   on the prompts and with the responses A had there, with A's teacher. It pauses in the middle of step 4 (before the
   actor update) and gets SIGINT.

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
import torch

from treetune_recipe.cpo.teacher.weights import TEACHER_DIR
from treetune_recipe.cpo.trainer.cpu_run import cpo_cpu_command
from treetune_verl.fault_points import pause_overrides
from treetune_verl.metrics_history import training_steps
from treetune_verl.run_folder import COMPLETE_MARKER, LOCK_FILE
from treetune_verl.run_outputs import max_difference, rollout_rows, shard_tensors
from treetune_verl.tiny_assets import build_tiny_assets
from treetune_verl.tiny_run import METRICS_FILE

STEPS = 200  # far more than both runs reach (a step takes ~2 s on CPU): each is stopped by its signal
PROMPTS = 8  # two steps per epoch (data.train_batch_size 4 in the CPU profile)
#: Step A is killed in (saved, not logged), so the step B resumes from ends the first epoch.
KILLED_STEP = 3
STEP_TIMEOUT_S = 480
EXIT_GRACE_S = 60
#: Each run starts its own Ray instance: a plain ray.init() would join another job's cluster on the machine.
OWN_RAY_ENV = {**os.environ, "RAY_ADDRESS": "local", "PYTHONUNBUFFERED": "1"}


def command(assets_dir: Path, run_dir: Path, pause_at: tuple[str, int], rollouts: str = "rollouts") -> list[str]:
    overrides = [
        "actor_rollout_ref.rollout.n=4",
        "cpo.teacher=ema",  # a teacher that moves every step: B must resume it from step 2's checkpoint
        f"data.train_max_samples={PROMPTS}",
        "data.seed=0",  # the same 8 prompts at every start (the preflight refuses a random subset without a seed)
        f"trainer.total_epochs={STEPS}",
        "trainer.save_freq=1",
        "trainer.resume_mode=auto",
        f"trainer.rollout_data_dir={run_dir / rollouts}",  # each step's prompts and responses, row by row
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
    cmd_a = command(assets_dir, run_dir, ("metrics_record", KILLED_STEP), rollouts="rollouts_a")

    def second_run(driver):
        dump = run_dir / "rollouts_a" / f"{KILLED_STEP}.jsonl"  # written by a thread of A's before the pause
        deadline = time.monotonic() + 60
        while not dump.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        return driver.pid, subprocess.run(
            cmd_a, capture_output=True, text=True, timeout=180, cwd=run_dir, env=OWN_RAY_ENV
        )

    a_status, a_survivors, (a_pid, second) = run_until_paused_then_signal(
        cmd_a, run_dir, run_dir / "a.log", signal.SIGTERM, while_running=second_run
    )
    after_a = training_steps(run_dir / METRICS_FILE)
    metrics_a = (run_dir / METRICS_FILE).read_text()
    killed_step_folder = run_dir / "checkpoints" / f"global_step_{KILLED_STEP}"
    marked_after_a = (killed_step_folder / COMPLETE_MARKER).is_file()
    for part in ("actor", TEACHER_DIR):  # B saves over them
        shutil.copytree(killed_step_folder / part, run_dir / f"a_{part}_after_the_killed_step")
    b_status, b_survivors, _ = run_until_paused_then_signal(
        command(assets_dir, run_dir, ("update", KILLED_STEP + 1), rollouts="rollouts_b"),
        run_dir,
        run_dir / "b.log",
        signal.SIGINT,
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
    # A was killed with step 3 saved and marked complete, but not logged: the window that lost a step for good.
    assert after_a == [1, 2] and interrupted_runs["marked_after_a"]
    a_log = (run_dir / "a.log").read_text()
    assert "step:2 -" in a_log  # and its console line
    # B trained step 3 again from step 2's checkpoint and logged it once; it was killed inside step 4.
    assert training_steps(run_dir / METRICS_FILE) == [1, 2, 3]
    # A's records are still there, unchanged, ahead of B's.
    assert (run_dir / METRICS_FILE).read_text().startswith(interrupted_runs["metrics_a"])
    b_log = (run_dir / "b.log").read_text()
    assert "holds no training record of step 3" in b_log and "resumes from global_step_2" in b_log
    assert f"resuming from {run_dir / 'checkpoints' / 'global_step_2'}" in b_log


@pytest.mark.e2e
@pytest.mark.timeout(3 * STEP_TIMEOUT_S)
def test_row5_a_resume_at_an_epoch_boundary_trains_on_the_prompts_and_responses_of_the_run_it_resumes(
    interrupted_runs,
):
    run_dir = interrupted_runs["run_dir"]
    a_rows, b_rows = (
        rollout_rows(run_dir / "rollouts_a", KILLED_STEP),
        rollout_rows(run_dir / "rollouts_b", KILLED_STEP),
    )
    assert len(a_rows) == 4 * 4
    # B's step 3, the first of the second epoch, has A's prompts in A's order, and A's sampled responses.
    assert [prompt for prompt, _ in b_rows] == [prompt for prompt, _ in a_rows]
    assert b_rows == a_rows
    # Control: verl's own resume at this boundary shuffles the second epoch from data.seed again, so its step 3
    # would draw step 1's prompts; they are not step 3's.
    first_epoch_start = {prompt for prompt, _ in rollout_rows(run_dir / "rollouts_a", 1)}
    assert first_epoch_start != {prompt for prompt, _ in a_rows}
    assert "step 2 ends epoch 1: epoch 2 is shuffled as in an uninterrupted run" in (run_dir / "b.log").read_text()
    # B resumed the ema teacher of step 2 (not the resumed actor), so its update and its EMA step of step 3 gave A's
    # actor and teacher weights, within the trainer's fp32 noise.
    assert (
        "[cpo] resumed the ema teacher at step 2: updates averaged in through step 2" in (run_dir / "b.log").read_text()
    )
    killed_step = run_dir / "checkpoints" / f"global_step_{KILLED_STEP}"
    for part in ("actor", TEACHER_DIR):
        a_weights = shard_tensors(run_dir / f"a_{part}_after_the_killed_step")
        b_weights = shard_tensors(killed_step / part)
        assert a_weights.keys() == b_weights.keys() and a_weights, part
        for name, tensor in a_weights.items():
            torch.testing.assert_close(b_weights[name].float(), tensor.float(), rtol=0, atol=1e-6, msg=f"{part} {name}")
    # Control: the teacher moved, so a teacher restarted from the resumed actor would differ from it.
    a_actor_step_2 = shard_tensors(run_dir / "checkpoints" / "global_step_2" / "actor")
    a_teacher_step_2 = shard_tensors(run_dir / "checkpoints" / "global_step_2" / TEACHER_DIR)
    assert max(max_difference({n: a_teacher_step_2[n]}, {n: a_actor_step_2[n]}) for n in a_teacher_step_2) > 1e-6


@pytest.mark.e2e
@pytest.mark.timeout(3 * STEP_TIMEOUT_S)
def test_row2_every_finished_save_is_marked_complete(interrupted_runs):
    checkpoints = interrupted_runs["run_dir"] / "checkpoints"
    for step in (1, 2, 3):  # steps 1 and 2 saved by A; step 3 saved again by B, with its record
        assert (checkpoints / f"global_step_{step}" / COMPLETE_MARKER).is_file()
        assert (checkpoints / f"global_step_{step}" / "data.pt").exists()  # dataloader state: no sample replayed
    assert not (checkpoints / "global_step_4").exists()  # B was killed before step 4's save


@pytest.mark.e2e
@pytest.mark.timeout(STEP_TIMEOUT_S)
def test_row4_a_damaged_checkpoint_stops_the_resume_with_one_line_naming_the_file(interrupted_runs, tmp_path):
    # A copy of the folder the two runs left, with the newest checkpoint's model shard cut short.
    run_dir = tmp_path / "damaged"
    shutil.copytree(interrupted_runs["run_dir"], run_dir, ignore=shutil.ignore_patterns("*.lock", "hydra"))
    shard = next((run_dir / "checkpoints" / f"global_step_{KILLED_STEP}" / "actor").glob("model_world_size_*.pt"))
    shard.write_bytes(shard.read_bytes()[:1000])
    before = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    stop = subprocess.run(
        command(build_tiny_assets(), run_dir, ("update", KILLED_STEP + 1)),
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
