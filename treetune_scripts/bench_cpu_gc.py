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
"""Step time on the CPU backend with and without verl's explicit ``gc.collect()`` calls, side by side.

Two runs of the same tiny CPO config (the former ``make demo`` settings: tiny assets, ``lr=1e-3``): one with
``VERL_CPU_KEEP_GC=1`` (verl's collections kept, as before the ``skip_full_gc`` patch), one without. Prints the
median of every ``timing_s/*`` part over the steps after the warm-up, the ratio, and the non-timing metrics that differ
between the two runs. Expect differences: the CPU rollout is not bitwise reproducible from run to run (the HF server
batches concurrent requests as they arrive, which changes the sampling order), and two runs of the *same* variant
differ as much. A ``gc.collect()`` frees unreachable objects only; it reads or writes no tensor.

    python -m treetune_scripts.bench_cpu_gc [--steps 4] [--warmup 1] [hydra overrides ...]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from verl_cpu.patches import KEEP_VERL_GC_ENV

from treetune_recipe.cpo.cpu_run import launch_cpo_on_cpu
from treetune_scripts.bench_cpo_vs_grpo_cpu import summarize_steps
from treetune_scripts.make_tiny_assets import build_tiny_assets
from treetune_verl.tiny_run import METRICS_FILE, read_metrics

VARIANTS = {"verl gc kept": "1", "gc skipped": "0"}


def run_variant(keep_gc: str, steps: int, run_dir: Path, overrides: list[str]) -> dict[int, dict[str, float]]:
    run = launch_cpo_on_cpu(
        [
            "actor_rollout_ref.actor.optim.lr=1e-3",
            f"++ray_kwargs.ray_init.runtime_env.env_vars.{KEEP_VERL_GC_ENV}='{keep_gc}'",
            *overrides,
        ],
        run_dir / "train.log",
        assets_dir=build_tiny_assets(),
        run_dir=run_dir,
        total_training_steps=steps,
        experiment_name="bench_gc",
        timeout_s=1200,
        env={KEEP_VERL_GC_ENV: keep_gc},
    )
    if run.returncode != 0:
        raise SystemExit(f"run failed (exit {run.returncode}); log: {run.log_path}")
    return read_metrics(run_dir / METRICS_FILE)


def differing_metrics(a: dict[int, dict[str, float]], b: dict[int, dict[str, float]]) -> list[str]:
    """``step:metric`` of every metric that is not a timing, throughput or memory figure and differs between runs."""
    volatile = ("timing_", "perf/", "time", "memory", "mfu")

    def computed(metrics):
        return {f"{s}:{k}": v for s, d in metrics.items() for k, v in d.items() if not any(x in k for x in volatile)}

    first, second = computed(a), computed(b)
    return sorted(key for key in first.keys() | second.keys() if first.get(key) != second.get(key))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="measured steps per run (default 4)")
    parser.add_argument("--warmup", type=int, default=1, help="steps dropped at the start (default 1)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for both runs")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench_gc_") as work_dir:
        metrics = {
            name: run_variant(keep, args.warmup + args.steps, Path(work_dir) / name.replace(" ", "_"), args.overrides)
            for name, keep in VARIANTS.items()
        }
    timings = {
        name: {key: value for key, value in summarize_steps(values, args.warmup).items() if key.startswith("timing_s/")}
        for name, values in metrics.items()
    }
    before, after = timings["verl gc kept"], timings["gc skipped"]
    keys = ["timing_s/step"] + sorted((set(before) | set(after)) - {"timing_s/step"})
    print(f"CPU backend, tiny CPO run, median of steps {args.warmup + 1}-{args.warmup + args.steps}")
    print(f"{'metric (s, median per step)':<32}{'gc kept':>10}{'skipped':>10}{'ratio':>8}")
    for key in keys:
        b, a = before.get(key, 0.0), after.get(key, 0.0)
        print(f"{key:<32}{b:>10.3f}{a:>10.3f}{(f'{a / b:.2f}x' if b > 0 else '-'):>8}")
    differing = differing_metrics(*metrics.values())
    print(f"non-timing metrics that differ between the runs: {len(differing)} {differing[:12]}")


if __name__ == "__main__":
    main()
