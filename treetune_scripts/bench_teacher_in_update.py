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
"""Step time and driver footprint of the distribution-level teachers (OPSD, SDPO) against GRPO, on CPU.

Runs one after the other, on the tiny config of ``bench_cpo_vs_grpo_cpu`` (its ``COMMON_OVERRIDES``: dynamic batch
sizes and the ``compute_score_half_correct`` reward, so that SDPO has correct responses to learn from): ``grpo``
(``algorithm.adv_estimator=grpo``), ``opsd_k0`` and ``opsd_k50`` (``cpo.method=opsd``, ``cpo.opsd.top_k`` 0,
the full vocabulary, or 50) and ``sdpo_k100`` (``cpo.method=sdpo cpo.sdpo.top_k=100``), each method with its
published run settings, at two shapes: ``demo`` (the CPU profile's ``data.train_batch_size``, its ``rollout.n``) and
``x8`` (``data.train_batch_size=32``, 8x the prompts). Per run, over the steps after ``--warmup``: the median
``timing_s/step`` and its ratio to ``grpo`` at the same shape, the median of verl's reference pass
(``timing_s/ref``, 0 when skipped), of ``timing_s/old_log_prob`` and ``timing_s/update_actor``, and of the separate
teacher pass of the code before the teacher moved into the update (``timing_s/cpo_gw_log_prob``,
``timing_s/cpo_student_topk``, inside ``update_actor``; ``-`` when the code has none); what the driver (verl's
TaskRunner) hands to ``update_actor``: the median ``treetune/update_actor_mb`` and its rows x response width; the
driver's peak resident memory (max ``treetune/driver_peak_rss_mb``, ``ru_maxrss``) and the run's (the launcher's
sample of the process tree, GiB). A metric the code does not log prints ``-``. No assertion: a measurement.

    python -m treetune_scripts.bench_teacher_in_update [--steps 3] [--warmup 1] [--runs grpo,opsd_k0,...]
        [--shapes demo,x8] [--label NAME] [--out FILE.md] [--work-dir DIR] [--keep] [hydra overrides ...]

A failed run is reported in the table (its folder and log kept) and the others still run.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from treetune_scripts.bench_cpo_vs_grpo_cpu import COMMON_OVERRIDES, run_once, summarize_steps

CPO = "algorithm.adv_estimator=cpo"
RUNS = {
    "grpo": ["algorithm.adv_estimator=grpo"],
    "opsd_k0": [CPO, "cpo.method=opsd", "cpo.opsd.top_k=0"],
    "opsd_k50": [CPO, "cpo.method=opsd", "cpo.opsd.top_k=50"],
    "sdpo_k100": [CPO, "cpo.method=sdpo", "cpo.sdpo.top_k=100"],
}
SHAPES = {"demo": [], "x8": ["data.train_batch_size=32"]}
BASELINE = "grpo"
#: (column, metric, how): ``median`` over the measured steps, ``max`` over them, or ``step`` (``summarize_steps``).
COLUMNS = [
    ("step s", "timing_s/step", "step"),
    ("ref s", "timing_s/ref", "step"),
    ("old_log_prob s", "timing_s/old_log_prob", "step"),
    ("update_actor s", "timing_s/update_actor", "step"),
    ("gw_log_prob s", "timing_s/cpo_gw_log_prob", "step"),
    ("student_topk s", "timing_s/cpo_student_topk", "step"),
    ("update_actor MB", "treetune/update_actor_mb", "median"),
    ("rows", "treetune/update_actor_rows", "median"),
    ("width", "treetune/update_actor_width", "median"),
    ("driver peak MB", "treetune/driver_peak_rss_mb", "max"),
]
#: A step part that is 0 rather than missing when a run skips it.
ZERO_WHEN_ABSENT = {"timing_s/ref"}


def run_stats(metrics: dict[int, dict[str, float]], warmup: int) -> dict[str, float]:
    """The :data:`COLUMNS` metrics of one run over the steps after ``warmup`` (a metric never logged is left out)."""
    steps = [values for step, values in sorted(metrics.items()) if step > warmup]
    parts = summarize_steps(metrics, warmup)
    stats = {}
    for _, key, how in COLUMNS:
        logged = [values[key] for values in steps if key in values]
        if how == "step" and (key in parts or key in ZERO_WHEN_ABSENT):
            stats[key] = parts.get(key, 0.0)
        elif how != "step" and logged:
            stats[key] = max(logged) if how == "max" else statistics.median(logged)
    return stats


def table_rows(results: dict[tuple[str, str], dict[str, float] | str]) -> list[list[str]]:
    """Header and one row per (run, shape): the :data:`COLUMNS`, the step ratio to ``grpo``, peak RSS and wall time."""
    header = ["run", "shape", "step s", f"step/{BASELINE}", *(column for column, _, _ in COLUMNS[1:])]
    rows = [[*header, "run peak GiB", "wall s"]]
    for (name, shape), stats in results.items():
        if isinstance(stats, str):
            rows.append([name, shape, f"FAILED: {stats}"] + [""] * (len(rows[0]) - 3))
            continue
        base = results.get((BASELINE, shape))
        base_step = base.get("timing_s/step") if isinstance(base, dict) else None
        step = stats.get("timing_s/step")
        ratio = f"{step / base_step:.2f}x" if step is not None and base_step else "-"
        cells = [
            _cell(stats.get(key), 0 if key.endswith(("_rows", "_width", "_rss_mb")) else 3) for _, key, _ in COLUMNS
        ]
        rows.append(
            [name, shape, cells[0], ratio, *cells[1:], _cell(stats.get("peak_gib"), 2), _cell(stats["wall_s"], 0)]
        )
    return rows


def _cell(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_markdown(rows: list[list[str]]) -> str:
    """``rows`` as a markdown table, columns padded so that it also reads as plain text."""
    widths = [max(len(row[i]) for row in rows if len(row) > i) for i in range(len(rows[0]))]
    widths[2] = max(len(rows[0][2]), *(len(row[2]) for row in rows if not row[2].startswith("FAILED")))

    def line(row: list[str]) -> str:
        if row[2].startswith("FAILED"):
            return f"| {row[0]:<{widths[0]}} | {row[1]:<{widths[1]}} | {row[2]} |"
        return (
            "| "
            + " | ".join(f"{cell:<{w}}" if i < 2 else f"{cell:>{w}}" for i, (cell, w) in enumerate(zip(row, widths)))
            + " |"
        )

    separator = "|" + "|".join(("-" * (w + 2) if i < 2 else "-" * (w + 1) + ":") for i, w in enumerate(widths)) + "|"
    return "\n".join([line(rows[0]), separator, *(line(row) for row in rows[1:])])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="measured steps per run (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="steps dropped at the start (default 1)")
    parser.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated names from {list(RUNS)}")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated names from {list(SHAPES)}")
    parser.add_argument("--label", default="", help="name of the code measured, printed in the table's header")
    parser.add_argument("--out", type=Path, default=None, help="also write the table as markdown to this file")
    parser.add_argument("--work-dir", type=Path, default=None, help="folder for the runs (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the run folders after the benchmark")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    args = parser.parse_args(argv)
    names, shapes = ([n.strip() for n in text.split(",") if n.strip()] for text in (args.runs, args.shapes))
    for flag, chosen, known in (("--runs", names, RUNS), ("--shapes", shapes, SHAPES)):
        unknown = sorted(set(chosen) - set(known))
        if unknown or not chosen:
            parser.error(f"{flag}: unknown {unknown or 'empty'}; choose from {list(known)}")
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="bench_teacher_"))
    work_dir.mkdir(parents=True, exist_ok=True)
    results: dict[tuple[str, str], dict[str, float] | str] = {}
    started = time.monotonic()
    for shape in shapes:
        for name in names:
            overrides = [*COMMON_OVERRIDES, *RUNS[name], *SHAPES[shape], *args.overrides]
            run_started = time.monotonic()
            try:
                metrics, peak_rss = run_once(f"{name}@{shape}", args.warmup + args.steps, work_dir, overrides)
            except SystemExit as failure:  # run_once's message names the kept log
                results[name, shape] = str(failure)
                print(f"{name}@{shape}: {failure}", flush=True)
                continue
            stats = run_stats(metrics, args.warmup)
            stats.update(peak_gib=peak_rss / 2**30, wall_s=time.monotonic() - run_started)
            results[name, shape] = stats
            print(f"{name}@{shape}: done in {stats['wall_s']:.0f} s", flush=True)
    title = (
        f"{args.label or 'bench_teacher_in_update'}: {args.steps} steps after {args.warmup} warm-up step(s), medians "
        f"(driver peak: max); overrides for every run: {' '.join([*COMMON_OVERRIDES, *args.overrides])}; "
        f"benchmark wall time {time.monotonic() - started:.0f} s"
    )
    text = f"{title}\n\n{format_markdown(table_rows(results))}\n"
    print(text)
    if args.out is not None:
        args.out.write_text(f"## {text}")
    failed = any(isinstance(stats, str) for stats in results.values())
    if args.keep or args.work_dir is not None or failed:
        print(f"run folders: {work_dir}")
    else:
        shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
