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
"""A warm-started model for the CPU experiments: a small Qwen3 fine-tuned by verl's own SFT trainer.

The command line of :mod:`treetune_recipe.cpo.experiments.warm_start`: builds (or reuses) the warm start and prints
its folder and measured accuracy: the demo's (default) or the experiment's (``--experiment``), each the shipped
model, hash-checked; ``--rebuild`` runs verl's SFT recipe instead, ``--ship`` copies a rebuild's weights over the
shipped file. Usage::

    python -m treetune_scripts.experiments.warm_start [--experiment] [--force] [--rebuild [--ship]]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from treetune_recipe.cpo.experiments.warm_start import (
    DEFAULT_WARM_START,
    EXPERIMENT_WARM_START,
    build_warm_start,
    read_build_info,
    ship_weights,
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-root", type=Path, default=None, help="default: $TREETUNE_TINY_ASSETS_CACHE or .cache/")
    parser.add_argument("--experiment", action="store_true", help="the experiment's warm start, not the demo's")
    parser.add_argument("--force", action="store_true", help="remake the cached folder even if it exists")
    parser.add_argument("--rebuild", action="store_true", help="run the SFT recipe instead of taking the shipped model")
    parser.add_argument("--ship", action="store_true", help="with --rebuild: copy the build's weights over the shipped")
    args = parser.parse_args(argv)
    if args.ship and not args.rebuild:
        parser.error("--ship needs --rebuild")
    config = EXPERIMENT_WARM_START if args.experiment else DEFAULT_WARM_START
    path = build_warm_start(config, args.cache_root, force=args.force, rebuild=args.rebuild)
    info = read_build_info(path)
    print(path)
    print(json.dumps({k: info.get(k) for k in ("source", "val_acc_plain", "val_acc_hint", "sft_wall_s", "parameters")}))
    if args.ship:
        print(ship_weights(path, config))


if __name__ == "__main__":
    main()
