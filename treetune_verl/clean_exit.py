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
"""A run's driver ends cleanly, whatever ends it: its ``finally`` blocks run on SIGTERM and SIGINT, and no process it
started outlives it.

- :func:`exit_on_sigterm` (and :class:`RearmSigterm`, which calls it again once Ray has installed its own handler):
  SIGTERM raises :class:`Terminated` and SIGINT ``KeyboardInterrupt`` in the driver's main thread, so ``ray.shutdown()``
  and the run folder's lock release (``treetune_verl.run_folder``) run.
- :func:`shutdown_ray`: ``ray.shutdown()`` that a second signal cannot cut short, then the end of every process the
  driver started that is still alive (:func:`kill_processes`).
"""

from __future__ import annotations

import signal


class Terminated(SystemExit):
    """Raised in the driver's main thread when it receives SIGTERM, so that its clean-up (``finally``) runs."""


def _raise_terminated(signum, frame):
    raise Terminated(128 + signum)


def exit_on_sigterm() -> None:
    """Make SIGTERM raise :class:`Terminated` (exit status 143) in this process, and SIGINT raise KeyboardInterrupt.

    Python's default action, and the failure handler Ray's core worker installs during ``ray.init`` (it prints a
    stack and aborts, status -6), both end the driver without running ``finally`` blocks: ``ray.shutdown()`` and the
    lock release never ran. Call it from the main thread, again after ``ray.init`` (see :class:`RearmSigterm`).

    A process that starts with SIGINT ignored keeps it ignored (Python installs its KeyboardInterrupt handler only
    over the default action): a background job of a non-interactive shell (``nohup python -m ... &`` in a script,
    ``make test &``) does, and its children inherit that. Such a driver would train on through ``kill -INT``, so an
    ignored SIGINT is given back Python's handler (:func:`signal.default_int_handler`); a handler someone installed
    is kept.
    """
    signal.signal(signal.SIGTERM, _raise_terminated)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


class RearmSigterm:
    """Wraps the Ray actor class given to verl's ``run_ppo`` to call :func:`exit_on_sigterm` once Ray is up, and to
    hand the actor the constructor arguments ``args`` (``run_ppo`` itself passes none).

    ``run_ppo`` calls ``ray.init`` and then, in the same main thread, ``task_runner_class.remote()`` (or
    ``.options(...).remote()``): the first moment after Ray installed its own SIGTERM handler.
    """

    # SYNC WARNING: verl/trainer/main_ppo.py:run_ppo (0.9.1 l.57-92, 0.7.1 l.59-98, ray.init then
    # task_runner_class[.options].remote())
    def __init__(self, actor_class, *args):
        self._actor_class, self._args = actor_class, args

    def remote(self):
        exit_on_sigterm()
        return self._actor_class.remote(*self._args)

    def options(self, **options):
        exit_on_sigterm()
        return RearmSigterm(self._actor_class.options(**options), *self._args)


#: Seconds the processes a Ray instance started get to exit after ``ray.shutdown()`` before they are killed (a
#: trainer process left running would go on training and writing into the run folder once its lock is released).
RAY_EXIT_GRACE_S = 2.0


def kill_processes(processes, wait_s: float = 0.0) -> list[str]:
    """SIGKILL each of ``processes`` (``psutil.Process``) still alive, then wait up to ``wait_s`` seconds for them to
    go. psutil refuses a pid reused since the process was listed.

    Returns:
        The names of the processes it killed.
    """
    import psutil

    killed = []
    for process in processes:
        try:
            name = process.name()
            process.kill()
            killed.append(name)
        except psutil.NoSuchProcess:
            pass
    if wait_s > 0:
        psutil.wait_procs(processes, timeout=wait_s)
    return killed


def _is_ray_worker(process) -> bool:
    """A Ray worker process (the trainer, its workers, the servers): Ray titles them ``ray::<what it runs>``."""
    import psutil

    try:
        command = process.cmdline()
    except psutil.Error:
        return False
    return bool(command) and command[0].startswith("ray::")


def shutdown_ray(interrupted: bool = False) -> None:
    """``ray.shutdown()`` that a second SIGINT or SIGTERM cannot cut short (it would leave Ray's processes), then
    the end of every process this driver started that outlived it (a Ray worker has been seen to outlive its run by
    minutes, training on nothing but still holding memory).

    Args:
        interrupted: the run was stopped (a signal, an error): Ray's worker processes this driver started are killed
            first. ``ray.shutdown()`` takes seconds, and until it ends the trainer would go on training and writing
            into the run folder; the kill sweep saw a run finish six more steps after its SIGTERM. Whatever the kill
            cuts is what any kill cuts: the resume trains that step again (see the module docstring).
    """
    import psutil
    import ray

    if not ray.is_initialized():
        return
    started = psutil.Process().children(recursive=True)
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        if interrupted:
            kill_processes([process for process in started if _is_ray_worker(process)], wait_s=RAY_EXIT_GRACE_S)
        ray.shutdown()
        _, alive = psutil.wait_procs(started, timeout=RAY_EXIT_GRACE_S)
        kill_processes(alive)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
