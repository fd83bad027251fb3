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
"""Build (or find in the cache) the tiny assets of the CPU tests and demo and print their folder.

The builder is the library module :mod:`treetune_verl.tiny_assets`.

    python -m treetune_scripts.make_tiny_assets [--cache-root DIR] [--force]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from treetune_verl.tiny_assets import build_tiny_assets


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-root", type=Path, default=None, help="default: $TREETUNE_TINY_ASSETS_CACHE or .cache/")
    parser.add_argument("--force", action="store_true", help="rebuild even if the cached assets exist")
    args = parser.parse_args(argv)
    print(build_tiny_assets(args.cache_root, force=args.force))


if __name__ == "__main__":
    main()
