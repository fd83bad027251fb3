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
"""verl-cpu taken alone: its own tests pass in processes where nothing of the overlay can be imported.

The package's folder is its own pytest root (its ``pyproject.toml``), so none of the overlay's conftest files load;
``helpers/without_overlay`` on ``PYTHONPATH`` makes every ``treetune_*`` import fail in the test processes and in the
processes they start. This is the only place ``make test`` runs the package's tests: its end-to-end runs included, with
the marker expression of the enclosing run (``-m "not e2e"`` here runs ``-m "not e2e"`` there).
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "treetune_verl" / "verl-cpu"
WITHOUT_OVERLAY = Path(__file__).resolve().parent / "helpers" / "without_overlay"


#: The package's suite with its end-to-end runs took 193 s on a 2-core box.
SUITE_TIMEOUT_S = 1200


def _run(*args: str) -> subprocess.CompletedProcess:
    """Run Python in its own process group; on the time-out the whole group goes (the inner suite's training runs and
    their Ray processes included, which would otherwise train on beside the other tests)."""
    env = {**os.environ, "PYTHONPATH": str(WITHOUT_OVERLAY)}
    env.pop("VERL_USE_EXTERNAL_MODULES", None)
    command = [sys.executable, *args]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=PACKAGE_DIR, env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=SUITE_TIMEOUT_S)
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def test_the_overlay_is_hidden_but_verl_and_verl_cpu_import():
    probe = _run("-c", "import verl, verl_cpu.activate\nimport treetune_verl")
    assert probe.returncode != 0 and "No module named 'treetune_verl' (the overlay is hidden)" in probe.stderr


@pytest.mark.timeout(SUITE_TIMEOUT_S + 60)
def test_the_package_tests_pass_without_the_overlay(request):
    markers = request.config.option.markexpr
    selection = ["-m", markers] if markers else []
    run = _run("-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=5", *selection, "tests")
    print(run.stdout[-2500:])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and " failed" not in run.stdout
