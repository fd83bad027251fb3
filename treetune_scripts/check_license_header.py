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
"""Check that every Python file carries the project's Apache-2.0 header.

Usage: ``python -m treetune_scripts.check_license_header [FILE ...]`` (no files: every tracked ``*.py``).
Exit status 1 lists the files without the header.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

COPYRIGHT_LINE = "# Copyright 2026 treetune-verl contributors"
LICENSE_LINE = '# Licensed under the Apache License, Version 2.0 (the "License");'


def has_header(path: Path) -> bool:
    """True when the copyright and license lines open the file (a shebang line may come first)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    if lines and lines[0].startswith("#!"):
        lines = lines[1:]
    return len(lines) >= 3 and lines[0] == COPYRIGHT_LINE and lines[2] == LICENSE_LINE


def tracked_python_files(root: Path) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "*.py"], cwd=root, capture_output=True, text=True, check=True).stdout
    return [root / name for name in out.split()]


def main(argv: list[str]) -> int:
    files = [Path(a) for a in argv] if argv else tracked_python_files(Path.cwd())
    missing = [f for f in files if f.suffix == ".py" and not has_header(f)]
    for f in missing:
        print(f"missing license header: {f}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
