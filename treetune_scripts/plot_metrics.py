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
"""Plot the metrics of a training run logged by verl's ``file`` logger, and print a short summary table.

The command line of :mod:`treetune_verl.metrics_plot`. Usage::

    python -m treetune_scripts.plot_metrics metrics.jsonl out.png [--keys critic/score/mean actor/pg_loss ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from treetune_verl.metrics_plot import plot_metrics, summarize_metrics


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("jsonl_path", type=Path, help="verl file-logger jsonl")
    parser.add_argument("png_path", type=Path, help="output PNG")
    parser.add_argument("--keys", nargs="+", default=None, help="metrics to plot (default: the main ones + cpo/*)")
    args = parser.parse_args(argv)
    print(summarize_metrics(args.jsonl_path))
    print(plot_metrics(args.jsonl_path, args.png_path, args.keys))


if __name__ == "__main__":
    main()
