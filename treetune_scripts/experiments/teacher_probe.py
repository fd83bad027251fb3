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
"""Probe SDPO's teacher prompt on the warm start: does it pull the student towards ending early?

The command line of :mod:`treetune_recipe.cpo.experiments.teacher_probe` (where every number is defined): samples
the student on the hard regime's training prompts, builds the teacher batch of every registered context it can (a
successful sibling, the gold solution, the answer) with the recipe's code, and prints, for the student's plain prompt,
for each context's teacher prompt and for SDPO's wrapper holding the gold solution or an empty text, the probability
of ending early after an intermediate step and what the prompt samples itself. CPU, no Ray; about a minute for 64
prompts (``--regime long``: the long-chain training prompts, with that regime's lengths). Usage::

    python -m treetune_scripts.experiments.teacher_probe [--regime hard|long] [--warm-dir DIR] [--prompts 64]
        [--seed 0] [--samples 8]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from treetune_recipe.cpo.experiments.teacher_probe import DEFAULT_PROMPTS, DEFAULT_SAMPLES, REGIME_LENGTHS, run_probe


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regime", choices=sorted(REGIME_LENGTHS), default="hard", help="whose training prompts")
    parser.add_argument("--warm-dir", type=Path, default=None, help="a warm start folder (default: the shipped one)")
    parser.add_argument("--prompts", type=int, default=DEFAULT_PROMPTS, help="first N training prompts of the regime")
    parser.add_argument("--seed", type=int, default=0, help="torch seed of the student's and the teachers' samples")
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, help="responses sampled per prompt")
    args = parser.parse_args(argv)
    result = run_probe(args.warm_dir, n_prompts=args.prompts, samples=args.samples, seed=args.seed, regime=args.regime)
    print(result.format_table())


if __name__ == "__main__":
    main()
