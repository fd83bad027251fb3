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
"""Print the power analysis of the CPO-vs-GRPO experiment: the variance of a paired difference in final accuracy,
estimated from the results page's runs, the seeds a paired t-test needs to detect ``--effect`` (default 0.02) for
several validation sizes, and the minimum detectable effect of each seed count.

The definitions are in :mod:`treetune_recipe.cpo.experiments.power`. Usage::

    python -m treetune_scripts.experiments.power [--effect 0.02] [--exclude cpo:sdpo] [--seeds 2,3,4,6,8,12,16]
"""

from __future__ import annotations

import argparse

from treetune_recipe.cpo.experiments.power import (
    RESULTS_58AA441,
    fit_variance,
    minimum_detectable_effect,
    seeds_needed,
)

#: Validation sizes compared: (held-out prompts, samples per prompt).
VALIDATION_SIZES = ((64, 8), (103, 8), (128, 8), (256, 8), (256, 16), (1_000_000, 1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--effect", type=float, default=0.02, help="difference in final accuracy to detect")
    parser.add_argument("--exclude", default="cpo:sdpo", help="methods left out of the fit, comma-separated")
    parser.add_argument("--seeds", default="2,3,4,6,8,12,16", help="seed counts whose detectable effect to print")
    args = parser.parse_args(argv)
    exclude = [name for name in args.exclude.split(",") if name]
    seed_counts = [int(n) for n in args.seeds.split(",")]
    model = fit_variance(RESULTS_58AA441, exclude=exclude)
    print(
        f"Fit on {', '.join(r.name for r in RESULTS_58AA441)} (commit 58aa441), without {', '.join(exclude) or '-'}: "
        f"sd_train = {model.train_var**0.5:.4f} ({model.dof} degrees of freedom), mean accuracy p = "
        f"{model.accuracy:.3f}\n"
    )
    print(
        f"| prompts x samples | sd of a paired difference | seeds for {args.effect} | "
        + " | ".join(f"MDE, {n} seeds" for n in seed_counts)
        + " |"
    )
    print("|---|---|---|" + "---|" * len(seed_counts))
    for prompts, samples in VALIDATION_SIZES:
        sd = model.diff_sd(prompts, samples)
        label = "infinite" if prompts >= 1_000_000 else f"{prompts} x {samples}"
        mdes = " | ".join(f"{minimum_detectable_effect(sd, n):.3f}" for n in seed_counts)
        print(f"| {label} | {sd:.4f} | {seeds_needed(args.effect, sd)} | {mdes} |")


if __name__ == "__main__":
    main()
