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

A run of 12 steps on 8 of the tiny assets' prompts (4 per step, so every second step ends an epoch and many resumes
land on an epoch boundary), with a checkpoint every step and validation every other step, is killed 24 times:
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
   metrics it logged, validation included, within the trainer's fp32 numerics (:data:`WEIGHTS_TOLERANCE`,
   :data:`METRICS_TOLERANCE`; the max absolute differences are printed);
4. every step trained on the straight run's prompts, in its order, and sampled its responses (verl's rollout dump,
   ``trainer.rollout_data_dir``: a step trained again after a kill writes its file again);
5. the token-credit dumps of steps 2 and 4 (``cpo.credit_dump``) are one whole file each, of their step;
6. for a method whose teacher moves (``refreshed``, ``ema``), the teacher weights of the last checkpoint equal the
   straight run's (:data:`WEIGHTS_TOLERANCE`). With ``--control``, a second chain resumes as the recipe did before the
   teacher was checkpointed (``cpo.teacher_checkpoint=false``: the teacher restarts from the resumed actor), and must
   fail this check.

``--methods`` sweeps methods by their experiment names instead of the recipe's default method, each with
:data:`TEACHER_PLAN` (10 kills, three of them right after the teacher moved: a refresh, or an EMA step);
``--methods teachers`` is one method per teacher kind, :data:`TEACHER_METHODS`.

Usage::

    python -m treetune_scripts.kill_sweep [--out outputs/kill_sweep] [--steps 12] [--seed 0]    # or: make kill-sweep
    python -m treetune_scripts.kill_sweep --methods teachers --control    # make kill-sweep ARGS="--methods ..."

It prints the table and writes ``<out>/kill_sweep.md``; the default is 26 starts of the trainer (about 20 minutes on 2
cores), ``--methods teachers --control`` 42.
"""

from __future__ import annotations

import argparse
import itertools
import json
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
import yaml

from treetune_recipe.cpo.experiments.cpo_vs_grpo import method_overrides, parse_methods, run_name
from treetune_recipe.cpo.teacher.weights import TEACHER_DIR
from treetune_recipe.cpo.trainer.cpu_run import cpo_cpu_command
from treetune_verl.clean_exit import kill_processes
from treetune_verl.fault_points import pause_overrides
from treetune_verl.metrics_history import read_metrics, training_steps
from treetune_verl.run_folder import checkpoint_steps, is_complete_checkpoint
from treetune_verl.run_outputs import max_difference, rollout_rows, shard_tensors
from treetune_verl.tiny_assets import build_tiny_assets
from treetune_verl.tiny_run import METRICS_FILE

START_TIMEOUT_S = 600
EXIT_TIMEOUT_S = 120
SIGNALS = {"TERM": signal.SIGTERM, "INT": signal.SIGINT, "KILL": signal.SIGKILL}
#: Steps whose token-credit dump (``cpo.credit_dump``) is written; each must end as one whole file, the straight run's.
CREDIT_DUMP_STEPS = (2, 4)
TEST_FREQ = 2
#: Prompts the run trains on, 4 per step (the CPU profile's ``data.train_batch_size``): an epoch every second step.
PROMPTS = 8
#: Folder of a run's rollout dump: ``<step>.jsonl``, one row per response (verl's ``trainer.rollout_data_dir``).
ROLLOUTS = "rollouts"
#: How far a resumed run may be from the straight one. Since each row draws its response from its own seed, the sweeps
#: measured 0 (bitwise) on the weights and the metrics; before, 1.2e-7 on the weights and 1.9e-5 on the advantages.
#: The tiny model moves little per step: a teacher that restarts from the resumed actor (``--control``) is 3.9e-6
#: away in RLSD's teacher and actor weights, so the weights tolerance sits between the two. One response sampled
#: differently moves the mean score by 2/32 (rewards +-1, 8 prompts x 4 responses), far above the metrics tolerance.
WEIGHTS_TOLERANCE, METRICS_TOLERANCE = 1e-6, 1e-3
COMPARED_PREFIXES = ("critic/", "response_length/", "val-core/", "actor/pg_loss", "actor/grad_norm", "cpo/")


@dataclass(frozen=True)
class Kill:
    """One kill. ``how`` is

    * ``after:<seconds>``: that long after the start (start-up);
    * ``pause:<point>@<when>``: at a pause point (``treetune_verl.fault_points.POINTS``) of a step given relative to
      the resume point R of this start: ``+1`` (the first step it trains), ``+2`` (the one after: step R + 1 is then
      logged, and the run moves on), ``test`` (the first step after R with a validation), or ``resume`` (only for
      ``validation``: the validation before training, logged under R);
    * ``random@+<k>``: a random moment within step R + k (0-1.5 s after step R + k - 1 is logged, or after training
      started for k = 1).
    """

    how: str
    signal: str


#: 24 kills: every moment, each with more than one signal; the ``+2`` ones move the run on by a step.
PLAN = [
    Kill("after:3", "TERM"),  # Hydra composing, before Ray
    Kill("after:25", "KILL"),  # Ray up, workers starting
    Kill("pause:validation@resume", "INT"),  # the first validation, before any step
    Kill("pause:update@+1", "TERM"),  # mid-step: rollout, rewards, advantages done
    Kill("pause:checkpoint_saved@+1", "KILL"),  # inside the save: verl's files written, not marked
    Kill("pause:checkpoint_complete@+1", "TERM"),  # between the save and the metrics line
    Kill("pause:metrics_record@+1", "KILL"),  # the step's record about to be written
    Kill("pause:checkpoint_complete@+2", "KILL"),
    Kill("pause:validation@test", "TERM"),  # the step's validation, after its save, before its line
    Kill("pause:metrics_record@+1", "INT"),
    Kill("random@+2", "KILL"),
    Kill("pause:checkpoint_saved@+1", "TERM"),
    Kill("pause:validation@resume", "KILL"),  # a resumed run's validation before training, under its resume step
    Kill("pause:update@+2", "KILL"),
    Kill("random@+1", "KILL"),
    Kill("pause:validation@test", "KILL"),
    Kill("pause:checkpoint_complete@+2", "INT"),
    Kill("random@+1", "TERM"),
    Kill("pause:metrics_record@+2", "KILL"),
    Kill("pause:checkpoint_saved@+1", "INT"),
    Kill("after:30", "TERM"),
    Kill("random@+2", "KILL"),
    Kill("pause:checkpoint_complete@+1", "KILL"),
    Kill("pause:validation@test", "TERM"),
]
#: The full sweep of the teachers that a run moves or reloads, one method each: ``refreshed`` (RLSD's published teacher,
#: refreshed every 2 updates instead of 20 so that refreshes fall within the run), ``ema`` (SDPO's) and ``initial``.
TEACHER_METHODS = "cpo:rlsd@teacher_refresh_steps=2,cpo:sdpo,cpo:seq_kl@teacher=initial"
#: 10 kills for a method with a moving teacher: three right after the teacher moved (a refresh, or an EMA step), the
#: others at the write boundaries and at random; the first one makes the next start resume from step 2. A teacher that
#: never moves gets ``update@+1`` for those three.
TEACHER_PLAN = [
    Kill("pause:update@+3", "KILL"),
    Kill("pause:teacher_update@next", "KILL"),
    Kill("pause:checkpoint_complete@+1", "TERM"),
    Kill("pause:metrics_record@+2", "KILL"),
    Kill("pause:teacher_update@next", "TERM"),
    Kill("pause:checkpoint_saved@+1", "KILL"),
    Kill("random@+2", "KILL"),
    Kill("pause:validation@test", "TERM"),
    Kill("pause:teacher_update@next", "INT"),
    Kill("pause:checkpoint_complete@+2", "KILL"),
]
#: The control chain's kills (``--control``): resumes from steps 3 and 5, each after a refresh (every 2 updates) and
#: an EMA step, where a teacher that restarts from the resumed actor differs from the uninterrupted run's.
CONTROL_PLAN = [Kill("pause:update@+4", "KILL"), Kill("pause:update@+3", "TERM")]


def teacher_of(method: str | None):
    """The resolved teacher of an experiment method name (None for the recipe's default method)."""
    if method is None:
        return None
    from treetune_recipe.cpo.config import CPOConfig

    wrapper, *settings = method.removeprefix("cpo:").split("@")
    fields = {"method": wrapper}
    for setting in settings:
        key, value = setting.split("=", 1)
        fields[key] = yaml.safe_load(value)
    return CPOConfig.from_config(fields).teacher_config


def plan_for(method: str | None, teacher) -> list[Kill]:
    """:data:`PLAN` for the default method; :data:`TEACHER_PLAN` otherwise, its teacher kills replaced by
    ``update@+1`` when the teacher never moves."""
    if method is None:
        return PLAN
    if teacher.changes_weights:
        return TEACHER_PLAN
    return [Kill("pause:update@+1", kill.signal) if "@next" in kill.how else kill for kill in TEACHER_PLAN]


def next_teacher_change(teacher, after: int) -> int:
    """The first step after ``after`` at which a moving teacher changes its weights."""
    if teacher.name == "ema":
        return after + 1
    return next(step for step in itertools.count(after + 1) if teacher.refresh_due(step))


def run_command(assets: Path, run_dir: Path, steps: int, seed: int, extra: list[str]) -> list[str]:
    overrides = [
        "actor_rollout_ref.rollout.n=4",
        "trainer.save_freq=1",
        f"trainer.test_freq={TEST_FREQ}",
        "trainer.val_before_train=true",  # so a resumed run writes its validation-only record (and can be killed in it)
        f"cpo.credit_dump.steps=[{','.join(str(step) for step in CREDIT_DUMP_STEPS)}]",
        "trainer.resume_mode=auto",
        f"data.seed={seed}",
        f"data.train_max_samples={PROMPTS}",
        f"trainer.total_epochs={steps}",
        f"trainer.rollout_data_dir={run_dir.resolve() / ROLLOUTS}",
        *extra,
    ]
    return cpo_cpu_command(
        assets, run_dir, total_training_steps=steps, experiment_name="kill_sweep", overrides=overrides
    )


def _logged_and_marked(run_dir: Path) -> tuple[list[int], list[int], dict[int, Path]]:
    """The steps with a training record, the checkpoints marked complete, and every checkpoint folder."""
    folders = checkpoint_steps(run_dir / "checkpoints")
    marked = sorted(step for step, folder in folders.items() if is_complete_checkpoint(folder))
    return training_steps(run_dir / METRICS_FILE), marked, folders


def state(run_dir: Path) -> str:
    """Steps logged and checkpoints marked complete, e.g. ``logged 1-3, marked 1-4``."""
    logged, marked, folders = _logged_and_marked(run_dir)
    unmarked = sorted(set(folders) - set(marked))

    def span(values):
        return "-" if not values else (f"{values[0]}-{values[-1]}" if len(values) > 1 else str(values[0]))

    return f"logged {span(logged)}, marked {span(marked)}" + (f", unmarked {span(unmarked)}" if unmarked else "")


def resume_point(run_dir: Path) -> int:
    """The step a start will resume from: the newest checkpoint marked complete whose step is logged (0: none); the
    rule of ``treetune_verl.run_folder.resolve_resume_step``, read without its repairs."""
    logged, marked, _ = _logged_and_marked(run_dir)
    return max(set(marked) & set(logged), default=0)


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
    kill_processes(tree, wait_s=30)
    return driver.wait() if status is None else status


def resume_of(log_text: str) -> str:
    """What a start did with the folder, from its log."""
    match = re.search(r"\[run_folder\] resuming from \S*global_step_(\d+)", log_text)
    resumed = f"resumed from step {match.group(1)}" if match else "fresh start"
    unmarked = re.findall(r"holds no training record of step (\d+)", log_text)
    boundary = re.search(r"\[run_folder\] step \d+ ends epoch (\d+)", log_text)
    return (
        resumed
        + (f" (step {', '.join(unmarked)} saved but not logged: unmarked, trained again)" if unmarked else "")
        + (f", at the end of epoch {boundary.group(1)}" if boundary else "")
    )


def launch(cmd: list[str], log_path: Path) -> subprocess.Popen:
    env = {**os.environ, "RAY_ADDRESS": "local"}
    with open(log_path, "w") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def one_kill(
    kill: Kill, cmd: list[str], run_dir: Path, steps: int, log_path: Path, rng: random.Random, teacher=None
) -> tuple[str, str]:
    """Start, wait for the kill's moment, signal the group; returns (where it landed, state at the kill)."""
    pause_file = run_dir / "paused.json"
    pause_file.unlink(missing_ok=True)
    resume = resume_point(run_dir)
    extra = []
    if kill.how.startswith("pause:"):
        point, when = kill.how.removeprefix("pause:").split("@")
        if when == "resume":
            step = resume
        elif when == "test":
            step = resume + TEST_FREQ - resume % TEST_FREQ
        elif when == "next":
            step = next_teacher_change(teacher, resume)
        else:
            step = resume + int(when)
        if step > steps:
            return f"not started: step {step} is beyond the run's {steps}", state(run_dir)
        extra = pause_overrides(point, step, pause_file)
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
            paused = json.loads(pause_file.read_text())
            landed = f"paused at {paused['point']} of step {paused['step']}"
            break
        if kill.how.startswith("after:") and time.monotonic() - started >= float(kill.how.removeprefix("after:")):
            text = log_path.read_text(errors="replace")
            landed = "start-up, Ray up" if "Started a local Ray instance" in text else "start-up, before Ray"
            break
        if kill.how.startswith("random@+"):
            step = resume + int(kill.how.removeprefix("random@+"))
            started_training = "Training Progress" in log_path.read_text(errors="replace")
            if started_training and (step == resume + 1 or step - 1 in training_steps(run_dir / METRICS_FILE)):
                delay = rng.uniform(0.0, 1.5)
                time.sleep(delay)
                landed = f"random, {delay:.2f} s after step {step - 1} was logged (or training began)"
                break
        time.sleep(0.05)
    tree = psutil.Process(driver.pid).children(recursive=True)
    at_kill = state(run_dir)
    os.killpg(driver.pid, SIGNALS[kill.signal])
    end_group(driver, tree)
    after = state(run_dir)  # SIGTERM and SIGINT let the trainer run on while Ray shuts down (seconds)
    return landed, at_kill + ("" if after == at_kill else f"; after the exit: {after}")


def compare_weights(a: Path, b: Path) -> float:
    """Max absolute difference between the actor's model tensors of two checkpoint folders."""
    return max_difference(shard_tensors(a / "actor"), shard_tensors(b / "actor"))


def compare_teacher_weights(a: Path, b: Path) -> float:
    """Max absolute difference between the teacher weights of two checkpoint folders (inf when either has none)."""
    return max_difference(shard_tensors(a / TEACHER_DIR), shard_tensors(b / TEACHER_DIR))


def compare_metrics(a: Path, b: Path) -> tuple[float, int]:
    """Max absolute difference over the :data:`COMPARED_PREFIXES` metrics of the steps both files log, and how many
    values were compared."""
    left, right = read_metrics(a), read_metrics(b)
    diffs = [
        abs(float(left[step][key]) - float(right[step][key]))
        for step in left.keys() & right.keys()
        for key in left[step].keys() & right[step].keys()
        if key.startswith(COMPARED_PREFIXES) and isinstance(left[step][key], int | float)
    ]
    return max(diffs, default=float("inf")), len(diffs)


def compare_rollouts(a: Path, b: Path, steps: int) -> tuple[list[int], list[int], int]:
    """The steps whose prompts (in row order) differ between two runs, those whose responses differ, and how many
    rows were compared."""
    prompts_differ, responses_differ, rows = [], [], 0
    for step in range(1, steps + 1):
        left, right = rollout_rows(a / ROLLOUTS, step), rollout_rows(b / ROLLOUTS, step)
        rows += len(left)
        if not left or [prompt for prompt, _ in left] != [prompt for prompt, _ in right]:
            prompts_differ.append(step)
        elif left != right:
            responses_differ.append(step)
    return prompts_differ, responses_differ, rows


def check_credit_dumps(run_dir: Path) -> str:
    """'' when the run holds exactly one whole dump per listed step, for that step; else what is wrong.

    Its content is not compared with the straight run's: the dump picks its rows among prompt groups whose ids verl
    draws at random (``uuid4``), so two runs, killed or not, show different rows of the same batch.
    """
    folder = run_dir / "checkpoints" / "credit_dump"
    names = sorted(path.name for path in folder.glob("*"))
    if names != sorted(f"step_{step}.json" for step in CREDIT_DUMP_STEPS):
        return f"{run_dir.name} holds {names}"
    for step in CREDIT_DUMP_STEPS:
        try:
            dumped = json.loads((folder / f"step_{step}.json").read_text())["step"]
        except (ValueError, KeyError) as error:
            return f"step_{step}.json does not parse ({error})"
        if dumped != step:
            return f"step_{step}.json holds step {dumped}"
    return ""


def chain_of_kills(
    cmd: list[str], chain: Path, plan: list[Kill], steps: int, logs: Path, rng: random.Random, teacher
) -> tuple[list[list[str]], list[str], int]:
    """Kill a run at each moment of ``plan``, start it again after each kill, then let it finish.

    Returns:
        The table's rows, the starts that trained from scratch over a complete checkpoint, the last start's status.
    """
    rows, starts = [], []
    for index, kill in enumerate(plan, start=1):
        log_path = logs / f"{chain.name}_kill_{index:02d}.log"
        had_checkpoint = resume_point(chain) > 0
        landed, at_kill = one_kill(kill, cmd, chain, steps, log_path, rng, teacher)
        starts.append((had_checkpoint, log_path))
        if landed.startswith(("run ended by itself", "not started")):
            sys.exit(f"[kill_sweep] kill {index} ({kill.how}) never came: {landed}; see {log_path}")
        rows.append([str(index), f"SIG{kill.signal}", kill.how, landed, at_kill])
        print(f"[kill_sweep] {chain.parent.name}/{chain.name} {' | '.join(rows[-1])}", flush=True)
    final_log = logs / f"{chain.name}_final.log"
    had_checkpoint = resume_point(chain) > 0
    driver = launch(cmd, final_log)
    final_status = driver.wait(timeout=START_TIMEOUT_S * 2)
    starts.append((had_checkpoint, final_log))
    # Each start's resume decision belongs to the row of the kill before it.
    resumes = [resume_of(log.read_text(errors="replace")) for _, log in starts]
    for row, resume in zip(rows, resumes[1:], strict=False):
        row.append(resume)
    scratch = [log.name for had, log in starts if had and "resuming from" not in log.read_text(errors="replace")]
    return rows, scratch, final_status


def sweep_method(method: str | None, args, assets: Path, out: Path, rng: random.Random) -> tuple[list[str], bool]:
    """The straight run, the chain of kills and, with ``--control`` and a moving teacher, the control chain of one
    method. Returns its report lines and whether every check passed."""
    extra = method_overrides(method) if method else []
    teacher = teacher_of(method)
    plan = plan_for(method, teacher)[: args.kills or None]
    logs = out / "logs"
    logs.mkdir(parents=True)
    started = time.monotonic()
    straight = out / "straight"
    straight.mkdir()
    print(f"[kill_sweep] {method or 'the recipe default'}: straight run of {args.steps} steps -> {straight}")
    launch(run_command(assets, straight, args.steps, args.seed, extra), logs / "straight.log").wait()
    if training_steps(straight / METRICS_FILE) != list(range(1, args.steps + 1)):
        sys.exit(f"[kill_sweep] the straight run failed; see {logs / 'straight.log'}")

    chain = out / "chain"
    chain.mkdir()
    cmd = run_command(assets, chain, args.steps, args.seed, extra)
    rows, scratch, final_status = chain_of_kills(cmd, chain, plan, args.steps, logs, rng, teacher)

    logged = training_steps(chain / METRICS_FILE)
    last = f"global_step_{args.steps}"
    weights_diff = compare_weights(straight / "checkpoints" / last, chain / "checkpoints" / last)
    metrics_diff, compared = compare_metrics(straight / METRICS_FILE, chain / METRICS_FILE)
    dumps = check_credit_dumps(chain)
    prompts_differ, responses_differ, rollout_rows_compared = compare_rollouts(straight, chain, args.steps)
    checks = [
        (f"every step logged exactly once: {logged}", logged == list(range(1, args.steps + 1))),
        (f"no start trained from scratch over a complete checkpoint ({scratch or 'none'})", not scratch),
        (f"final run exited 0 ({final_status})", final_status == 0),
        (f"{last} weights vs the straight run: max |diff| {weights_diff:.3g}", weights_diff <= WEIGHTS_TOLERANCE),
        (
            f"per-step metrics vs the straight run ({compared} values): max |diff| {metrics_diff:.3g}",
            metrics_diff <= METRICS_TOLERANCE,
        ),
        (
            f"every step's prompts in the straight run's order ({rollout_rows_compared} rows; steps that differ: "
            f"{prompts_differ or 'none'})",
            not prompts_differ,
        ),
        (
            f"every step's responses as the straight run's (steps that differ: {responses_differ or 'none'})",
            not responses_differ,
        ),
        (f"credit dumps of steps {CREDIT_DUMP_STEPS}: one whole file each ({dumps or 'yes'})", not dumps),
    ]
    moves = teacher is not None and teacher.changes_weights
    if moves:
        teacher_diff = compare_teacher_weights(straight / "checkpoints" / last, chain / "checkpoints" / last)
        checks.append(
            (
                f"{last} {teacher.name} teacher weights vs the straight run's: max |diff| {teacher_diff:.3g}",
                teacher_diff <= WEIGHTS_TOLERANCE,
            )
        )
    control_rows = []
    if args.control and moves:
        control = out / "control"
        control.mkdir()
        control_cmd = run_command(assets, control, args.steps, args.seed, [*extra, "cpo.teacher_checkpoint=false"])
        control_rows, _, control_status = chain_of_kills(
            control_cmd, control, CONTROL_PLAN, args.steps, logs, rng, teacher
        )
        control_diff = compare_teacher_weights(straight / "checkpoints" / last, control / "checkpoints" / last)
        checks.append(
            (
                f"control, today's resume (cpo.teacher_checkpoint=false, {len(CONTROL_PLAN)} kills, exit "
                f"{control_status}) fails the teacher check: max |diff| {control_diff:.3g}",
                control_diff > WEIGHTS_TOLERANCE,
            )
        )
    header = ["#", "signal", "moment", "where it landed", "state at the kill", "what the next start did"]
    teacher_text = f"{teacher.name} teacher" if teacher else "the recipe's default method"
    lines = [
        f"## {method or 'default'} ({teacher_text}): {len(rows)} kills, {args.steps} steps, seed {args.seed}, "
        f"{(time.monotonic() - started) / 60:.1f} min",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
        *(f"- {'PASS' if ok else 'FAIL'}: {text}" for text, ok in checks),
    ]
    if control_rows:
        lines += ["", "Control chain:", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in control_rows]
    return lines, all(ok for _, ok in checks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/kill_sweep"))
    parser.add_argument(
        "--steps", type=int, default=12, help="training steps (the plan moves the run on by about 8 of them)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--methods",
        default="",
        help="comma-separated methods, as the experiment names them (e.g. cpo:sdpo); empty: the recipe's default "
        f"method with the full plan. --methods teachers: {TEACHER_METHODS}",
    )
    parser.add_argument("--kills", type=int, default=0, help="the first N kills of each plan (0: all)")
    parser.add_argument(
        "--control",
        action="store_true",
        help="for a moving teacher, also run today's resume (cpo.teacher_checkpoint=false), which must fail the "
        "teacher check",
    )
    args = parser.parse_args(argv)
    methods = parse_methods(TEACHER_METHODS if args.methods == "teachers" else args.methods) if args.methods else [None]
    out = args.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    assets = build_tiny_assets()
    rng = random.Random(args.seed)
    sweep_start = time.monotonic()
    report, all_ok = [], True
    for method in methods:
        folder = out / run_name(method, args.seed) if method else out
        lines, ok = sweep_method(method, args, assets, folder, rng)
        report += [*lines, ""]
        all_ok &= ok
    lines = [f"# Kill sweep: {len(methods)} method(s), {(time.monotonic() - sweep_start) / 60:.1f} min", "", *report]
    (out / "kill_sweep.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
