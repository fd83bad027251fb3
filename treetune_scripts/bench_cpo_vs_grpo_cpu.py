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
"""Time per step of CPO vs GRPO on the CPU backend: same tiny config, one run after the other.

Each run trains ``warmup + steps`` steps with the CPO recipe's config (``platform=cpu``); the GRPO run only switches
``algorithm.adv_estimator=grpo``. The first ``warmup`` steps are dropped. Prints the mean of ``timing_s/step`` and of
every ``timing_s/*`` part per run, and the CPO/GRPO ratio.

    python -m treetune_scripts.bench_cpo_vs_grpo_cpu [--steps 3] [--warmup 1] [hydra overrides ...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from treetune_scripts.make_tiny_assets import build_tiny_assets
from treetune_verl.cpu_backend.tiny_run import METRICS_FILE, launch_training, read_metrics, tiny_run_overrides

CONFIG_DIR = Path(__file__).resolve().parents[1] / "treetune_recipe" / "cpo" / "config"
ESTIMATORS = ("grpo", "cpo")


def is_step_part(key: str) -> bool:
    """A ``timing_s/*`` metric that is a part of the step time (not the agent loop's per-request counters)."""
    return key.startswith("timing_s/") and not key.startswith(
        ("timing_s/agent_loop/", "timing_s/start_profile", "timing_s/stop_profile")
    )


def mean_timings(metrics: dict[int, dict[str, float]], warmup: int) -> dict[str, float]:
    """Mean of every ``timing_s/*`` metric over the steps after ``warmup`` (0 for a part a step did not run)."""
    steps = [values for step, values in sorted(metrics.items()) if step > warmup]
    keys = sorted({key for values in steps for key in values if is_step_part(key)})
    return {key: statistics.fmean(values.get(key, 0.0) for values in steps) for key in keys}


def run_once(estimator: str, steps: int, work_dir: Path, overrides: list[str]) -> dict[str, float]:
    run_dir = work_dir / estimator
    run = launch_training(
        [
            "platform=cpu",
            *tiny_run_overrides(build_tiny_assets(), run_dir, total_training_steps=steps, experiment_name=estimator),
            f"algorithm.adv_estimator={estimator}",
            f"hydra.run.dir={run_dir / 'hydra'}",
            *overrides,
        ],
        run_dir / "train.log",
        entry_module="treetune_recipe.cpo.main_cpo",
        config_dir=CONFIG_DIR,
        config_name="cpo_trainer",
        timeout_s=1200,
        cwd=run_dir,
    )
    if run.returncode != 0:
        raise SystemExit(f"{estimator} run failed (exit {run.returncode}); log: {run.log_path}")
    return read_metrics(run_dir / METRICS_FILE)


def format_table(timings: dict[str, dict[str, float]]) -> str:
    keys = ["timing_s/step"] + sorted({k for t in timings.values() for k in t} - {"timing_s/step"})
    lines = [f"{'metric (s, mean per step)':<32}{'GRPO':>10}{'CPO':>10}{'CPO/GRPO':>10}"]
    for key in keys:
        grpo, cpo = timings["grpo"].get(key, 0.0), timings["cpo"].get(key, 0.0)
        ratio = f"{cpo / grpo:.2f}x" if grpo > 0 else "-"
        lines.append(f"{key:<32}{grpo:>10.3f}{cpo:>10.3f}{ratio:>10}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="measured steps per run (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="steps dropped at the start (default 1)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for both runs")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench_cpo_") as work_dir:
        timings = {
            estimator: mean_timings(
                run_once(estimator, args.warmup + args.steps, Path(work_dir), args.overrides), args.warmup
            )
            for estimator in ESTIMATORS
        }
    print(f"CPO vs GRPO on the CPU backend, {args.steps} steps after {args.warmup} warm-up step(s)")
    print(format_table(timings))


if __name__ == "__main__":
    main()
