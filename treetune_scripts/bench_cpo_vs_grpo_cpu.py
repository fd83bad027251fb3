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
"""Time per step of GRPO, CPO scoring every row under the hint and CPO scoring only the rows it reads, on CPU.

Runs one after the other on the same tiny config (the CPO recipe's, ``platform=cpu``): ``grpo``
(``algorithm.adv_estimator=grpo``), ``cpo_all`` (``cpo.hint.rescore=all``) and ``cpo_needed``
(``cpo.hint.rescore=needed``), the hinted pass on the actor (teacher ``policy``); with ``--runs``, also
``cpo_initial`` and ``cpo_refreshed``: ``cpo_needed`` with the hinted pass on verl's reference worker (teacher
``initial``, and ``refreshed`` from the actor every :data:`BENCH_REFRESH_STEPS` steps, so that the measured steps
include refreshes), and the published peers ``rlsd``, ``opsd``, ``opsd_token`` and ``sdpo`` with their own settings
(their teacher, sampling and updates per rollout; OPSD's and SDPO's teacher runs inside the update). All use
dynamic batch sizes (the GPU launch scripts' setting: a pass costs
the tokens it scores) and the ``compute_score_half_correct`` reward, a stand-in for a policy right about half the
time (the tiny random model never is), so that CPO has rows whose hinted log-probs it does not read. The first
``warmup`` steps are dropped. Prints the median step time and its parts side by side (nested parts indented under
their parent), then per run the hinted-pass ratio ``timing_s/cpo_gw_log_prob / timing_s/old_log_prob``,
``cpo/hint_rows_frac`` and ``cpo/hint_token_ratio`` (tokens scored by the hinted pass over tokens scored by the
old-log-prob pass), and checks with ``needed``: ratio <= hint_rows_frac + 0.1 (a hinted row costing what a plain
row costs); ratio <= hint_token_ratio + 0.1 (the pass costs the tokens it scores, a hint prompt being longer than a
plain one); and hinted-pass time needed/all <= hint_rows_frac + 0.1 (the selective pass costs its share of the
full one).

With ``--experiment REGIME`` the runs are instead the methods of the CPO-vs-GRPO experiment at its shape: its warm
start (and, in the hard regime, its prompts), its task and held-out settings, seed 0, each method with its published
run settings (``--runs`` then takes the experiment's method names, e.g. ``grpo,cpo:seq_kl,cpo:sdpo``), validation
off. Every run also reports its peak resident memory: the highest sum over the training process and its Ray
processes, sampled by the launcher (pages shared between processes count once per process), and its ratio to the
first run's.

Run folders go under ``--work-dir`` (default: a new temporary folder); they are deleted after a successful
benchmark unless ``--keep``, and always kept when a run fails (the message names the log).

    python -m treetune_scripts.bench_cpo_vs_grpo_cpu [--steps 3] [--warmup 1] [--runs grpo,cpo_all,...] [--keep]
        [--experiment {default,hard}] [hydra overrides ...]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

from treetune_recipe.cpo.experiments import cpo_vs_grpo
from treetune_recipe.cpo.trainer.cpu_run import launch_cpo_on_cpu
from treetune_verl.metrics_history import read_metrics
from treetune_verl.tiny_assets import build_tiny_assets
from treetune_verl.tiny_run import METRICS_FILE

#: Refresh period of the ``cpo_refreshed`` run: short, so that a few measured steps hold a refresh.
BENCH_REFRESH_STEPS = 2
RUNS = {
    "grpo": ["algorithm.adv_estimator=grpo"],
    "cpo_all": ["algorithm.adv_estimator=cpo", "cpo.hint.rescore=all"],
    "cpo_needed": ["algorithm.adv_estimator=cpo", "cpo.hint.rescore=needed"],
    "cpo_initial": ["algorithm.adv_estimator=cpo", "cpo.hint.rescore=needed", "cpo.teacher=initial"],
    "cpo_refreshed": [
        "algorithm.adv_estimator=cpo",
        "cpo.hint.rescore=needed",
        "cpo.teacher=refreshed",
        f"cpo.teacher_refresh_steps={BENCH_REFRESH_STEPS}",
    ],
}
# Each published peer with its own settings (the recipe applies a method's run settings when it is selected).
RUNS.update(
    {name: ["algorithm.adv_estimator=cpo", f"cpo.method={name}"] for name in ("rlsd", "opsd", "opsd_token", "sdpo")}
)
DEFAULT_RUNS = "grpo,cpo_all,cpo_needed"
COMMON_OVERRIDES = [
    "actor_rollout_ref.actor.use_dynamic_bsz=true",  # the rollout and ref log-prob passes follow it by interpolation
    "reward.custom_reward_function.name=compute_score_half_correct",
]
# Timed parts that run inside another timed part: child -> parent.
NESTED_IN = {
    "timing_s/cpo_hint_batch": "timing_s/update_actor",
    "timing_s/cpo_gw_log_prob": "timing_s/update_actor",
    "timing_s/cpo_teacher_context": "timing_s/update_actor",
}
HINT_RATIO_TARGET_MARGIN = 0.1
#: Not a metric of verl's: the run's peak resident memory (:attr:`TrainingRun.peak_rss_bytes`) in GiB.
PEAK_RSS_KEY = "peak_rss_gib"
HINT_FRACTIONS = ("cpo/hint_rows_frac", "cpo/hint_token_ratio")


def is_step_part(key: str) -> bool:
    """A ``timing_s/*`` metric that is a part of the step time (not the agent loop's per-request counters)."""
    return key.startswith("timing_s/") and not key.startswith(
        ("timing_s/agent_loop/", "timing_s/start_profile", "timing_s/stop_profile")
    )


def summarize_steps(metrics: dict[int, dict[str, float]], warmup: int) -> dict[str, float]:
    """Over the steps after ``warmup``: the median of every step part and the mean of the ``HINT_FRACTIONS``.

    Medians, because on a small shared machine a few steps stall (a part taking 2-4x its usual time) and would move a
    mean of ten steps by tens of percent. A step part a step did not run (e.g. a skipped hinted pass) counts 0.
    """
    steps = [values for step, values in sorted(metrics.items()) if step > warmup]
    if not steps:
        raise ValueError(f"No step after the {warmup} warm-up step(s): logged steps {sorted(metrics)}.")
    keys = sorted({key for values in steps for key in values if is_step_part(key)})
    stats = {key: statistics.median(values.get(key, 0.0) for values in steps) for key in keys}
    for key in HINT_FRACTIONS:
        logged = [values[key] for values in steps if key in values]
        if logged:
            stats[key] = statistics.fmean(logged)
    return stats


def hint_pass_ratio(stats: dict[str, float]) -> float | None:
    """``timing_s/cpo_gw_log_prob / timing_s/old_log_prob`` of one run (None for a run without CPO)."""
    if "cpo/hint_rows_frac" not in stats or not stats.get("timing_s/old_log_prob"):
        return None
    return stats.get("timing_s/cpo_gw_log_prob", 0.0) / stats["timing_s/old_log_prob"]


def table_rows(keys: set[str]) -> list[tuple[str, str]]:
    """(key, label) in print order: the step, its parts, each part's nested parts and its remainder, indented."""
    parts = sorted(key for key in keys if key != "timing_s/step" and key not in NESTED_IN)
    rows = [("timing_s/step", "timing_s/step")]
    for part in parts:
        rows.append((part, f"  {part}"))
        children = sorted(child for child, parent in NESTED_IN.items() if parent == part and child in keys)
        if children:
            rows.extend((child, f"    {child}") for child in children)
            rows.append((f"rest:{part}", f"    rest of {part.removeprefix('timing_s/')}"))
    return rows


def name_column_width(names) -> int:
    """Width of a column headed or filled by run names: the longest name and two spaces, at least 12."""
    return max(12, *(len(name) + 2 for name in names))


def format_table(stats: dict[str, dict[str, float]]) -> str:
    """Step parts of every run side by side, and each run's time relative to the first run."""
    names = list(stats)
    base = names[0]
    keys = {key for run in stats.values() for key in run if is_step_part(key)}

    def value(run: dict[str, float], key: str) -> float:
        if key.startswith("rest:"):
            parent = key.removeprefix("rest:")
            children = [child for child, of in NESTED_IN.items() if of == parent]
            return run.get(parent, 0.0) - sum(run.get(child, 0.0) for child in children)
        return run.get(key, 0.0)

    width = name_column_width(names)
    ratio_width = max(20, *(len(f"{name}/{base}") + 2 for name in names))
    header = f"{'seconds per step (median)':<40}" + "".join(f"{name:>{width}}" for name in names)
    header += "".join(f"{name + '/' + base:>{ratio_width}}" for name in names[1:])
    lines = [header]
    for key, label in table_rows(keys):
        values = [value(stats[name], key) for name in names]
        ratios = [f"{v / values[0]:.2f}x" if values[0] > 0 else "-" for v in values[1:]]
        lines.append(
            f"{label:<40}"
            + "".join(f"{v:>{width}.3f}" for v in values)
            + "".join(f"{r:>{ratio_width}}" for r in ratios)
        )
    lines.append("(indented parts run inside the part above them; `rest of ...` = the parent minus those parts)")
    return "\n".join(lines)


def format_summary(stats: dict[str, dict[str, float]]) -> str:
    """Per run: step time, hinted-pass ratio and the hint fractions; the target checks of ``cpo_needed``."""
    width = name_column_width(stats)
    base = next(iter(stats.values()))
    lines = [
        f"{'run':<{width}}{'step s':>10}{'step/first':>12}{'peak RSS GiB':>14}{'peak/first':>12}"
        f"{'gw_log_prob/old_log_prob':>28}{'hint_rows_frac':>18}{'hint_token_ratio':>18}"
    ]
    for name, run in stats.items():
        step, peak = run.get("timing_s/step", 0.0), run.get(PEAK_RSS_KEY)
        ratios = [_ratio(step, base.get("timing_s/step")), _ratio(peak, base.get(PEAK_RSS_KEY))]
        texts = [hint_pass_ratio(run), *(run.get(key) for key in HINT_FRACTIONS)]
        texts = [f"{value:.2f}" if value is not None else "-" for value in texts]
        lines.append(
            f"{name:<{width}}{step:>10.3f}{ratios[0]:>12}{'-' if peak is None else f'{peak:.2f}':>14}{ratios[1]:>12}"
            f"{texts[0]:>28}{texts[1]:>18}{texts[2]:>18}"
        )
    needed = stats.get("cpo_needed", {})
    ratio, frac, tokens = hint_pass_ratio(needed), needed.get("cpo/hint_rows_frac"), needed.get("cpo/hint_token_ratio")
    if ratio is None or frac is None:
        return "\n".join(lines)
    checks = [("gw_log_prob/old_log_prob", ratio, "hint_rows_frac", frac)]
    if tokens is not None:
        checks.append(("gw_log_prob/old_log_prob", ratio, "hint_token_ratio", tokens))
    full_pass = stats.get("cpo_all", {}).get("timing_s/cpo_gw_log_prob")
    if full_pass:
        checks.append(("cpo_gw_log_prob needed/all", needed.get("timing_s/cpo_gw_log_prob", 0.0) / full_pass,
                       "hint_rows_frac", frac))  # fmt: skip
    for measured_name, measured, bound_name, bound in checks:
        verdict = "met" if measured <= bound + HINT_RATIO_TARGET_MARGIN else "NOT met"
        lines.append(
            f"check (cpo_needed): {measured_name} {measured:.2f} <= {bound_name} {bound:.2f} + "
            f"{HINT_RATIO_TARGET_MARGIN}: {verdict}"
        )
    return "\n".join(lines)


def _ratio(value: float | None, base: float | None) -> str:
    return f"{value / base:.2f}x" if value is not None and base else "-"


def run_once(
    name: str, steps: int, work_dir: Path, overrides: list[str], assets_dir: Path | None = None
) -> tuple[dict[int, dict[str, float]], int]:
    """Train ``steps`` steps of run ``name`` with ``overrides`` on ``assets_dir`` (default: the tiny assets); returns
    its metrics by step and its peak resident bytes. SystemExit naming the kept log on failure."""
    run_dir = work_dir / cpo_vs_grpo.run_name(name, 0).removesuffix("__seed0")
    run = launch_cpo_on_cpu(
        overrides,
        run_dir / "train.log",
        assets_dir=assets_dir or build_tiny_assets(),
        run_dir=run_dir,
        total_training_steps=steps,
        experiment_name=run_dir.name,
        timeout_s=1200,
    )
    if run.returncode != 0:
        raise SystemExit(f"{name} run failed (exit {run.returncode}); its folder is kept, log: {run.log_path}")
    return read_metrics(run_dir / METRICS_FILE), run.peak_rss_bytes


def experiment_runs(regime_name: str, runs: str | None, steps: int) -> tuple[Path, dict[str, list[str]]]:
    """The warm start and each method's overrides at the CPO-vs-GRPO experiment's shape (seed 0, validation off)."""
    methods = cpo_vs_grpo.parse_methods(runs or cpo_vs_grpo.DEFAULT_METHODS)
    inputs = cpo_vs_grpo.prepare_regime(regime_name)
    schedule = cpo_vs_grpo.Schedule(steps=steps, test_freq=-1, credit_steps=())
    no_validation = ["trainer.val_before_train=false"]
    return inputs.warm_dir, {
        method: [*cpo_vs_grpo.run_overrides(Path(), method, 0, schedule, False), *inputs.overrides, *no_validation]
        for method in methods
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="measured steps per run (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="steps dropped at the start (default 1)")
    parser.add_argument("--work-dir", type=Path, default=None, help="folder for the runs (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the run folders after a successful benchmark")
    parser.add_argument(
        "--runs",
        default=None,
        help=f"comma-separated names from {list(RUNS)} (default {DEFAULT_RUNS}), or with --experiment the "
        "experiment's method names (default: the regime's methods); the first is the baseline",
    )
    parser.add_argument(
        "--experiment", choices=sorted(cpo_vs_grpo.REGIMES), default=None,
        help="run the CPO-vs-GRPO experiment's methods at its shape, in this regime",
    )  # fmt: skip
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    args = parser.parse_args(argv)
    steps = args.warmup + args.steps
    if args.experiment:
        try:
            assets_dir, runs = experiment_runs(args.experiment, args.runs, steps)
        except cpo_vs_grpo.ExperimentError as error:
            parser.error(str(error))
        shape = f"the {args.experiment} experiment's shape"
    else:
        names = [name.strip() for name in (args.runs or DEFAULT_RUNS).split(",") if name.strip()]
        unknown = sorted(set(names) - set(RUNS))
        if unknown or not names:
            parser.error(f"--runs: unknown {unknown or 'empty'}; choose from {list(RUNS)}")
        assets_dir, runs = None, {name: [*COMMON_OVERRIDES, *RUNS[name]] for name in names}
        shape = f"the tiny config; overrides: {' '.join(COMMON_OVERRIDES)}"
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="bench_cpo_"))
    work_dir.mkdir(parents=True, exist_ok=True)
    stats = {}
    for name, overrides in runs.items():
        metrics, peak_rss = run_once(name, steps, work_dir, [*overrides, *args.overrides], assets_dir)
        stats[name] = {**summarize_steps(metrics, args.warmup), PEAK_RSS_KEY: peak_rss / 2**30}
    print(f"{', '.join(stats)} on the CPU backend at {shape}, {args.steps} steps after {args.warmup} warm-up "
          f"step(s); overrides for every run: {' '.join(args.overrides) or 'none'}")  # fmt: skip
    print(format_table(stats))
    print(format_summary(stats))
    if args.keep or args.work_dir is not None:
        print(f"run folders: {work_dir}")
    else:
        shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
