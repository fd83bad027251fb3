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
"""``treetune_scripts/module_memory_table.py``: a module's peak beside the largest one that ran at the same time on the
other worker, from records the conftest writes (here a real one, from a pytest run of a module with a child
process)."""

import json
import os
import subprocess
import sys

from treetune_scripts.module_memory_table import beside, table


def record(module, worker, peak, start, end):
    return {"module": module, "worker": worker, "peak_rss_mib": peak, "machine_used_mib": 2 * peak, "start": start,
            "end": end}  # fmt: skip


def test_a_module_is_paired_with_the_largest_overlapping_module_of_the_other_worker():
    records = [
        record("a.py", "gw0", 4096, 0, 100),
        record("b.py", "gw1", 1024, 0, 50),
        record("c.py", "gw1", 8192, 60, 120),
        record("d.py", "gw1", 9999, 100, 130),  # starts when a.py ends: not beside it
        record("e.py", "gw0", 2048, 10, 20),  # the same worker: never beside a.py
    ]
    assert beside(records[0], records)["module"] == "c.py"
    assert beside(records[2], records)["module"] == "a.py"
    rows = table(records)
    assert rows[2].startswith("| d.py | 9.8 |")  # largest peak first
    assert "| a.py | 4.0 | 100 | 8.0 (c.py) | 8.0 |" in rows


def test_the_conftest_records_a_modules_peak_with_its_children(tmp_path):
    module = tmp_path / "test_child_on_cpu.py"
    module.write_text(
        "import subprocess, sys\n"
        "def test_child():\n"
        "    code = 'x = bytearray(300 * 2**20); import time; time.sleep(2)'\n"
        "    subprocess.run([sys.executable, '-c', code], check=True)\n"
    )
    conftest = os.path.join(os.path.dirname(__file__), "..", "conftest.py")
    (tmp_path / "conftest.py").write_text(open(conftest).read())
    records = tmp_path / "memory.jsonl"
    env = {**os.environ, "TREETUNE_MODULE_MEMORY": str(records)}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(module)],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    (line,) = records.read_text().splitlines()
    recorded = json.loads(line)
    assert recorded["module"].endswith("test_child_on_cpu.py")
    assert recorded["peak_rss_mib"] >= 300  # the child's 300 MiB counted
    assert recorded["machine_used_mib"] >= 300
    assert recorded["end"] - recorded["start"] >= 2
