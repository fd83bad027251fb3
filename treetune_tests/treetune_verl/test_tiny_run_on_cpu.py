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
"""A tiny run starts its own Ray instance unless its caller names a cluster.

A plain ``ray.init()`` joins the cluster named by ``RAY_ADDRESS`` or, failing that, the last ``ray start`` (or
``ray.cluster_utils.Cluster``) on the machine, and then refuses the run's ``num_cpus``: one other job's cluster on a
shared box fails every tiny run launched meanwhile.
"""

import time

import pytest

from treetune_tests.support.runs import finished_run_log
from treetune_verl.tiny_run import launch_training


@pytest.fixture
def ray_address_printer(tmp_path):
    """A module that prints the ``RAY_ADDRESS`` it was started with; run with ``python -m`` from ``tmp_path``."""
    (tmp_path / "print_ray_address.py").write_text(
        "import os\nprint('RAY_ADDRESS=' + os.environ.get('RAY_ADDRESS', '<unset>'))\n"
    )
    return "print_ray_address"


def _launched_ray_address(module, tmp_path, **kwargs):
    run = launch_training([], tmp_path / "train.log", entry_module=module, cwd=tmp_path, timeout_s=60, **kwargs)
    return finished_run_log(run).strip().removeprefix("RAY_ADDRESS=")


def test_a_tiny_run_ignores_a_cluster_named_in_the_callers_environment(ray_address_printer, tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert _launched_ray_address(ray_address_printer, tmp_path) == "local"


def test_a_tiny_run_joins_the_cluster_its_caller_names(ray_address_printer, tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    address = _launched_ray_address(ray_address_printer, tmp_path, env={"RAY_ADDRESS": "10.0.0.2:6379"})
    assert address == "10.0.0.2:6379"


@pytest.fixture
def orphan_maker(tmp_path):
    """A module that starts a long sleeper in a new session, its output not on the run's pipe (as Ray's raylet starts
    its workers, which write to files), writes the sleeper's pid to ``sleeper.pid`` and exits 2 s later (the sleeper
    is in the process tree long enough to be seen)."""
    (tmp_path / "leave_an_orphan.py").write_text(
        "import subprocess, sys, time\n"
        "sleeper = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True,\n"
        "                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "open('sleeper.pid', 'w').write(str(sleeper.pid))\n"
        "time.sleep(2)\n"
    )
    return "leave_an_orphan"


def test_processes_a_run_leaves_behind_are_ended_after_it_exits(orphan_maker, tmp_path):
    import psutil

    run = launch_training([], tmp_path / "train.log", entry_module=orphan_maker, cwd=tmp_path, timeout_s=60)
    finished_run_log(run)
    sleeper = int((tmp_path / "sleeper.pid").read_text())
    # Gone (or a zombie waiting for its new parent to reap it) within a second of the kill, and the log says so.
    deadline = time.monotonic() + 5
    while psutil.pid_exists(sleeper) and psutil.Process(sleeper).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"pid {sleeper} still {psutil.Process(sleeper).status()}"
        time.sleep(0.1)
    assert "[launch_training] ended 1 process(es) of the run still alive" in run.log_path.read_text()
