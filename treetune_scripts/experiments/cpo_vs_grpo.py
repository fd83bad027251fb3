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
method gets a signal from them. ``--regime long`` trains and validates on problems of 5-8 chained operations with
responses of 80-150 tokens (``long_chain.py``). By default every method runs one seed (about an hour in the default
regime on a 2-core CPU); ``--full`` runs the regime's full design, the seeds the results page states from the power
analysis (``power.py``). Outputs (``--output-dir``, default ``outputs/experiments/cpo_vs_grpo/``, ``..._hard/`` and
``..._long/`` for the other regimes): ``results.csv``, ``summary.md``, ``curves.png``, ``credit_report.html``,
``experiment.json`` and ``runs/<method>__seed<k>/`` (metrics, log, dump).

Usage::

    python -m treetune_scripts.experiments.cpo_vs_grpo [--regime default|hard|long] [--methods grpo,cpo:seq_kl,...]
        [--seeds N | --full | --quick] [--resume | --overwrite] [key=value ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from treetune_recipe.cpo.experiments.cpo_vs_grpo import (
    DEFAULT_METHODS,
    QUICK_METHODS,
    REGIMES,
    ExperimentError,
    plan_experiment,
    prepare_output_dir,
    run_experiment,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--regime",
        choices=sorted(REGIMES),
        default="default",
        help="default: a warm start with mixed prompt groups; hard: most groups all wrong at the start, the hint "
        "still helps; long: 5-8 chained operations (each with its own prompts, gate and output folder)",
    )
    parser.add_argument(
        "--methods",
        default=None,
        help=f"grpo and cpo:<method>[@<cpo key>=<value>...], comma-separated; default {DEFAULT_METHODS} "
        f"(--quick: {QUICK_METHODS})",
    )
    parser.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 1; --full: the regime's)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (default 40; --quick: 3)")
    parser.add_argument("--quick", action="store_true", help="pipeline check: 3 steps, 1 seed, no gate")
    parser.add_argument("--full", action="store_true", help="the regime's full design (the results page's seeds)")
    parser.add_argument("--output-dir", type=Path, default=None, help="default: the regime's folder")
    parser.add_argument("--resume", action="store_true", help="keep finished runs, run the rest")
    parser.add_argument("--overwrite", action="store_true", help="delete the output folder's previous results")
    parser.add_argument("--skip-gate", action="store_true", help="run RL even if the warm start misses its regime")
    parser.add_argument("--run-timeout", type=float, default=1800.0, help="kill one run after this many seconds")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run (key=value), applied last")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.resume and args.overwrite:
            raise ExperimentError("--resume and --overwrite exclude each other.")
        experiment = plan_experiment(
            args.regime,
            methods=args.methods,
            seeds=args.seeds,
            steps=args.steps,
            quick=args.quick,
            full=args.full,
            output_dir=args.output_dir,
            overrides=args.overrides,
            skip_gate=args.skip_gate,
            run_timeout_s=args.run_timeout,
        )
        prepare_output_dir(experiment.output_dir, experiment.plan(), resume=args.resume, overwrite=args.overwrite)
    except ExperimentError as error:
        print(f"[experiment] {error}", file=sys.stderr)
        return 2
    return run_experiment(experiment)


if __name__ == "__main__":
    sys.exit(main())
