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
"""Kill sweep: kill a CPO run at many moments, resume it after each kill, and check that nothing was lost.

A run on the tiny assets with a checkpoint every step and validation every other step is killed again and again:
SIGTERM, SIGINT or SIGKILL sent to its whole process group (the driver, Ray and every worker), at

* start-up (before Ray, and with Ray up before the first step);
* the write boundaries of a step, reached exactly through pause points (``treetune_verl.fault_points``): before the
  actor update (mid-step), inside the checkpoint save (saved, not yet marked complete), between the save and the
  metrics line (marked complete), during validation (the in-step one, and the one a resumed run makes before
  training), and right before the metrics record is written;
* random moments within a step.

After each kill the same command is started again (``trainer.resume_mode=auto``); the table records where each kill
landed and what the next start resumed from. At the end it checks that

1. every training step is logged exactly once (``treetune_verl.metrics_history.training_steps``);
2. no start trained from scratch once a complete checkpoint existed;
3. the last checkpoint's model weights equal those of a straight run of the same steps, and so do the per-step
   metrics it logged (max absolute differences printed; the runs are seeded, so equal is expected on one machine).

Usage::

    python -m treetune_scripts.kill_sweep [--out outputs/kill_sweep] [--steps 6] [--seed 0]

It prints the table and writes ``<out>/kill_sweep.md``; about 25 starts of the trainer (30-40 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from treetune_recipe.cpo import ENTRY_MODULE
from treetune_verl.fault_points import pause_overrides
from treetune_verl.metrics_history import read_metrics, training_steps
from treetune_verl.run_folder import COMPLETE_MARKER, checkpoint_steps
from treetune_verl.tiny_assets import build_tiny_assets
from treetune_verl.tiny_run import METRICS_FILE, tiny_run_overrides

START_TIMEOUT_S = 600
EXIT_TIMEOUT_S = 120
SIGNALS = {"TERM": signal.SIGTERM, "INT": signal.SIGINT, "KILL": signal.SIGKILL}


@dataclass(frozen=True)
class Kill:
    """One kill: ``how`` is ``pause:<point>@<step>``, ``after:<seconds>`` (from the start) or ``random@<step>`` (a
    random moment after step ``step - 1`` is logged, within about one step's time)."""

    how: str
    signal: str


def default_plan(steps: int) -> list[Kill]:
    """24 kills over ``steps`` steps (at least 6): every moment above, each with more than one signal."""
    assert steps >= 6, "the plan needs at least 6 steps"
    return [
        Kill("after:3", "TERM"),  # Hydra composing, before Ray
        Kill("after:25", "KILL"),  # Ray up, workers starting
        Kill("pause:validation@0", "INT"),  # the first validation, before any step
        Kill("pause:update@1", "TERM"),
        Kill("pause:checkpoint_saved@1", "KILL"),
        Kill("pause:checkpoint_complete@1", "TERM"),
        Kill("pause:metrics_record@1", "KILL"),
        Kill("pause:checkpoint_complete@2", "KILL"),
        Kill("pause:validation@2", "TERM"),  # test_freq=2: validation after step 2's save, before its line
        Kill("pause:metrics_record@2", "INT"),
        Kill("random@3", "KILL"),
        Kill("pause:checkpoint_saved@3", "TERM"),
        Kill("pause:update@3", "KILL"),
        Kill("pause:validation@2", "KILL"),  # a resume from step 2 validates before training, under step 2
        Kill("random@4", "KILL"),
        Kill("pause:validation@4", "KILL"),
        Kill("pause:checkpoint_complete@4", "INT"),
        Kill("random@5", "TERM"),
        Kill("pause:metrics_record@5", "KILL"),
        Kill("pause:checkpoint_saved@5", "INT"),
        Kill("after:30", "TERM"),
        Kill("random@6", "KILL"),
        Kill("pause:checkpoint_complete@6", "KILL"),
        Kill("pause:validation@6", "TERM"),
    ]


def run_command(assets: Path, run_dir: Path, steps: int, seed: int, extra: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        ENTRY_MODULE,
        "platform=cpu",
        *tiny_run_overrides(assets, run_dir, total_training_steps=steps, experiment_name="kill_sweep"),
        "actor_rollout_ref.rollout.n=4",
        "trainer.save_freq=1",
        "trainer.test_freq=2",
        "trainer.val_before_train=true",  # so a resumed run writes its validation-only record (and can be killed in it)
        "trainer.resume_mode=auto",
        f"data.seed={seed}",
        f"hydra.run.dir={run_dir / 'hydra'}",
        *extra,
    ]


def state(run_dir: Path) -> str:
    """Steps logged and checkpoints marked complete, e.g. ``logged 1-3, marked 1-4``."""
    logged = training_steps(run_dir / METRICS_FILE)
    folders = checkpoint_steps(run_dir / "checkpoints")
    marked = sorted(step for step, folder in folders.items() if (folder / COMPLETE_MARKER).is_file())
    unmarked = sorted(set(folders) - set(marked))

    def span(values):
        return "-" if not values else (f"{values[0]}-{values[-1]}" if len(values) > 1 else str(values[0]))

    return f"logged {span(logged)}, marked {span(marked)}" + (f", unmarked {span(unmarked)}" if unmarked else "")


def has_complete_checkpoint(run_dir: Path) -> bool:
    """A checkpoint marked complete whose step is logged: a start after this must resume, never start over."""
    logged = set(training_steps(run_dir / METRICS_FILE))
    folders = checkpoint_steps(run_dir / "checkpoints")
    return any((folder / COMPLETE_MARKER).is_file() and step in logged for step, folder in folders.items())


def end_group(driver: subprocess.Popen, tree: list[psutil.Process]) -> int:
    """Wait for the driver; SIGKILL its group and every process it had started that is still alive."""
    try:
        status = driver.wait(timeout=EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        status = None
    try:
        os.killpg(driver.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for process in tree:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(tree, timeout=30)
    return driver.wait() if status is None else status


def resume_of(log_text: str) -> str:
    """What a start did with the folder, from its log."""
    match = re.search(r"\[run_folder\] resuming from \S*global_step_(\d+)", log_text)
    resumed = f"resumed from step {match.group(1)}" if match else "fresh start"
    unmarked = re.findall(r"holds no training record of step (\d+)", log_text)
    return resumed + (
        f" (step {', '.join(unmarked)} saved but not logged: unmarked, trained again)" if unmarked else ""
    )


def launch(cmd: list[str], log_path: Path) -> subprocess.Popen:
    env = {**os.environ, "RAY_ADDRESS": "local"}
    with open(log_path, "w") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def one_kill(kill: Kill, cmd: list[str], run_dir: Path, log_path: Path, rng: random.Random) -> tuple[str, str]:
    """Start, wait for the kill's moment, signal the group; returns (where it landed, state at the kill)."""
    pause_file = run_dir / "paused.json"
    pause_file.unlink(missing_ok=True)
    extra = []
    if kill.how.startswith("pause:"):
        point, step = kill.how.removeprefix("pause:").split("@")
        extra = pause_overrides(point, int(step), pause_file)
    driver = launch(cmd + extra, log_path)
    started = time.monotonic()
    landed = ""
    while True:
        if driver.poll() is not None:
            return f"run ended by itself ({driver.returncode}) before the kill", state(run_dir)
        if time.monotonic() - started > START_TIMEOUT_S:
            landed = "time-out waiting for the moment"
            break
        if kill.how.startswith("pause:") and pause_file.exists():
            landed = f"paused at {kill.how.removeprefix('pause:')}"
            break
        if kill.how.startswith("after:") and time.monotonic() - started >= float(kill.how.removeprefix("after:")):
            text = log_path.read_text(errors="replace")
            landed = "start-up, Ray up" if "Started a local Ray instance" in text else "start-up, before Ray"
            break
        if kill.how.startswith("random@"):
            step = int(kill.how.removeprefix("random@"))
            if step - 1 in [0, *training_steps(run_dir / METRICS_FILE)] and "Training Progress" in log_path.read_text(
                errors="replace"
            ):
                delay = rng.uniform(0.0, 4.0)
                time.sleep(delay)
                landed = f"random, {delay:.2f} s into step {step}"
                break
        time.sleep(0.2)
    tree = psutil.Process(driver.pid).children(recursive=True)
    at_kill = state(run_dir)
    os.killpg(driver.pid, SIGNALS[kill.signal])
    end_group(driver, tree)
    return landed, at_kill


def model_tensors(step_folder: Path) -> dict[str, object]:
    import torch

    tensors = {}
    for path in sorted((step_folder / "actor").glob("model*.pt")):
        for name, value in torch.load(path, map_location="cpu", weights_only=False).items():
            tensors[f"{path.name}:{name}"] = value.to_local() if hasattr(value, "to_local") else value
    return tensors


def compare_weights(a: Path, b: Path) -> float:
    """Max absolute difference between the model tensors of two checkpoint folders (inf when they differ in keys)."""
    left, right = model_tensors(a), model_tensors(b)
    if not left or left.keys() != right.keys():
        return float("inf")
    return max(float((left[k].float() - right[k].float()).abs().max()) for k in left)


def compare_metrics(a: Path, b: Path, keys=("critic/score/mean", "actor/pg_loss", "response_length/mean")) -> float:
    left, right = read_metrics(a), read_metrics(b)
    diffs = [abs(left[s][k] - right[s][k]) for s in left if s in right for k in keys if k in left[s] and k in right[s]]
    return max(diffs, default=float("inf"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/kill_sweep"))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = args.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    (out / "logs").mkdir(parents=True)
    assets = build_tiny_assets()
    rng = random.Random(args.seed)
    sweep_start = time.monotonic()

    straight = out / "straight"
    straight.mkdir()
    print(f"[kill_sweep] straight run of {args.steps} steps -> {straight}", flush=True)
    launch(run_command(assets, straight, args.steps, args.seed, []), out / "logs" / "straight.log").wait()
    if training_steps(straight / METRICS_FILE) != list(range(1, args.steps + 1)):
        sys.exit(f"[kill_sweep] the straight run failed; see {out / 'logs' / 'straight.log'}")

    chain = out / "chain"
    chain.mkdir()
    cmd = run_command(assets, chain, args.steps, args.seed, [])
    rows, starts = [], []
    for index, kill in enumerate(default_plan(args.steps), start=1):
        log_path = out / "logs" / f"kill_{index:02d}.log"
        had_checkpoint = has_complete_checkpoint(chain)
        landed, at_kill = one_kill(kill, cmd, chain, log_path, rng)
        starts.append((had_checkpoint, log_path))
        if landed.startswith("run ended by itself"):
            sys.exit(f"[kill_sweep] kill {index} ({kill.how}) never came: {landed}; see {log_path}")
        rows.append([str(index), f"SIG{kill.signal}", kill.how, landed, at_kill])
        print(f"[kill_sweep] {' | '.join(rows[-1])}", flush=True)
    final_log = out / "logs" / "final.log"
    had_checkpoint = has_complete_checkpoint(chain)
    driver = launch(cmd, final_log)
    final_status = driver.wait(timeout=START_TIMEOUT_S * 2)
    starts.append((had_checkpoint, final_log))
    # Each start's resume decision belongs to the row of the kill before it.
    resumes = [resume_of(log.read_text(errors="replace")) for _, log in starts]
    for row, resume in zip(rows, resumes[1:], strict=False):
        row.append(resume)
    scratch = [log.name for had, log in starts if had and "resuming from" not in log.read_text(errors="replace")]

    logged = training_steps(chain / METRICS_FILE)
    last = f"global_step_{args.steps}"
    weights_diff = compare_weights(straight / "checkpoints" / last, chain / "checkpoints" / last)
    metrics_diff = compare_metrics(straight / METRICS_FILE, chain / METRICS_FILE)
    checks = [
        (f"every step logged exactly once: {logged}", logged == list(range(1, args.steps + 1))),
        (f"no start trained from scratch over a complete checkpoint ({scratch or 'none'})", not scratch),
        (f"final run exited 0 ({final_status})", final_status == 0),
        (f"{last} weights vs the straight run: max |diff| {weights_diff:.3g}", weights_diff <= 1e-5),
        (f"per-step metrics vs the straight run: max |diff| {metrics_diff:.3g}", metrics_diff <= 1e-5),
    ]
    header = ["#", "signal", "moment", "where it landed", "state at the kill", "what the next start did"]
    lines = [
        f"# Kill sweep: {len(rows)} kills, {args.steps} steps, seed {args.seed}, "
        f"{(time.monotonic() - sweep_start) / 60:.1f} min",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
        *(f"- {'PASS' if ok else 'FAIL'}: {text}" for text, ok in checks),
    ]
    (out / "kill_sweep.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
