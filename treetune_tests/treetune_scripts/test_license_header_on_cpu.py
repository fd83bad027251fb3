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
import subprocess
import sys
from pathlib import Path

from treetune_scripts.check_license_header import has_header, main

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_every_tracked_python_file_has_the_header(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    assert main([]) == 0


def test_file_without_header_is_reported(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text("print('hi')\n")
    assert not has_header(bad)
    assert main([str(bad)]) == 1
    assert "bad.py" in capsys.readouterr().out


def test_shebang_before_header_is_accepted(tmp_path):
    good = tmp_path / "good.py"
    header = (REPO_ROOT / "treetune_verl" / "__init__.py").read_text()
    good.write_text("#!/usr/bin/env python\n" + header)
    assert has_header(good)


def test_cli_exit_code():
    proc = subprocess.run([sys.executable, "-m", "treetune_scripts.check_license_header"], cwd=REPO_ROOT)
    assert proc.returncode == 0
