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
"""Benchmark: the CPU demo on each CPU rollout engine, side by side (same steps, prompts, seeds and settings).

Runs ``python -m treetune_scripts.run_demo`` once per engine, each in its own fresh output folder, one after the other:

- ``hf``: the CPU backend's HF-transformers server (fp32);
- ``vllm``: verl's vLLM rollout on vLLM's CPU build, in the CPU profile's float32;
- ``vllm-bf16``: the same in vLLM's default bfloat16 (``actor_rollout_ref.rollout.dtype=bfloat16``).

Prints one markdown table: the run's wall time (Ray start-up, worker and engine init included), step 1 (warm-up), the
mean of the later steps and of their parts (generation, old-log-prob pass, CPO's hinted pass), peak memory (sum of
RSS over the run's processes), the rollout/trainer mismatch the run-health guard reads (largest ``|rollout_corr/kl|``
and ``training/rollout_probs_diff_mean`` over the steps) and the last greedy validation accuracy.

Usage::

    python -m treetune_scripts.bench_rollout_engines [--engines hf vllm vllm-bf16] [--steps 30] [--output-dir DIR]
        [hydra overrides ...]

Extra ``key=value`` arguments go to every run (e.g. ``algorithm.adv_estimator=grpo`` for GRPO).
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from treetune_recipe.cpo.experiments.task import GREEDY_VAL_ACC_KEY
from treetune_verl.metrics_history import read_metrics
from treetune_verl.rollout_health import KL_METRIC, PROBS_DIFF_METRIC
from treetune_verl.tiny_run import METRICS_FILE

ENGINES = {
    "hf": ["actor_rollout_ref.rollout.name=hf"],
    "vllm": ["actor_rollout_ref.rollout.name=vllm"],
    "vllm-bf16": ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.dtype=bfloat16"],
}
#: Step parts, by verl's (and the CPO trainer's) timing keys.
PARTS = {"gen": "timing_s/gen", "old log-prob": "timing_s/old_log_prob", "hinted pass": "timing_s/cpo_gw_log_prob"}
_DEMO_LINES = {
    "wall_s": re.compile(r"\[demo\] training wall time ([\d.]+) s"),
    "peak_gib": re.compile(r"\[demo\] peak memory .* ([\d.]+) GiB"),
}


def run_engine(engine: str, output_dir: Path, steps: int, overrides: list[str]) -> dict[str, float]:
    """One fresh demo run on ``engine`` (its folder is emptied first: no resume); returns its table row."""
    shutil.rmtree(output_dir, ignore_errors=True)
    command = [
        sys.executable,
        "-m",
        "treetune_scripts.run_demo",
        "--steps",
        str(steps),
        "--output-dir",
        str(output_dir),
    ]
    print(f"[bench] {engine}: {' '.join(command[1:])} {' '.join(ENGINES[engine] + overrides)}", flush=True)
    done = subprocess.run([*command, *ENGINES[engine], *overrides], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"[bench] the {engine} run failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    row = {key: float(pattern.search(done.stdout)[1]) for key, pattern in _DEMO_LINES.items()}
    metrics = read_metrics(output_dir / METRICS_FILE)
    steps_logged = sorted(step for step, values in metrics.items() if "timing_s/step" in values)
    later = [metrics[step] for step in steps_logged[1:]]
    row["step1_s"] = metrics[steps_logged[0]]["timing_s/step"]
    row["later_s"] = statistics.fmean(values["timing_s/step"] for values in later)
    for part, key in PARTS.items():
        row[part] = statistics.fmean(values.get(key, 0.0) for values in later)
    row["kl_absmax"] = max(abs(metrics[step][KL_METRIC]) for step in steps_logged)
    row["probs_diff_max"] = max(metrics[step][PROBS_DIFF_METRIC] for step in steps_logged)
    accuracies = [values[GREEDY_VAL_ACC_KEY] for _, values in sorted(metrics.items()) if GREEDY_VAL_ACC_KEY in values]
    row["val_acc"] = accuracies[-1] if accuracies else float("nan")
    return row


def table(rows: dict[str, dict[str, float]]) -> str:
    baseline = rows.get("hf")
    header = (
        "| engine | run wall (s) | ratio vs hf | step 1 (s) | later steps (s) | "
        + " | ".join(f"{part} (s)" for part in PARTS)
        + " | peak RSS (GiB) | max abs rollout_corr/kl | max probs diff | final greedy acc |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for engine, row in rows.items():
        ratio = f"{row['wall_s'] / baseline['wall_s']:.2f}" if baseline else "-"
        parts = " | ".join(f"{row[part]:.3f}" for part in PARTS)
        lines.append(
            f"| {engine} | {row['wall_s']:.0f} | {ratio} | {row['step1_s']:.1f} | {row['later_s']:.3f} | {parts} | "
            f"{row['peak_gib']:.2f} | {row['kl_absmax']:.2e} | {row['probs_diff_max']:.4f} | {row['val_acc']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", nargs="+", choices=sorted(ENGINES), default=list(ENGINES))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--output-dir", type=Path, default=Path("outputs/bench_rollout_engines"))
    args, overrides = parser.parse_known_args(argv)
    rows = {engine: run_engine(engine, args.output_dir / engine, args.steps, overrides) for engine in args.engines}
    print(table(rows))


if __name__ == "__main__":
    main()
