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
"""math-verify with a hard time limit and a memory cap, callable from any thread.

math-verify's own timeouts use ``signal.alarm``, which fails outside the main thread, and verl 0.7.1's reward loop
calls a synchronous reward function from executor threads. So the grader switches math-verify's timeouts off and:

* in the main thread (offline evaluation, the benchmark, unit tests) runs ``parse`` + ``verify`` in-process under
  :func:`.time_limit.call_with_time_limit` (``SIGALRM``, which also stops big-integer loops);
* in any other thread hands the pair to a small pool of helper processes (``python -m`` this module). Each helper
  runs the same in-process code in *its* main thread under an address-space limit, and the caller waits at most the
  time limit plus a short grace; a helper that does not answer in time is killed and replaced. A pathological
  answer (``2^{2^{40}}``) therefore costs one helper, never the trainer's memory or time.

Helpers speak one JSON object per line over stdin/stdout and exit when their stdin closes.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from treetune_verl.utils.reward_score.time_limit import call_with_time_limit, signal_timer_available

logger = logging.getLogger(__name__)

# Answers longer than this (or with unbalanced braces) are not handed to math-verify: slow to parse, rarely meaningful.
MAX_MATH_VERIFY_CHARS = 1000
MAX_HELPER_PROCESSES = min(4, os.cpu_count() or 1)
HELPER_MEMORY_LIMIT_BYTES = 4 * 1024**3
HELPER_STARTUP_TIMEOUT_S = 120.0
HELPER_GRACE_S = 2.0


@dataclass(frozen=True)
class MathVerifyVerdict:
    """math-verify's verdict on one pair.

    Attributes:
        equal: math-verify judged the answers equivalent (False on a timeout or a failure).
        timed_out: the time limit stopped the work (or a helper died or went silent).
        parse_failed: one side did not parse into a math object, was too long, or math-verify is missing.
    """

    equal: bool
    timed_out: bool
    parse_failed: bool


_FAILED = MathVerifyVerdict(equal=False, timed_out=False, parse_failed=True)
_TIMED_OUT = MathVerifyVerdict(equal=False, timed_out=True, parse_failed=False)

_math_verify_module = None
_math_verify_missing = False
_import_lock = threading.Lock()


class _DropDisabledTimeoutWarning(logging.Filter):
    """math-verify warns once that its timeouts are off; here they are off on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


def load_math_verify():
    """Imports math-verify once; returns ``None`` (after one warning) when it is not installed."""
    global _math_verify_module, _math_verify_missing
    with _import_lock:
        if _math_verify_module is None and not _math_verify_missing:
            try:
                import math_verify
            except ImportError:
                _math_verify_missing = True
                logger.warning(
                    "math-verify is not installed: math answers are compared by the string rule only. "
                    "Install it with `pip install 'treetune-verl[math]'`."
                )
            else:
                for logger_name in ("math_verify.parser", "math_verify.grader"):
                    logging.getLogger(logger_name).addFilter(_DropDisabledTimeoutWarning())
                _math_verify_module = math_verify
        return _math_verify_module


def _parse_and_verify(math_verify, prediction: str, ground_truth: str) -> tuple[bool, bool]:
    from sympy import Basic, MatrixBase

    gold = math_verify.parse("\\boxed{" + ground_truth + "}", parsing_timeout=None)
    target = math_verify.parse("\\boxed{" + prediction + "}", parsing_timeout=None)
    parsed_both = all(any(isinstance(item, Basic | MatrixBase) for item in side) for side in (gold, target))
    return bool(math_verify.verify(gold, target, timeout_seconds=None)), not parsed_both


def verify_in_main_thread(prediction: str, ground_truth: str, timeout_s: float | None) -> MathVerifyVerdict:
    """Runs math-verify in this process under a ``SIGALRM`` limit (main thread only)."""
    math_verify = load_math_verify()
    if math_verify is None:
        return _FAILED
    try:
        outcome = call_with_time_limit(lambda: _parse_and_verify(math_verify, prediction, ground_truth), timeout_s)
    except Exception:  # math-verify catches its own errors; this is a last line of defence (e.g. MemoryError)
        logger.debug("math-verify failed on %r vs %r", prediction[:200], ground_truth[:200], exc_info=True)
        return _FAILED
    if outcome.timed_out:
        return _TIMED_OUT
    equal, parse_failed = outcome.value
    return MathVerifyVerdict(equal=equal, timed_out=False, parse_failed=parse_failed)


class _Helper:
    """One helper process and its line-based pipe."""

    def __init__(self):
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__, str(HELPER_MEMORY_LIMIT_BYTES)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._buffer = b""
        if self.read_line(HELPER_STARTUP_TIMEOUT_S) != {"ready": True}:
            self.kill()
            raise RuntimeError("the math-verify helper process did not start; see its messages on stderr.")

    def read_line(self, timeout_s: float) -> dict | None:
        """The next JSON line, or ``None`` when none arrives in ``timeout_s`` or the helper exited."""
        deadline = time.monotonic() + timeout_s
        descriptor = self.process.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([descriptor], [], [], remaining)[0]:
                return None
            chunk = os.read(descriptor, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def ask(self, prediction: str, ground_truth: str, timeout_s: float) -> MathVerifyVerdict | None:
        request = {"prediction": prediction, "ground_truth": ground_truth, "timeout_s": timeout_s}
        try:
            self.process.stdin.write((json.dumps(request) + "\n").encode())
            self.process.stdin.flush()
        except OSError:
            return None
        reply = self.read_line(timeout_s + HELPER_GRACE_S)
        return MathVerifyVerdict(**reply) if reply is not None else None

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


class _HelperPool:
    """At most ``MAX_HELPER_PROCESSES`` helpers, started on demand and shared by all threads."""

    def __init__(self):
        self._idle: list[_Helper] = []
        self._started = 0
        self._condition = threading.Condition()
        atexit.register(self.close)

    def _acquire(self) -> _Helper:
        with self._condition:
            while not self._idle and self._started >= MAX_HELPER_PROCESSES:
                self._condition.wait()
            if self._idle:
                return self._idle.pop()
            self._started += 1
        try:
            return _Helper()
        except Exception:
            self._release(None)
            raise

    def _release(self, helper: _Helper | None) -> None:
        with self._condition:
            if helper is None:
                self._started -= 1
            else:
                self._idle.append(helper)
            self._condition.notify()

    def verify(self, prediction: str, ground_truth: str, timeout_s: float) -> MathVerifyVerdict:
        helper = self._acquire()
        verdict = helper.ask(prediction, ground_truth, timeout_s)
        if verdict is None:  # silent past the deadline, or dead: replace it
            helper.kill()
            self._release(None)
            return _TIMED_OUT
        self._release(helper)
        return verdict

    def close(self) -> None:
        with self._condition:
            helpers, self._idle = self._idle, []
        for helper in helpers:
            helper.kill()


_pool = _HelperPool()


def math_verify_equivalent(prediction: str, ground_truth: str, timeout_s: float | None) -> MathVerifyVerdict:
    """Compares two bare answers with math-verify, from any thread, within ``timeout_s`` (plus a grace outside
    the main thread).

    Args:
        prediction: the extracted answer, e.g. ``"0.5"``.
        ground_truth: the reference answer, e.g. ``"\\frac{1}{2}"``.
        timeout_s: wall-clock limit; ``None``/``<= 0`` means none in the main thread and 60 s elsewhere.

    Returns:
        A :class:`MathVerifyVerdict`; never raises.
    """
    if len(prediction) > MAX_MATH_VERIFY_CHARS or len(ground_truth) > MAX_MATH_VERIFY_CHARS:
        return _FAILED
    if prediction.count("{") != prediction.count("}"):  # a box cut off mid-answer: not LaTeX, and slow to parse
        return _FAILED
    if signal_timer_available():
        return verify_in_main_thread(prediction, ground_truth, timeout_s)
    if load_math_verify() is None:
        return _FAILED
    try:
        return _pool.verify(prediction, ground_truth, timeout_s if timeout_s and timeout_s > 0 else 60.0)
    except Exception:
        logger.warning("math-verify helper failed; the answer is compared by the string rule only.", exc_info=True)
        return _FAILED


def _serve(memory_limit_bytes: int) -> None:
    """Helper process main loop: one JSON request per stdin line, one JSON verdict per stdout line."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not corrupt the protocol
    load_math_verify()
    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    for line in sys.stdin:
        request = json.loads(line)
        verdict = verify_in_main_thread(request["prediction"], request["ground_truth"], request["timeout_s"])
        replies.write(json.dumps(verdict.__dict__) + "\n")
        replies.flush()


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
