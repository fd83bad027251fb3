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

The command line of :mod:`treetune_recipe.cpo.experiments.cpo_vs_grpo`. Each (method, seed) is one real run of the
recipe entry point (``python -m treetune_recipe.cpo.main_cpo platform=cpu``: Ray, verl's trainer); GRPO is the same
config with ``algorithm.adv_estimator=grpo``. Validation is verl's own (``trainer.val_before_train``,
``trainer.test_freq``) on the held-out plain prompts, sampled as the rollout samples. The first CPO run of the first
seed dumps its token credit (``cpo.credit_dump``).

``--regime hard`` runs the hard regime instead (``REGIMES``): the same warm start, trained and validated on the
problems it fails (``hard_prompts.py``), so that most prompt groups are all wrong at the start and only a hint-guided
method gets a signal from them. Outputs (``--output-dir``, default
``outputs/experiments/cpo_vs_grpo/``, ``outputs/experiments/cpo_vs_grpo_hard/`` for the hard regime): ``results.csv``,
``summary.md``, ``curves.png``, ``credit_report.html``, ``experiment.json`` and ``runs/<method>__seed<k>/`` (metrics,
log, dump).

Usage::

    python -m treetune_scripts.experiments.cpo_vs_grpo [--regime default|hard] [--methods grpo,cpo:seq_kl,...]
        [--seeds 3] [--quick] [--resume | --overwrite] [key=value ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path

from treetune_recipe.cpo.cpu_run import launch_cpo_on_cpu
from treetune_recipe.cpo.experiments import hard_prompts, summary
from treetune_recipe.cpo.experiments.cpo_vs_grpo import (
    DEFAULT_METHODS,
    DEFAULT_SCHEDULE,
    HARD_METHODS,
    QUICK_METHODS,
    QUICK_SCHEDULE,
    REGIMES,
    ExperimentError,
    Schedule,
    parse_methods,
    prepare_output_dir,
    result_rows,
    run_name,
    run_overrides,
    source_commit,
    validation_samples,
    write_results,
)
from treetune_recipe.cpo.experiments.task import val_acc_key
from treetune_recipe.cpo.experiments.warm_start import (
    WarmStartGateError,
    build_warm_start,
    check_mixed_groups,
    describe_warm_start,
    read_build_info,
    warm_start_hash,
)
from treetune_verl.tiny_run import METRICS_FILE


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--regime",
        choices=sorted(REGIMES),
        default="default",
        help="default: a warm start with mixed prompt groups; hard: most groups all wrong at the start, the hint "
        "still helps (each with its own warm start, gate, methods and output folder)",
    )
    parser.add_argument(
        "--methods",
        default=None,
        help=f"grpo and cpo:<method>[@<cpo key>=<value>...], comma-separated; default "
        f"the regime's (default: {DEFAULT_METHODS}; hard: {HARD_METHODS}; --quick: {QUICK_METHODS})",
    )
    parser.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 3; --quick: 1)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (default 40; --quick: 3)")
    parser.add_argument("--quick", action="store_true", help="pipeline check: 3 steps, 1 seed, no gate")
    parser.add_argument("--output-dir", type=Path, default=None, help="default: the regime's folder")
    parser.add_argument("--resume", action="store_true", help="keep finished runs, run the rest")
    parser.add_argument("--overwrite", action="store_true", help="delete the output folder's previous results")
    parser.add_argument("--skip-gate", action="store_true", help="run RL even if the warm start misses its regime")
    parser.add_argument("--run-timeout", type=float, default=1800.0, help="kill one run after this many seconds")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run (key=value), applied last")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    try:
        regime = REGIMES[args.regime]
        methods = parse_methods(args.methods or (QUICK_METHODS if args.quick else regime.methods))
        seeds = args.seeds if args.seeds is not None else (1 if args.quick else 3)
        if seeds < 1:
            raise ExperimentError(f"--seeds must be >= 1, got {seeds}.")
        if args.resume and args.overwrite:
            raise ExperimentError("--resume and --overwrite exclude each other.")
        base = QUICK_SCHEDULE if args.quick else DEFAULT_SCHEDULE
        steps = args.steps if args.steps is not None else base.steps
        if steps < 1:
            raise ExperimentError(f"--steps must be >= 1, got {steps}.")
        credit_steps = tuple(sorted({step for step in (*base.credit_steps, steps) if step <= steps}))
        schedule = Schedule(steps=steps, test_freq=base.test_freq, credit_steps=credit_steps)
        overrides = [*regime.overrides, *args.overrides]
        plan = {
            "regime": args.regime,
            "methods": methods,
            "seeds": seeds,
            "schedule": dataclasses.asdict(schedule),
            "warm_start": warm_start_hash(regime.warm_start),
            "overrides": overrides,
        }
        plan = json.loads(json.dumps(plan))  # as read back from experiment.json (tuples become lists)
        output_dir = (args.output_dir or regime.output_dir).resolve()
        prepare_output_dir(output_dir, plan, resume=args.resume, overwrite=args.overwrite)
    except ExperimentError as error:
        print(f"[experiment] {error}", file=sys.stderr)
        return 2

    print(f"[experiment] warm start ({args.regime} regime) ...", flush=True)
    warm_dir = build_warm_start(regime.warm_start)
    info = read_build_info(warm_dir)
    print(f"[experiment] {describe_warm_start(info)}", flush=True)
    regime_note = ""
    if regime.hard_prompts and not args.quick:
        print("[experiment] hard prompts (sampled once per warm start) ...", flush=True)
        selected = hard_prompts.select_hard_prompts(warm_dir)
        regime_note = hard_prompts.describe(selected.info)
        print(f"[experiment] {regime_note}", flush=True)
        overrides = [f"data.train_files={selected.train}", f"data.val_files={selected.val}", *overrides]
    if not (args.quick or args.skip_gate):
        try:
            if regime.hard_prompts:
                hard_prompts.check_hard_regime(selected.info)
            else:
                check_mixed_groups(info)
        except WarmStartGateError as error:
            print(f"[experiment] stopping before RL: {error}", file=sys.stderr)
            return 3

    from treetune_recipe.cpo.experiments.console import condense

    val_acc = val_acc_key(validation_samples(overrides))
    rows: list[dict] = []
    cpo_methods = [method for method in methods if method != "grpo"]
    commit = source_commit()
    for seed in range(seeds):
        for method in methods:
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
                    timeout_s=args.run_timeout,
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

    table = summary.write_summary(
        output_dir / "results.csv", output_dir / "summary.md", warm_info=info, regime_note=regime_note
    )
    summary.plot_curves(output_dir / "results.csv", output_dir / "curves.png")
    if cpo_methods:
        from treetune_recipe.cpo.credit_report import build_report

        dump_dir = output_dir / "runs" / run_name(cpo_methods[0], 0) / "credit_dump"
        build_report(dump_dir, output_dir / "credit_report.html")
    print(table)
    print(f"[experiment] outputs in {output_dir}; total {time.monotonic() - started:.0f} s", flush=True)
    return 0


def _echo(name: str, line: str | None) -> None:
    if line is not None:
        print(f"[{name}] {line}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
