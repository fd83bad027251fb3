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
"""``results.csv`` of an experiment -> ``summary.md`` (per-method table) and ``curves.png``.

Every number of the summary is computed here from ``results.csv`` alone (definitions in :func:`summarize`), so it can
be recomputed by anyone. The command line is ``python -m treetune_scripts.experiments.summary``.

Several folders (the same warm start, e.g. a second experiment that added a method) are summarised as one
(:func:`combine_results`): their rows are combined into one ``results.csv``, then summarised and plotted from there.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections import defaultdict
from pathlib import Path

#: The threshold of "steps to threshold" is the mean first validation accuracy over all runs plus this margin.
THRESHOLD_MARGIN = 0.10
BASELINE_METHOD = "grpo"
#: ``results.csv`` columns plotted per step (mean over seeds), with their panel titles.
PER_STEP_PANELS = {
    "train_reward": "train reward",
    "all_wrong_frac": "responses in all-wrong groups",
    "drift": "drift from the reference: mean old − ref (unclamped)",
    "response_length": "response length (tokens)",
    "entropy": "policy entropy (actor/entropy)",
    "gw_minus_old": "teacher − student log-prob, g − o",
}


def read_results(path: Path | str) -> list[dict]:
    """Rows of ``results.csv`` with numbers parsed (empty cells -> None)."""
    rows = []
    with open(path, newline="") as handle:
        for raw in csv.DictReader(handle):
            row = {"method": raw["method"], "seed": int(raw["seed"]), "step": int(raw["step"])}
            for key, value in raw.items():
                if key not in row:
                    row[key] = float(value) if value not in ("", None) else None
            rows.append(row)
    return rows


def _mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _curve(rows: list[dict], method: str, seed: int) -> list[tuple[int, float]]:
    return sorted(
        (r["step"], r["val_acc"])
        for r in rows
        if (r["method"], r["seed"]) == (method, seed) and r["val_acc"] is not None
    )


def paired_difference(values: dict[int, float], baseline: dict[int, float]) -> tuple[float, float, int] | None:
    """Mean over the seeds both have of ``values[seed] - baseline[seed]``, the half-width of its 95 % t-interval
    (``t_{0.975, n-1} · sd / √n``, the quantile from ``scipy.stats.t``; infinite for one seed) and n; None without a
    common seed."""
    from scipy.stats import t as student_t

    diffs = [values[seed] - baseline[seed] for seed in sorted(values.keys() & baseline.keys())]
    if not diffs:
        return None
    if len(diffs) == 1:
        return diffs[0], math.inf, 1
    quantile = float(student_t.ppf(0.975, df=len(diffs) - 1))
    return statistics.fmean(diffs), quantile * statistics.stdev(diffs) / math.sqrt(len(diffs)), len(diffs)


def normalised_auc(curve: list[tuple[int, float]]) -> float:
    """Trapezoid area under validation accuracy vs step, divided by the step span (the curve's mean height)."""
    if len(curve) == 1:
        return curve[0][1]
    area = sum((s1 - s0) * (a0 + a1) / 2 for (s0, a0), (s1, a1) in zip(curve, curve[1:]))
    return area / (curve[-1][0] - curve[0][0])


def summarize(rows: list[dict]) -> dict:
    """Per method: final validation accuracy, normalised AUC, steps to threshold, step time and its ratio to GRPO.

    - first, final: validation accuracy at each seed's first / last validated step; mean ± sample std over seeds;
    - auc: :func:`normalised_auc` per seed; mean ± sample std;
    - threshold: mean over all runs of the first validated accuracy + :data:`THRESHOLD_MARGIN`; steps to threshold:
      per seed the first validated step whose accuracy >= threshold; mean over the seeds that reach it;
    - step time: per seed the mean ``step_time_s`` of steps >= 2 (step 1 includes warm-up), mean over seeds; the
      ratio divides it by GRPO's;
    - all-wrong share (``all_wrong_frac``: the share of a step's responses in prompt groups without a correct one):
      per seed at step 1 and the mean over all steps; mean over seeds (None where the runs did not log it);
    - KL: ``kl`` (``actor/kl_loss``, verl's ``low_var_kl``: clamped at 10 per token, so it saturates) at each seed's
      last step; min and max over seeds;
    - paired differences from GRPO: per seed, the method's final accuracy (AUC) minus GRPO's of the same seed (same
      warm start, data order and rollout seed); mean and 95 % t-interval (:func:`paired_difference`);
    - context token share (``context_token_frac``: the share of a step's response tokens whose row has a teacher
      context; SDPO masks rows without a successful sibling): per seed the mean over steps; mean ± sample std over
      seeds (None where no run logged it);
    - rollout agreement: the largest ``|rollout_kl|`` (``rollout_corr/kl``, the k1 estimate of KL between the
      rollout's and the trainer's log-probs of the sampled tokens) and ``rollout_probs_diff`` (the mean
      ``|p_rollout − p_trainer|``) over every step of every seed (None where no run logged them);
    - drift, response length, entropy, g − o: ``drift`` (mean ``old − ref`` log-ratio over response tokens,
      unclamped), ``response_length``, ``entropy``, ``gw_minus_old`` at each seed's last step that logged them; mean
      ± sample std over seeds (None where no run logged them).
    """
    methods = list(dict.fromkeys(r["method"] for r in rows))
    seeds = {m: sorted({r["seed"] for r in rows if r["method"] == m}) for m in methods}
    curves = {(m, s): _curve(rows, m, s) for m in methods for s in seeds[m]}
    curves = {key: curve for key, curve in curves.items() if curve}
    threshold = round(statistics.fmean(curve[0][1] for curve in curves.values()) + THRESHOLD_MARGIN, 4)
    step_times: dict[str, list[float]] = defaultdict(list)
    for m in methods:
        for s in seeds[m]:
            times = [r["step_time_s"] for r in rows if (r["method"], r["seed"]) == (m, s) and r["step"] >= 2]
            times = [t for t in times if t is not None]
            if times:
                step_times[m].append(statistics.fmean(times))
    result = {"threshold": threshold, "methods": {}}
    for m in methods:
        method_curves = [curves[(m, s)] for s in seeds[m] if (m, s) in curves]
        reached = [next((step for step, acc in c if acc >= threshold), None) for c in method_curves]
        reached = [step for step in reached if step is not None]
        step_time = statistics.fmean(step_times[m]) if step_times[m] else math.nan
        runs = [
            sorted((r for r in rows if (r["method"], r["seed"]) == (m, s)), key=lambda r: r["step"]) for s in seeds[m]
        ]
        all_wrong = [[r["all_wrong_frac"] for r in run if r.get("all_wrong_frac") is not None] for run in runs]
        all_wrong = [values for values in all_wrong if values]
        final_kl = [run[-1].get("kl") for run in runs if run and run[-1].get("kl") is not None]
        context = [[r["context_token_frac"] for r in run if r.get("context_token_frac") is not None] for run in runs]
        context = [statistics.fmean(values) for values in context if values]
        disagreement = [
            [abs(r[column]) for run in runs for r in run if r.get(column) is not None]
            for column in ("rollout_kl", "rollout_probs_diff")
        ]
        last_logged = {
            column: [next((r[column] for r in reversed(run) if r.get(column) is not None), None) for run in runs]
            for column in ("drift", "response_length", "entropy", "gw_minus_old")
        }
        result["methods"][m] = {
            "seeds": len(seeds[m]),
            "first": _mean_std([c[0][1] for c in method_curves]),
            "final": _mean_std([c[-1][1] for c in method_curves]),
            "auc": _mean_std([normalised_auc(c) for c in method_curves]),
            "steps_to_threshold": statistics.fmean(reached) if reached else None,
            "reached": len(reached),
            "step_time_s": step_time,
            "all_wrong_first": statistics.fmean(v[0] for v in all_wrong) if all_wrong else None,
            "all_wrong_mean": statistics.fmean(statistics.fmean(v) for v in all_wrong) if all_wrong else None,
            "final_kl": (min(final_kl), max(final_kl)) if final_kl else None,
            "context_share": _mean_std(context) if context else None,
            "rollout_agreement": tuple(max(values) for values in disagreement) if all(disagreement) else None,
            "final_by_seed": {s: curves[(m, s)][-1][1] for s in seeds[m] if (m, s) in curves},
            "auc_by_seed": {s: normalised_auc(curves[(m, s)]) for s in seeds[m] if (m, s) in curves},
            **{
                f"last_{column}": _mean_std([v for v in values if v is not None])
                if any(v is not None for v in values)
                else None
                for column, values in last_logged.items()
            },
        }
    baseline = result["methods"].get(BASELINE_METHOD)
    for stats in result["methods"].values():
        for key in ("final", "auc"):
            stats[f"{key}_vs_grpo"] = (
                paired_difference(stats[f"{key}_by_seed"], baseline[f"{key}_by_seed"]) if baseline else None
            )
    base = result["methods"].get(BASELINE_METHOD, {}).get("step_time_s")
    for stats in result["methods"].values():
        stats["step_time_ratio"] = stats["step_time_s"] / base if base and not math.isnan(base) else None
    return result


def _pm(pair: tuple[float, float]) -> str:
    return f"{pair[0]:.4f} ± {pair[1]:.4f}"


def _paired(difference: tuple[float, float, int] | None) -> str:
    if difference is None:
        return "-"
    mean, half_width, n = difference
    return f"{mean:+.4f} [{mean - half_width:+.4f}, {mean + half_width:+.4f}] (n={n})"


def summary_table(stats: dict) -> str:
    """The markdown table of :func:`summarize`'s result."""
    threshold = stats["threshold"]
    lines = [
        "| method | seeds | first val acc | final val acc | final − grpo (paired, 95 % CI) | val acc AUC "
        f"| AUC − grpo (paired, 95 % CI) | steps to val acc ≥ {threshold:.4f} | all-wrong share: step 1 / mean "
        "| drift old − ref (unclamped) | actor/kl_loss (clamped) | response length | entropy | g − o "
        "| context token share | rollout vs trainer: max abs kl / probs diff | step time (s) "
        "| step-time ratio vs grpo |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for method, s in stats["methods"].items():
        to_threshold = (
            f"{s['steps_to_threshold']:.1f} ({s['reached']}/{s['seeds']})" if s["reached"] else f"- (0/{s['seeds']})"
        )
        ratio = f"{s['step_time_ratio']:.3f}" if s["step_time_ratio"] is not None else "-"
        all_wrong = (
            f"{s['all_wrong_first']:.3f} / {s['all_wrong_mean']:.3f}" if s.get("all_wrong_first") is not None else "-"
        )
        kl = f"{s['final_kl'][0]:.3f}-{s['final_kl'][1]:.3f}" if s.get("final_kl") else "-"
        last = [_pm(s[f"last_{c}"]) if s.get(f"last_{c}") else "-" for c in ("drift", "response_length", "entropy")]
        g_minus_o = _pm(s["last_gw_minus_old"]) if s.get("last_gw_minus_old") else "-"
        context = _pm(s["context_share"]) if s.get("context_share") else "-"
        agreement = "{:.4f} / {:.4f}".format(*s["rollout_agreement"]) if s.get("rollout_agreement") else "-"
        paired = {
            key: "baseline" if method == BASELINE_METHOD else _paired(s[f"{key}_vs_grpo"]) for key in ("final", "auc")
        }
        lines.append(
            f"| {method} | {s['seeds']} | {_pm(s['first'])} | {_pm(s['final'])} | {paired['final']} "
            f"| {_pm(s['auc'])} | {paired['auc']} | {to_threshold} | {all_wrong} | {last[0]} | {kl} "
            f"| {last[1]} | {last[2]} | {g_minus_o} | {context} | {agreement} | {s['step_time_s']:.3f} | {ratio} |"
        )
    return "\n".join(lines)


def provenance(experiment_dirs: list[Path], regime: str, warm: dict | None = None) -> str:
    """One line naming what a table and figure measured: the regime, the runs of every folder and the commits they
    trained with (their ``run.json``; ``unknown`` for a run that did not record one), and the warm start (its cache key
    in the first folder's ``experiment.json``, which :func:`combine_results` checks the others share, and its weights'
    sha256)."""
    import json

    runs = sorted(path for directory in experiment_dirs for path in Path(directory).glob("runs/*/run.json"))
    commits = sorted({json.loads(path.read_text()).get("commit", "unknown") for path in runs})
    named = ", ".join(commit[:10] + ("-dirty" if commit.endswith("-dirty") else "") for commit in commits) or "none"
    folders = f" in {len(experiment_dirs)} folders" if len(experiment_dirs) > 1 else ""
    plan_path = Path(experiment_dirs[0]) / "experiment.json"
    key = json.loads(plan_path.read_text()).get("warm_start", "?") if plan_path.is_file() else "?"
    weights = (warm or {}).get("weights_sha256", "?")[:12]
    return f"{regime} regime, {len(runs)} runs{folders} at commit {named}; warm start {key} (weights sha256 {weights}…)"


def write_summary(
    results_csv: Path | str,
    summary_md: Path | str,
    warm_info: dict | None = None,
    regime_note: str = "",
    caption: str = "",
) -> str:
    """Write ``summary.md`` (``regime_note``: a paragraph on the regime's prompts, after the warm start's;
    ``caption``: :func:`provenance`, the first line); returns its table."""
    stats = summarize(read_results(results_csv))
    table = summary_table(stats)
    warm = f"{caption}.\n\n" if caption else ""
    if warm_info:
        warm += (
            f"Warm start: greedy validation accuracy {warm_info['val_acc_plain']:.3f} on plain prompts, "
            f"{warm_info['val_acc_hint']:.3f} with the hint ({warm_info['parameters']} parameters, "
            f"`{warm_info['path']}`).\n\n"
        )
    if regime_note:
        warm += f"{regime_note}\n\n"
    text = (
        "# CPO vs GRPO: summary\n\n"
        f"{warm}{table}\n\n"
        "Definitions (all recomputable from `results.csv`, see `treetune_recipe/cpo/experiments/summary.py`): "
        "mean ± sample std over seeds; validation accuracy = verl's `val-core/<source>/acc/mean@n` (by default the "
        "experiment samples n = 8 responses per held-out prompt at temperature 1); "
        "first / final = validation accuracy at the first / last validated step; "
        "AUC = trapezoid area "
        "under validation accuracy vs step divided by the step span; threshold = mean first validation accuracy of "
        f"all runs + {THRESHOLD_MARGIN}, steps averaged over the seeds that reach it (reached/seeds); all-wrong share "
        "= share of a step's responses in prompt groups without a correct response (`cpo/group_all_wrong_frac`), at "
        "step 1 / averaged over the steps, mean over seeds; paired differences = per seed, the method minus GRPO of "
        "the same seed (same warm start, data order and rollout draws at step 1), mean and 95 % Student-t interval; "
        "drift = mean `old − ref` log-ratio over response tokens at the last step (`treetune/drift/old_minus_ref_mean`,"
        " the k1 estimate of KL(policy ‖ reference) per token, unclamped; the reference is the warm start, except "
        "under a refreshed teacher, where it restarts at each refresh); actor/kl_loss = verl's `low_var_kl` at the "
        "last step, min-max over seeds (clamped at 10 per token: it saturates); response length, entropy "
        "(`actor/entropy`) and g − o (`cpo/gw_minus_old_mean`) at the last step; context token share = share of a "
        "step's response tokens whose row has a teacher context (`cpo/context_token_frac`; SDPO masks the rows "
        "without a successful sibling), mean over steps per seed, mean ± std over seeds; rollout vs trainer = the "
        "largest |`rollout_corr/kl`| and `training/rollout_probs_diff_mean` over every step of every seed; "
        "step time = mean `step_time_s` of steps >= 2 per seed, averaged over seeds.\n"
    )
    Path(summary_md).write_text(text)
    return table


def plot_curves(results_csv: Path | str, png_path: Path | str, caption: str = "") -> Path:
    """Validation accuracy (mean ± std band over seeds) per method vs step and vs cumulative step time, and the
    :data:`PER_STEP_PANELS` columns per step (mean over seeds); ``caption`` (:func:`provenance`) heads the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = read_results(results_csv)
    fig, axes = plt.subplots(2, 4, figsize=(20, 8.4))
    axes = axes.ravel()
    for index, method in enumerate(dict.fromkeys(r["method"] for r in rows)):
        color = f"C{index}"  # one colour per method in every panel, whichever panels it has data for
        seeds = sorted({r["seed"] for r in rows if r["method"] == method})
        per_seed = []
        for seed in seeds:
            run = sorted((r for r in rows if (r["method"], r["seed"]) == (method, seed)), key=lambda r: r["step"])
            elapsed, clock = {}, 0.0
            for r in run:
                clock += r["step_time_s"] or 0.0
                elapsed[r["step"]] = clock
            per_seed.append((run, elapsed))
        steps = sorted(set.intersection(*({r["step"] for r in run if r["val_acc"] is not None} for run, _ in per_seed)))
        if steps:
            acc = np.array([[next(r["val_acc"] for r in run if r["step"] == s) for s in steps] for run, _ in per_seed])
            wall = np.array([[elapsed[s] for s in steps] for _, elapsed in per_seed]).mean(axis=0)
            mean, std = acc.mean(axis=0), acc.std(axis=0, ddof=1) if len(seeds) > 1 else np.zeros(len(steps))
            for axis, x in ((axes[0], steps), (axes[1], wall)):
                axis.plot(x, mean, marker="o", color=color, label=f"{method} (n={len(seeds)})")
                axis.fill_between(x, mean - std, mean + std, color=color, alpha=0.2)
        for axis, column in zip(axes[2:], PER_STEP_PANELS):
            logged = sorted({r["step"] for run, _ in per_seed for r in run if r.get(column) is not None})
            if logged:
                means = [
                    statistics.fmean(
                        r[column] for run, _ in per_seed for r in run if r["step"] == step and r.get(column) is not None
                    )
                    for step in logged
                ]
                axis.plot(logged, means, color=color, label=method)
    titles = ("validation accuracy vs step", "validation accuracy vs training time", *PER_STEP_PANELS.values())
    xlabels = ("step", "cumulative step time (s)", *["step"] * len(PER_STEP_PANELS))
    for axis, title, xlabel in zip(axes, titles, xlabels):
        axis.set_title(title, fontsize=10)
        axis.set_xlabel(xlabel)
        axis.grid(alpha=0.3)
        if axis.has_data():
            axis.legend(fontsize=8)
    axes[0].set_ylabel("validation accuracy (held-out plain prompts)")
    if caption:
        fig.suptitle(caption, fontsize=11)
    fig.tight_layout()
    fig.savefig(png_path, dpi=80)
    plt.close(fig)
    return Path(png_path)


def warm_info(experiment_dir: Path) -> dict | None:
    """The build info of the experiment's warm start, when it is in the default cache."""
    import json

    from treetune_recipe.cpo.experiments.warm_start import read_build_info
    from treetune_verl.tiny_assets import default_cache_root

    plan_path = experiment_dir / "experiment.json"
    if not plan_path.is_file():
        return None
    key = json.loads(plan_path.read_text())["warm_start"]
    # build_warm_start names the folder of the shipped weights <key>-shipped, of an SFT build <key>
    for warm_dir in (default_cache_root() / "warm_start" / name for name in (f"{key}-shipped", key)):
        if (warm_dir / "build_info.json").is_file():
            return read_build_info(warm_dir)
    return None


def combine_results(experiment_dirs: list[Path], results_csv: Path, methods: list[str] | None = None) -> Path:
    """Write the ``results.csv`` rows of several experiment folders (of ``methods`` only, if given) into one file.

    Raises:
        ValueError: if the folders do not share one warm start (``experiment.json``), or two of them hold a run of
            the same method and seed.
    """
    import json

    warm_starts = {json.loads((d / "experiment.json").read_text())["warm_start"] for d in experiment_dirs}
    if len(warm_starts) != 1:
        raise ValueError(f"The experiments started from different warm starts ({sorted(warm_starts)}); not comparable.")
    header, rows, runs_seen = None, [], set()
    for directory in experiment_dirs:
        with open(directory / "results.csv", newline="") as handle:
            reader = csv.DictReader(handle)
            header = header or reader.fieldnames
            kept = [row for row in reader if methods is None or row["method"] in methods]
        runs = {(row["method"], row["seed"]) for row in kept}
        if runs & runs_seen:
            raise ValueError(f"Runs {sorted(runs & runs_seen)} of {directory} are in an earlier folder too.")
        runs_seen |= runs
        rows += kept
    results_csv.parent.mkdir(parents=True, exist_ok=True)
    with open(results_csv, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
    return results_csv
