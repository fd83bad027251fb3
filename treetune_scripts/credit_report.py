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
"""Token-credit report: one self-contained HTML page from a CPO run's ``cpo.credit_dump`` files.

The command line of :mod:`treetune_recipe.cpo.reports.credit_report` (what the page shows: its module docstring).
Usage::

    python -m treetune_scripts.credit_report <run>/credit_dump report.html [--per-kind 2]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from treetune_recipe.cpo.reports.credit_report import build_report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dump_dir", type=Path, help="the run's cpo.credit_dump.dir (holds step_<N>.json)")
    parser.add_argument("output", type=Path, help="HTML file to write")
    parser.add_argument("--per-kind", type=int, default=2, help="responses of each kind per step (default 2)")
    args = parser.parse_args(argv)
    print(build_report(args.dump_dir, args.output, args.per_kind))


if __name__ == "__main__":
    main()
