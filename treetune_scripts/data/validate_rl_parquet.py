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
"""Check parquet files against the RL schema of :mod:`treetune_verl.data.rl_schema` (the validator lives there).

Usage::

    python -m treetune_scripts.data.validate_rl_parquet data/train_math.parquet
    python -m treetune_scripts.data.validate_rl_parquet --no-require-solution data/test_*.parquet

Every problem is printed as ``<file>: <row i, column name>: <what is wrong>``; the exit code is 1 when there is any.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

import pandas as pd

from treetune_verl.data.rl_schema import validate_rl_dataframe
from treetune_verl.utils.reward_score.math_answer import resolve_route


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", help="parquet files to check")
    parser.add_argument(
        "--no-require-solution", action="store_true", help="allow an empty extra_info.solution (validation files)"
    )
    parser.add_argument(
        "--no-require-ability", action="store_true", help="allow rows without ability (validation files)"
    )
    args = parser.parse_args(argv)
    total_problems = 0
    for path in args.files:
        try:
            df = pd.read_parquet(path)
        except Exception as error:
            print(f"{path}: cannot be read as parquet: {error}")
            total_problems += 1
            continue
        problems = validate_rl_dataframe(
            df, require_solution=not args.no_require_solution, require_ability=not args.no_require_ability
        )
        for problem in problems:
            print(f"{path}: {problem}")
        total_problems += len(problems)
        if "data_source" in df.columns:
            sources = Counter(map(str, df["data_source"]))
            routes = ", ".join(f"{name} x{n} -> {resolve_route(name)[0]}" for name, n in sorted(sources.items()))
            print(f"{path}: {len(df)} rows, {len(problems)} problems; reward routes: {routes}")
    return 1 if total_problems else 0


if __name__ == "__main__":
    sys.exit(main())
