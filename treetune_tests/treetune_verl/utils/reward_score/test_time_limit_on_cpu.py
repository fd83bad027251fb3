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
"""Hard time limit of the grader: signals in the main thread, helper processes elsewhere."""

import signal
import threading
import time

import pytest

from treetune_verl.utils.reward_score.math_verify_guard import math_verify_equivalent
from treetune_verl.utils.reward_score.time_limit import call_with_time_limit, signal_timer_available


def _spin_forever():
    while True:
        pass


def test_python_loop_is_interrupted():
    outcome = call_with_time_limit(_spin_forever, 0.2)
    assert outcome.timed_out and outcome.value is None


def test_big_integer_power_is_interrupted():
    # One C-level operation that takes seconds; CPython checks signals inside its big-integer loops.
    outcome = call_with_time_limit(lambda: 3 ** (10**7), 0.2)
    assert outcome.timed_out


def test_fast_call_returns_its_value_and_leaves_no_alarm():
    for _ in range(50):
        outcome = call_with_time_limit(lambda: 41 + 1, 0.001 + 1e-4)
        assert outcome.timed_out or outcome.value == 42
    time.sleep(0.01)  # a late alarm would raise here
    assert signal_timer_available()


def test_own_exceptions_propagate():
    with pytest.raises(ZeroDivisionError):
        call_with_time_limit(lambda: 1 / 0, 1.0)
    assert signal_timer_available()


def test_outside_main_thread_the_signal_timer_is_refused():
    errors = []

    def worker():
        try:
            call_with_time_limit(lambda: None, 1.0)
        except RuntimeError as error:
            errors.append(error)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert len(errors) == 1 and "main thread" in str(errors[0])


def test_math_verify_in_a_worker_thread_uses_a_helper_and_stops_at_the_limit():
    results = {}

    def worker():
        results["equal"] = math_verify_equivalent("x^2+2x+1", "(x+1)^2", 5.0)
        results["tower"] = math_verify_equivalent("2^{2^{2^{2^{10}}}}", "1", 0.5)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(timeout=300)
    assert not thread.is_alive()
    assert results["equal"].equal and not results["equal"].timed_out
    assert results["tower"].timed_out and not results["tower"].equal


def test_math_verify_in_the_main_thread_stops_at_the_limit():
    verdict = math_verify_equivalent("2^{2^{2^{2^{10}}}}", "1", 0.5)
    assert verdict.timed_out and not verdict.equal


def test_an_outer_interval_timer_and_handler_are_restored():
    outer_calls = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: outer_calls.append(signum))
    try:
        signal.setitimer(signal.ITIMER_REAL, 30.0)
        assert call_with_time_limit(_spin_forever, 0.1).timed_out
        outer_left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 25.0 < outer_left <= 30.0
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        assert call_with_time_limit(_spin_forever, 10.0).timed_out  # the earlier, outer deadline stops it
        time.sleep(0.05)
        assert outer_calls == [signal.SIGALRM]  # and the outer handler still runs
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
