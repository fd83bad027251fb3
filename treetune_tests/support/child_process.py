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
"""A Python child process for tests that signal or kill a stand-in for a run."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def start_python(code: str, *args: str, **popen_kwargs) -> subprocess.Popen:
    """A Python child that prints 'ready' once set up (the test waits for that line)."""
    command = [sys.executable, "-c", textwrap.dedent(code), *args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT, **popen_kwargs)
    assert process.stdout.readline().strip() == "ready"
    return process
