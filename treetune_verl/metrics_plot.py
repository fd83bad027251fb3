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
"""Plot the metrics of a training run logged by verl's ``file`` logger, and summarize them in a short table.

verl's file logger (``trainer.logger=[...,"file"]``) writes one JSON object per line, ``{"step": int, "data": {metric:
value}}``; its path is ``$VERL_FILE_LOGGER_PATH`` or ``$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl``.

Library of the command line ``python -m treetune_scripts.plot_metrics`` and of the demo's plots.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from treetune_verl import metrics_history

DEFAULT_KEYS = [
    "critic/score/mean",
    "critic/rewards/mean",
    "actor/pg_loss",
    "actor/grad_norm",
    "response_length/mean",
    "timing_s/step",
]
# Every metric under these prefixes is plotted by default too (the CPO recipe's own metrics).
DEFAULT_PREFIXES = ("cpo/", "actor/cpo/")


def read_metrics(jsonl_path: Path | str) -> dict[str, list[tuple[int, float]]]:
    """Read a file-logger jsonl into ``{metric: [(step, value), ...]}`` sorted by step.

    The records are the training steps and the initial validation of step 0
    (``treetune_verl.metrics_history.read_metrics``: a resumed run's validation record and lines cut by a kill are
    left out). Non-numeric values (strings, lists) are ignored.

    Raises:
        ValueError: when the file holds no such record.
    """
    by_step = metrics_history.read_metrics(jsonl_path)
    if not by_step:
        raise ValueError(
            f"{jsonl_path}: no metrics record; expected JSON lines {{'step': .., 'data': {{..}}}} as written by verl's "
            "file logger during training"
        )
    series: dict[str, list[tuple[int, float]]] = {}
    for step in sorted(by_step):
        for key, value in by_step[step].items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            series.setdefault(key, []).append((step, float(value)))
    return series


def select_keys(available: list[str], keys: list[str] | None) -> tuple[list[str], list[str]]:
    """Keys to plot and requested keys that are missing.

    With ``keys=None`` the request is :data:`DEFAULT_KEYS` plus every available key under :data:`DEFAULT_PREFIXES`.
    """
    if keys is None:
        keys = DEFAULT_KEYS + sorted(k for k in available if k.startswith(DEFAULT_PREFIXES) and k not in DEFAULT_KEYS)
    present = set(available)
    return [k for k in keys if k in present], [k for k in keys if k not in present]


def plot_metrics(jsonl_path: Path | str, png_path: Path | str, keys: list[str] | None = None) -> Path:
    """Draw one subplot per metric against the training step and save it as a PNG.

    Args:
        jsonl_path: verl file-logger output.
        png_path: Where to write the PNG (parent folders are created).
        keys: Metrics to plot, in order; default :data:`DEFAULT_KEYS` plus every ``cpo/`` or ``actor/cpo/`` metric
            in the file. Missing keys are skipped with a note on stderr.

    Returns:
        ``png_path`` as a Path.

    Raises:
        ValueError: if none of the requested metrics is in the file.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = read_metrics(jsonl_path)
    plotted, missing = select_keys(list(series), keys)
    for key in missing:
        print(f"plot_metrics: {key!r} not in {jsonl_path}, skipped", file=sys.stderr)
    if not plotted:
        raise ValueError(
            f"none of the requested metrics {missing} is in {jsonl_path}; available: {sorted(series)[:20]} ..."
        )

    columns = min(3, len(plotted))
    rows = math.ceil(len(plotted) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.5 * columns, 3.2 * rows), squeeze=False)
    for axis, key in zip(axes.flat, plotted):
        steps, values = zip(*series[key])
        axis.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3)
        axis.set_title(key, fontsize=10)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    for axis in list(axes.flat)[len(plotted) :]:
        axis.set_visible(False)
    figure.suptitle(Path(jsonl_path).name)
    figure.tight_layout()

    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png_path, dpi=100)
    plt.close(figure)
    return png_path


def summarize_metrics(jsonl_path: Path | str) -> str:
    """A small table of step, mean score and step time (``-`` where a step did not log the metric)."""
    series = read_metrics(jsonl_path)
    columns = {"score mean": "critic/score/mean", "step time (s)": "timing_s/step"}
    by_step = {label: dict(series.get(key, [])) for label, key in columns.items()}
    steps = sorted({step for values in by_step.values() for step in values})

    lines = [f"{'step':>6}  " + "  ".join(f"{label:>14}" for label in columns)]
    for step in steps:
        cells = [by_step[label].get(step) for label in columns]
        lines.append(f"{step:>6}  " + "  ".join(f"{'-':>14}" if c is None else f"{c:>14.4f}" for c in cells))
    return "\n".join(lines)
