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

The command line of :mod:`treetune_recipe.cpo.experiments.summary` (where every number is defined). Usage::

    python -m treetune_scripts.experiments.summary outputs/experiments/cpo_vs_grpo
    python -m treetune_scripts.experiments.summary DIR_A DIR_B --output-dir OUT [--methods grpo,cpo:opsd_token]

Several folders (the same warm start, e.g. a second experiment that added a method) are summarised as one: their rows
are combined into ``OUT/results.csv``, then summarised and plotted from there.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from treetune_recipe.cpo.experiments.summary import (
    combine_results,
    plot_curves,
    provenance,
    warm_info,
    write_summary,
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment_dirs", type=Path, nargs="+", help="experiment folders (one results.csv each)")
    parser.add_argument("--output-dir", type=Path, help="needed with several folders or --methods (a new folder)")
    parser.add_argument("--methods", help="comma-separated methods to keep (default: all)")
    args = parser.parse_args(argv)
    directories = args.experiment_dirs
    if len(directories) == 1 and args.methods is None and args.output_dir is None:
        output_dir = directories[0]  # summarised in place
    elif args.output_dir is None or args.output_dir in directories:
        parser.error("several folders or --methods need an --output-dir other than the experiment folders")
    else:
        output_dir = args.output_dir
        combine_results(directories, output_dir / "results.csv", args.methods.split(",") if args.methods else None)
    results_csv = output_dir / "results.csv"
    warm = warm_info(directories[0])
    plans = [d / "experiment.json" for d in directories]
    regimes = sorted({json.loads(p.read_text()).get("regime", "?") for p in plans if p.is_file()}) or ["?"]
    caption = provenance(directories, "+".join(regimes), warm)
    print(write_summary(results_csv, output_dir / "summary.md", warm, caption=caption))
    plot_curves(results_csv, output_dir / "curves.png", caption=caption)


if __name__ == "__main__":
    main()
