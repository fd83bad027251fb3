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
"""A hard per-call time limit for the main thread, based on ``SIGALRM``.

math-verify bounds its work with ``signal.alarm`` (whole seconds, raising its own exception that it then catches).
The grader switches those off and uses this module instead, which gives sub-second limits and one exception type
that math-verify and sympy do not catch (:class:`TimeLimitExceeded` derives from ``BaseException``).

Why signals: CPython's big-integer loops (``longobject.c``) call ``PyErr_CheckSignals`` while they run, so an alarm
can stop ``2**(2**40)`` half way, whereas other mechanisms (a watchdog thread raising an asynchronous exception) only
act between bytecodes and wait for the whole multiplication. Signals only work in the main thread; callers in other
threads use the helper processes of :mod:`.math_verify_guard`, which run this code in their own main thread.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class TimeLimitExceeded(BaseException):  # noqa: N818  (a control-flow signal, like KeyboardInterrupt)
    """Raised inside a guarded call when its time limit has passed. Never escapes :func:`call_with_time_limit`."""


@dataclass(frozen=True)
class TimedResult:
    """Outcome of :func:`call_with_time_limit`: ``value`` is ``None`` when ``timed_out``."""

    value: Any
    timed_out: bool


def signal_timer_available() -> bool:
    """True in the main thread of a POSIX process whose ``SIGALRM`` handler can be saved and restored."""
    return (
        hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGALRM) is not None
    )


def call_with_time_limit(fn: Callable[[], Any], seconds: float | None) -> TimedResult:
    """Runs ``fn()`` and interrupts it after ``seconds`` of wall-clock time.

    An interval timer that is already running (pytest-timeout, math-verify, the host program) is respected: the
    limit becomes the earlier of the two deadlines, and afterwards the outer timer and handler are restored with the
    time that is left (an outer deadline that passed meanwhile fires right away).

    Args:
        fn: a callable without arguments. Its own exceptions propagate unchanged.
        seconds: the limit; ``None`` or ``<= 0`` runs ``fn`` without one.

    Returns:
        A :class:`TimedResult`.

    Raises:
        RuntimeError: when a limit is asked for and :func:`signal_timer_available` is False.
    """
    if seconds is None or seconds <= 0:
        return TimedResult(value=fn(), timed_out=False)
    if not signal_timer_available():
        raise RuntimeError(
            "call_with_time_limit needs the main thread; from other threads use "
            "treetune_verl.utils.reward_score.math_verify_guard.math_verify_equivalent."
        )
    armed = [True]

    def raise_if_armed(signum, frame):
        # A late alarm (after fn returned) is ignored, so the exception cannot escape during clean-up.
        if armed[0]:
            raise TimeLimitExceeded()

    started = time.monotonic()
    outer_delay, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    previous_handler = signal.signal(signal.SIGALRM, raise_if_armed)
    try:
        signal.setitimer(signal.ITIMER_REAL, min(seconds, outer_delay) if outer_delay > 0 else seconds)
        value = fn()
        armed[0] = False
        return TimedResult(value=value, timed_out=False)
    except TimeLimitExceeded:
        armed[0] = False
        return TimedResult(value=None, timed_out=True)
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if outer_delay > 0:
            outer_left = outer_delay - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(outer_left, 1e-3), outer_interval)
