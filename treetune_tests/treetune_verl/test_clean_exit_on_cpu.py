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
"""``treetune_verl.clean_exit``: SIGTERM and SIGINT (also inherited as ignored) end a driver through its ``finally``
blocks (subprocesses stand in for runs and are signalled for real)."""

import signal
import subprocess

import pytest

from treetune_tests.support.child_process import start_python
from treetune_verl.clean_exit import exit_on_sigterm

SIGTERM_CHILD = """
    import time
    from treetune_verl.clean_exit import exit_on_sigterm
    exit_on_sigterm()
    try:
        print("ready", flush=True)
        time.sleep(600)
    finally:
        print("cleaned up", flush=True)
"""


def test_row12_sigterm_runs_the_clean_up(tmp_path):
    child = start_python(SIGTERM_CHILD)
    child.send_signal(signal.SIGTERM)
    assert child.stdout.read().strip() == "cleaned up"
    assert child.wait(timeout=30) == 128 + signal.SIGTERM


SIGINT_CHILD = (
    """
    import signal
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # as inherited by a background job (nohup ... &)
"""
    + SIGTERM_CHILD
)


def test_row12_sigint_runs_the_clean_up_when_started_with_sigint_ignored():
    # A background job of a non-interactive shell starts with SIGINT ignored, and children inherit that.
    child = start_python(SIGINT_CHILD, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        child.send_signal(signal.SIGINT)
        output, _ = child.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("SIGINT did not stop a process started with SIGINT ignored")
    finally:
        child.kill()
    assert output.strip() == "cleaned up"
    assert child.returncode == -signal.SIGINT  # KeyboardInterrupt, as in a foreground run


def test_exit_on_sigterm_keeps_a_sigint_handler_someone_installed():
    def custom(signum, frame):
        pass

    previous = {signal.SIGTERM: signal.getsignal(signal.SIGTERM), signal.SIGINT: signal.signal(signal.SIGINT, custom)}
    try:
        exit_on_sigterm()
        assert signal.getsignal(signal.SIGINT) is custom
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
