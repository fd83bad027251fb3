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
"""CPO vs matched GRPO on CPU: same warm start, same data order per seed, same hyperparameters except ``cpo.*``.

The experiment's library; its command line is ``python -m treetune_scripts.experiments.cpo_vs_grpo``. Each (method,
seed) is one real run of the recipe entry point (``python -m treetune_recipe.cpo.main_cpo platform=cpu``: Ray, verl's
trainer) with :func:`run_overrides`; GRPO is the same config with ``algorithm.adv_estimator=grpo``
(:func:`method_overrides`). Validation is verl's own (``trainer.val_before_train``, ``trainer.test_freq``) on the
held-out plain prompts, sampled as the rollout samples (:data:`HELD_OUT_OVERRIDES`). The first CPO run of the first
seed dumps its token credit (``cpo.credit_dump``).

:data:`REGIMES` holds what ``--regime`` chooses: ``hard`` is the same warm start, trained and validated on the
problems it fails (``hard_prompts.py``), so that most prompt groups are all wrong at the start and only a hint-guided
method gets a signal from them. :func:`result_rows` reads one run's ``results.csv`` rows from verl's metrics.
:func:`plan_experiment` checks a command line's choices into an :class:`Experiment`, :func:`run_experiment` runs it.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from treetune_recipe.cpo.experiments import hard_prompts, long_chain, summary
from treetune_recipe.cpo.experiments.console import condense
from treetune_recipe.cpo.experiments.task import (
    HINT_OVERRIDES,
    LONG_CHAIN_OVERRIDES,
    TASK_RL_OVERRIDES,
    override_value,
    val_acc_key,
)
from treetune_recipe.cpo.experiments.warm_start import (
    EXPERIMENT_WARM_START,
    LONG_CHAIN_DATA,
    WarmStartConfig,
    WarmStartGateError,
    build_warm_start,
    check_mixed_groups,
    describe_warm_start,
    read_build_info,
    warm_start_hash,
)
from treetune_recipe.cpo.trainer.cpu_run import launch_cpo_on_cpu
from treetune_verl.config_block import override_key
from treetune_verl.metrics_history import read_metrics
from treetune_verl.tiny_run import METRICS_FILE

DEFAULT_OUTPUT_DIR = Path("outputs/experiments/cpo_vs_grpo")
#: Responses sampled per held-out prompt at each validation.
VAL_SAMPLES = 8
_VAL_SAMPLES_KEY = "actor_rollout_ref.rollout.val_kwargs.n"
#: The held-out comparison's settings on top of the task's (the demo keeps the task's): 16 prompts per step, i.e. two
#: optimizer updates of 8 prompts each, and validation that samples as the rollout does (temperature 1,
#: :data:`VAL_SAMPLES` responses per prompt), so ``val_acc`` estimates pass@1 of the policy being trained on prompts it
#: never sees. Greedy accuracy, the mode of that policy, does not clearly rise in 40 steps at this scale in any setting
#: (agent-docs/running-code.md, "Tuning").
HELD_OUT_OVERRIDES = [
    "data.train_batch_size=16",
    "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
    f"{_VAL_SAMPLES_KEY}={VAL_SAMPLES}",
]
RESULT_COLUMNS = [
    "method", "seed", "step", "val_acc", "train_reward", "step_time_s", "cpo_adv_shift", "hint_logratio",
    "all_wrong_frac", "kl", "drift", "response_length", "entropy", "gw_minus_old", "context_token_frac",
    "rollout_kl", "rollout_probs_diff",
]  # fmt: skip
#: ``results.csv`` columns read from verl's metrics under a fixed name (``val_acc``'s name depends on the runs'
#: :func:`validation_samples`).
_METRIC_COLUMNS = {
    "train_reward": "critic/score/mean",
    "step_time_s": "timing_s/step",
    "cpo_adv_shift": "actor/cpo/adv_delta_absmean",
    "hint_logratio": "cpo/gw_minus_old_absmean",
    "all_wrong_frac": "cpo/group_all_wrong_frac",  # logged for GRPO too (RayCPOTrainer._group_outcome_metrics)
    "kl": "actor/kl_loss",  # verl's low_var_kl, clamped at 10 per token
    "drift": "treetune/drift/old_minus_ref_mean",  # unclamped: RayCPOTrainer's drift_from_reference_metrics
    "response_length": "response_length/mean",
    "entropy": "actor/entropy",
    "gw_minus_old": "cpo/gw_minus_old_mean",
    # Share of response tokens whose row has a teacher context (SDPO: a successful sibling; the others log 1 or nothing)
    "context_token_frac": "cpo/context_token_frac",
    # Rollout vs trainer on the same tokens (a run whose two disagree is broken, whatever its accuracy shows)
    "rollout_kl": "rollout_corr/kl",
    "rollout_probs_diff": "training/rollout_probs_diff_mean",
}


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Run length and the steps that validate / dump credit."""

    steps: int
    test_freq: int
    credit_steps: tuple[int, ...]


DEFAULT_SCHEDULE = Schedule(steps=40, test_freq=5, credit_steps=(1, 20, 40))
QUICK_SCHEDULE = Schedule(steps=3, test_freq=2, credit_steps=(1, 3))

#: Identical for every method: the task's RL settings, the held-out comparison's and the hint wording (the CPU profile
#: comes with the launch), and verl's reference pass at every step, so that every method's drift column is measured (a
#: peer's published KL weight 0 would skip the pass: ``cpo.drift_metrics``).
SHARED_OVERRIDES = [*TASK_RL_OVERRIDES, *HELD_OUT_OVERRIDES, *HINT_OVERRIDES, "cpo.drift_metrics=true"]


class ExperimentError(RuntimeError):
    """A bad command line or output folder, reported before anything expensive starts."""


#: Every regime's methods: GRPO, CPO seq_kl with the recipe's defaults (α⁺ = 0, α⁻ = 1; teacher: the rollout policy)
#: and with a fixed teacher (the starting model), and every registered peer as its authors run it (each method's
#: published teacher, context and run settings, which the recipe applies when the method is selected), SDPO also in
#: TRL's hybrid mode; ``--quick`` runs the first two.
DEFAULT_METHODS = (
    "grpo,cpo:seq_kl,cpo:seq_kl@teacher=initial,cpo:rlsd,cpo:opsd,cpo:opsd_token,cpo:sdpo,"
    "cpo:sdpo@sdpo.policy_loss_mode=hybrid,cpo:sdpg"
)
QUICK_METHODS = "grpo,cpo:seq_kl"
#: Seeds of a run without ``--seeds``: one of every method, about an hour in the default regime.
DEFAULT_SEEDS = 1


@dataclasses.dataclass(frozen=True)
class Regime:
    """What ``--regime`` chooses: the warm start, its prompts (``task``: all of the chain task's; ``hard``: those the
    warm start fails, ``hard_prompts.py``; ``long_chain``: the long problems, ``long_chain.py``) and with them the
    gate, the output folder, the regime's RL settings on top of the task's (identical for every method of the regime)
    and the seeds of its full design (``--full``: the power analysis of ``power.py``, stated on the results page)."""

    warm_start: WarmStartConfig
    output_dir: Path
    full_seeds: int
    prompts: str = "task"
    overrides: tuple[str, ...] = ()
    #: Steps between validations (and at step 0); a long-chain validation (128 prompts x 8 samples of up to 160
    #: tokens) costs about two minutes on a 2-core CPU, as much as 12 of its training steps.
    test_freq: int = DEFAULT_SCHEDULE.test_freq


REGIMES = {
    # Every prompt of the task; the warm start gives mixed prompt groups (gate: check_mixed_groups).
    # full_seeds: what fits about 8 hours of runs on a quiet 2-core machine (RESULTS.md, "The design").
    "default": Regime(EXPERIMENT_WARM_START, DEFAULT_OUTPUT_DIR, full_seeds=8),
    # The prompts the same warm start fails: most groups all wrong at the start, the hint still helps (gate:
    # hard_prompts.check_hard_regime).
    "hard": Regime(EXPERIMENT_WARM_START, Path("outputs/experiments/cpo_vs_grpo_hard"), full_seeds=8, prompts="hard"),
    # 5-8 chained operations, responses of 80-150 tokens (gate: long_chain.check_long_regime).
    "long": Regime(
        EXPERIMENT_WARM_START,
        Path("outputs/experiments/cpo_vs_grpo_long"),
        full_seeds=3,
        prompts="long_chain",
        overrides=tuple(LONG_CHAIN_OVERRIDES),
        test_freq=10,
    ),
}


def _parse_method(name: str) -> str:
    """Check one method name and return it normalised (``cpo`` alone means ``cpo:seq_kl``)."""
    from treetune_recipe.cpo.config import check_cpo_overrides
    from treetune_recipe.cpo.methods.registry import all_methods

    name = "cpo:seq_kl" if name == "cpo" else name
    if name == "grpo":
        return name
    method, *settings = name.removeprefix("cpo:").split("@")
    if not name.startswith("cpo:") or method not in all_methods():
        raise ExperimentError(
            f"--methods: unknown method {name!r}. Use grpo or cpo:<method>[@<cpo key>=<value>...] with a method among "
            f"{', '.join(all_methods())} (e.g. --methods grpo,cpo:seq_kl,cpo:seq_kl@neg_alpha=0.5)."
        )
    for setting in settings:
        try:
            check_cpo_overrides([f"cpo.{setting}"])
        except ValueError as error:
            raise ExperimentError(f"--methods: {name!r}: {error}") from None
    return name


def parse_methods(text: str) -> list[str]:
    """``grpo`` and ``cpo:<wrapper>[@<key>=<number>...]`` names, comma-separated; ``cpo`` alone means ``cpo:seq_kl``.

    ``@`` settings are ``cpo.*`` overrides, e.g. ``cpo:seq_kl@neg_alpha=0.5`` or ``cpo:rlsd@rlsd.clip=0.1``.
    """
    methods = []
    for name in (_parse_method(part.strip()) for part in text.split(",") if part.strip()):
        if name in methods:
            raise ExperimentError(f"--methods: {name!r} is listed twice.")
        methods.append(name)
    if not methods:
        raise ExperimentError("--methods is empty; e.g. --methods grpo,cpo:seq_kl.")
    return methods


def method_overrides(method: str) -> list[str]:
    """The only overrides that differ between methods."""
    if method == "grpo":
        return ["algorithm.adv_estimator=grpo"]
    wrapper, *settings = method.removeprefix("cpo:").split("@")
    return [
        "algorithm.adv_estimator=cpo",
        f"cpo.method={wrapper}",
        *(f"cpo.{s}" for s in settings),
    ]


def method_run_setting_keys(method: str) -> set[str]:
    """The config keys the published run settings of ``method`` set (none for GRPO)."""
    from treetune_recipe.cpo.methods.registry import get_method

    if method == "grpo":
        return set()
    return get_method(method.removeprefix("cpo:").split("@")[0]).run_setting_keys


def run_name(method: str, seed: int) -> str:
    """Folder name of one run, e.g. ``cpo_seq_kl_neg_alpha0.5__seed0`` for ``cpo:seq_kl@neg_alpha=0.5``."""
    return f"{method.replace(':', '_').replace('@', '_').replace('=', '')}__seed{seed}"


def run_overrides(run_dir: Path, method: str, seed: int, schedule: Schedule, dump_credit: bool) -> list[str]:
    """Overrides of one run, after the CPU tiny-run ones; the seed sets the data order and the rollout sampling.

    A key that the method's published run settings set (e.g. one update per rollout batch) is left out of the task's
    shared overrides, so the recipe applies the method's value: the run is the method as its authors run it. A key the
    user gives the experiment still wins (those overrides come after, on the command line of every run).
    """
    published = method_run_setting_keys(method)
    overrides = [
        *(override for override in SHARED_OVERRIDES if override_key(override) not in published),
        f"trainer.test_freq={schedule.test_freq}",
        f"data.seed={seed}",
        f"++actor_rollout_ref.rollout.engine_kwargs.hf.seed={seed}",
        *method_overrides(method),
    ]
    if dump_credit:
        steps = ",".join(str(step) for step in schedule.credit_steps)
        overrides += [f"cpo.credit_dump.steps=[{steps}]", f"cpo.credit_dump.dir={run_dir / 'credit_dump'}"]
    return overrides


def validation_samples(user_overrides: list[str]) -> int:
    """Responses each validation samples per held-out prompt: :data:`VAL_SAMPLES` unless the user's overrides set
    ``val_kwargs.n`` (e.g. ``n=1`` with temperature 0 for greedy validation, as the README's tuning runs did)."""
    return override_value(user_overrides, _VAL_SAMPLES_KEY, VAL_SAMPLES)


def result_rows(method: str, seed: int, metrics_path: Path, val_acc: str) -> list[dict]:
    """One row per logged step of one run, ``val_acc`` read from verl's metric of that name (empty cells where the
    step lacks a metric)."""
    rows = []
    for step, data in sorted(read_metrics(metrics_path).items()):
        row = {"method": method, "seed": seed, "step": step, "val_acc": data.get(val_acc, "")}
        for column, key in _METRIC_COLUMNS.items():
            row[column] = data.get(key, "")
        rows.append(row)
    return rows


def write_results(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=RESULT_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def source_commit() -> str:
    """The commit of the code a run trains with (``<sha>-dirty`` with uncommitted changes, ``unknown`` outside git),
    recorded in each run's ``run.json`` so that a results page names the code it measured."""
    root = Path(__file__).resolve().parents[3]

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{commit}-dirty" if dirty else commit


def prepare_output_dir(output_dir: Path, plan: dict, *, resume: bool, overwrite: bool) -> None:
    """Refuse a folder holding another experiment's results unless ``--overwrite``; check ``--resume``'s plan."""
    plan_path = output_dir / "experiment.json"
    if overwrite and output_dir.exists():
        shutil.rmtree(output_dir)
    if resume:
        if not plan_path.is_file():
            raise ExperimentError(f"--resume: {output_dir} holds no experiment.json; start without --resume.")
        previous = json.loads(plan_path.read_text())
        if previous != plan:
            changed = sorted(key for key in set(plan) | set(previous) if plan.get(key) != previous.get(key))
            raise ExperimentError(
                f"--resume: {output_dir} holds another experiment (differs in {changed}); rerun with the same "
                "arguments, or use --overwrite, or choose another --output-dir."
            )
        return
    if output_dir.exists() and any(output_dir.iterdir()):
        raise ExperimentError(
            f"{output_dir} already holds results; pass --resume to finish that experiment, --overwrite to replace "
            "it, or --output-dir for a new folder."
        )
    output_dir.mkdir(parents=True, exist_ok=True)
    plan_path.write_text(json.dumps(plan, indent=2, sort_keys=True) + "\n")


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One comparison, as checked by :func:`plan_experiment`: what :func:`run_experiment` runs."""

    regime_name: str
    methods: list[str]
    seeds: int
    schedule: Schedule
    overrides: list[str]
    output_dir: Path
    quick: bool = False
    skip_gate: bool = False
    run_timeout_s: float = 1800.0

    @property
    def regime(self) -> Regime:
        return REGIMES[self.regime_name]

    def plan(self) -> dict:
        """What ``experiment.json`` records, and ``--resume`` must find unchanged."""
        plan = {
            "regime": self.regime_name,
            "methods": self.methods,
            "seeds": self.seeds,
            "schedule": dataclasses.asdict(self.schedule),
            "warm_start": warm_start_hash(self.regime.warm_start),
            "overrides": self.overrides,
        }
        return json.loads(json.dumps(plan))  # as read back from experiment.json (tuples become lists)


def plan_experiment(
    regime_name: str,
    *,
    methods: str | None = None,
    seeds: int | None = None,
    steps: int | None = None,
    quick: bool = False,
    full: bool = False,
    output_dir: Path | None = None,
    overrides: list[str] = (),
    skip_gate: bool = False,
    run_timeout_s: float = 1800.0,
) -> Experiment:
    """The experiment a command line asks for, with the regime's defaults (every method, :data:`DEFAULT_SEEDS` seed;
    ``--full``: the regime's ``full_seeds``; ``--quick``: 3 steps, 1 seed, GRPO and CPO ``seq_kl``);
    :class:`ExperimentError` naming the bad choice."""
    regime = REGIMES[regime_name]
    if quick and full:
        raise ExperimentError("--quick and --full exclude each other.")
    seeds = seeds if seeds is not None else (regime.full_seeds if full else DEFAULT_SEEDS)
    if seeds < 1:
        raise ExperimentError(f"--seeds must be >= 1, got {seeds}.")
    base = QUICK_SCHEDULE if quick else DEFAULT_SCHEDULE
    steps = steps if steps is not None else base.steps
    if steps < 1:
        raise ExperimentError(f"--steps must be >= 1, got {steps}.")
    credit_steps = tuple(sorted({step for step in (*base.credit_steps, steps) if step <= steps}))
    return Experiment(
        regime_name=regime_name,
        methods=parse_methods(methods or (QUICK_METHODS if quick else DEFAULT_METHODS)),
        seeds=seeds,
        schedule=Schedule(
            steps=steps, test_freq=base.test_freq if quick else regime.test_freq, credit_steps=credit_steps
        ),
        overrides=[*regime.overrides, *overrides],
        output_dir=(output_dir or regime.output_dir).resolve(),
        quick=quick,
        skip_gate=skip_gate,
        run_timeout_s=run_timeout_s,
    )


@dataclasses.dataclass(frozen=True)
class RegimeInputs:
    """What every run of a regime trains on: the warm start, the regime's data overrides (its prompt files) and the
    measurements its gate reads."""

    warm_dir: Path
    warm_info: dict
    overrides: list[str]
    note: str = ""
    prompts: str = "task"
    prompts_info: dict | None = None

    def check_gate(self) -> None:
        """:class:`WarmStartGateError` when the warm start misses its regime (mixed groups; mostly-wrong hard prompts
        that the hint helps; long chains it solves sometimes and the hint often)."""
        if self.prompts == "hard":
            hard_prompts.check_hard_regime(self.prompts_info)
        elif self.prompts == "long_chain":
            long_chain.check_long_regime(self.prompts_info)
        else:
            check_mixed_groups(self.warm_info)


def prepare_regime(regime_name: str, *, quick: bool = False) -> RegimeInputs:
    """Build (or find cached) the regime's warm start and its prompts (``--quick`` keeps the task's prompts in the
    hard regime, and measures nothing for the long one's gate)."""
    regime = REGIMES[regime_name]
    print(f"[experiment] warm start ({regime_name} regime) ...", flush=True)
    warm_dir = build_warm_start(regime.warm_start)
    info = read_build_info(warm_dir)
    print(f"[experiment] {describe_warm_start(info)}", flush=True)
    if regime.prompts == "task" or (quick and regime.prompts == "hard"):
        return RegimeInputs(warm_dir, info, [])
    if quick:  # the long chains, unmeasured
        data = warm_dir / "data" / LONG_CHAIN_DATA
        return RegimeInputs(warm_dir, info, _data_files(data / "train.parquet", data / "val.parquet"))
    print(f"[experiment] {regime.prompts} prompts (measured once per warm start) ...", flush=True)
    if regime.prompts == "hard":
        selected, note_of = hard_prompts.select_hard_prompts(warm_dir), hard_prompts.describe
    else:
        selected, note_of = long_chain.long_chain_prompts(warm_dir), long_chain.describe
    note = note_of(selected.info)
    print(f"[experiment] {note}", flush=True)
    return RegimeInputs(warm_dir, info, _data_files(selected.train, selected.val), note, regime.prompts, selected.info)


def _data_files(train: Path, val: Path) -> list[str]:
    return [f"data.train_files={train}", f"data.val_files={val}"]


def run_experiment(experiment: Experiment) -> int:
    """Build the warm start (and the hard prompts), check the regime's gate, run every (method, seed) not finished
    earlier, then write ``results.csv``, ``summary.md``, ``curves.png`` and ``credit_report.html``. Returns the exit
    code: 0, 1 when a run failed, 3 when the warm start misses its regime."""
    started = time.monotonic()
    output_dir, schedule = experiment.output_dir, experiment.schedule
    inputs = prepare_regime(experiment.regime_name, quick=experiment.quick)
    warm_dir, info, regime_note = inputs.warm_dir, inputs.warm_info, inputs.note
    overrides = [*inputs.overrides, *experiment.overrides]
    if not (experiment.quick or experiment.skip_gate):
        try:
            inputs.check_gate()
        except WarmStartGateError as error:
            print(f"[experiment] stopping before RL: {error}", file=sys.stderr)
            return 3

    val_acc = val_acc_key(validation_samples(overrides))
    rows: list[dict] = []
    cpo_methods = [method for method in experiment.methods if method != "grpo"]
    commit = source_commit()
    for seed in range(experiment.seeds):
        for method in experiment.methods:
            name = run_name(method, seed)
            run_dir = output_dir / "runs" / name
            done_path = run_dir / "run.json"
            if done_path.is_file():
                print(f"[experiment] {name}: finished earlier, kept", flush=True)
            else:
                shutil.rmtree(run_dir, ignore_errors=True)
                dump = bool(cpo_methods) and method == cpo_methods[0] and seed == 0
                run = launch_cpo_on_cpu(
                    run_overrides(run_dir, method, seed, schedule, dump) + overrides,
                    run_dir / "train.log",
                    assets_dir=warm_dir,
                    run_dir=run_dir,
                    total_training_steps=schedule.steps,
                    experiment_name=name,
                    timeout_s=experiment.run_timeout_s,
                    env={"VERL_FILE_LOGGER_PATH": str(run_dir / METRICS_FILE)},
                    echo=lambda line, name=name: _echo(name, condense(line)),
                )
                if run.returncode != 0:
                    tail = "\n".join(run.log_path.read_text().splitlines()[-30:])
                    print(
                        f"[experiment] {name} failed (exit {run.returncode}); log {run.log_path}:\n{tail}",
                        file=sys.stderr,
                    )
                    return 1
                done_path.write_text(
                    json.dumps({"wall_s": round(run.wall_s, 1), "method": method, "seed": seed, "commit": commit})
                )
            run_rows = result_rows(method, seed, run_dir / METRICS_FILE, val_acc)
            rows += run_rows
            write_results(output_dir / "results.csv", rows)
            final = [row["val_acc"] for row in run_rows if row["val_acc"] != ""]
            wall = json.loads(done_path.read_text())["wall_s"]
            print(
                f"[experiment] {name} done: final val acc {final[-1] if final else 'n/a'}, run {wall:.0f} s", flush=True
            )

    caption = summary.provenance([output_dir], experiment.regime_name, info)
    table = summary.write_summary(
        output_dir / "results.csv", output_dir / "summary.md", warm_info=info, regime_note=regime_note, caption=caption
    )
    summary.plot_curves(output_dir / "results.csv", output_dir / "curves.png", caption=caption)
    if cpo_methods:
        from treetune_recipe.cpo.reports.credit_report import build_report

        dump_dir = output_dir / "runs" / run_name(cpo_methods[0], 0) / "credit_dump"
        build_report(dump_dir, output_dir / "credit_report.html")
    print(table)
    print(f"[experiment] outputs in {output_dir}; total {time.monotonic() - started:.0f} s", flush=True)
    return 0


def _echo(name: str, line: str | None) -> None:
    if line is not None:
        print(f"[{name}] {line}", flush=True)
