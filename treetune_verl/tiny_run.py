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
"""A tiny CPU training run, shared by the demo and the end-to-end tests.

- :func:`tiny_run_overrides`: the Hydra overrides that point a run at the tiny assets and an output folder, and on
  verl 0.9.1 give each rollout request the seed of its row (:mod:`treetune_verl.rollout_seeds`). The CPU profile
  itself (device, strategy, rollout ``hf``, Ray resources, sizes) lives in verl-cpu's
  ``verl_cpu/config/platform/cpu.yaml``; only what depends on where assets and outputs are, and on the overlay, is
  added here.
- :func:`launch_training`: runs a Hydra entry point (upstream ``verl.trainer.main_ppo`` by default) as a subprocess
  with a timeout, streams its output, and measures its wall time and peak memory.
"""

from __future__ import annotations

import importlib.util
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from treetune_verl.clean_exit import kill_processes
from treetune_verl.rollout_seeds import SEEDED_AGENT_LOOP
from treetune_verl.version import verl_is

#: Reward of the tiny arithmetic dataset (``data_source="tiny_arith"``).
TINY_REWARD_PATH = "pkg://treetune_verl.utils.reward_score.tiny_arith"
METRICS_FILE = "metrics.jsonl"


def verl_cpu_config_dir() -> Path:
    """verl-cpu's config folder: ``ppo_trainer_cpu.yaml`` and the ``platform`` group (pass it as ``--config-path``).
    Looked up when a CPU run needs it, so that importing this module needs no verl-cpu."""
    return Path(importlib.util.find_spec("verl_cpu.config").submodule_search_locations[0])


def tiny_run_overrides(
    assets_dir: str | Path,
    output_dir: str | Path,
    *,
    total_training_steps: int = 2,
    experiment_name: str = "tiny_cpu",
) -> list[str]:
    """Hydra overrides pointing a run at the tiny assets and writing everything under ``output_dir``.

    Args:
        assets_dir: directory from ``build_tiny_assets()`` (``model/``, ``data/train.parquet``, ``data/val.parquet``).
        output_dir: run directory: metrics go to ``<output_dir>/metrics.jsonl`` (verl's file logger),
            checkpoints to ``<output_dir>/checkpoints``.
        total_training_steps: number of PPO/GRPO steps.
        experiment_name: ``trainer.experiment_name``.

    Returns:
        ``key=value`` strings for ``python -m verl.trainer.main_ppo`` (or any entry point using the same config). On
        verl 0.9.1 they select the seeded agent loop, so that each row of a rollout batch draws its own response
        whatever order the requests reach the server in (0.7.1 sends no row).
    """
    assets_dir, output_dir = Path(assets_dir).resolve(), Path(output_dir).resolve()
    seeded_rows = (
        [] if verl_is("0.7.1") else [f"actor_rollout_ref.rollout.agent.default_agent_loop={SEEDED_AGENT_LOOP}"]
    )
    return [
        *seeded_rows,
        f"actor_rollout_ref.model.path={assets_dir / 'model'}",
        f"data.train_files={assets_dir / 'data' / 'train.parquet'}",
        f"data.val_files={assets_dir / 'data' / 'val.parquet'}",
        f"reward.custom_reward_function.path={TINY_REWARD_PATH}",
        "reward.custom_reward_function.name=compute_score",
        f"trainer.total_training_steps={total_training_steps}",
        "trainer.project_name=treetune_cpu",
        f"trainer.experiment_name={experiment_name}",
        "trainer.logger=[console,file]",
        f"trainer.default_local_dir={output_dir / 'checkpoints'}",
        f"++ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={output_dir / METRICS_FILE}",
    ]


@dataclass
class TrainingRun:
    """Outcome of :func:`launch_training`.

    Attributes:
        returncode: exit status of the training process (negative: killed by that signal).
        wall_s: wall-clock seconds from launch to exit.
        peak_rss_bytes: highest sum of resident memory over the training process and all its descendants (Ray
            processes included), sampled every ``sample_s``; over-counts pages shared between processes.
        timed_out: True when the run was killed for exceeding its timeout.
        log_path: file holding the full combined stdout/stderr.
    """

    returncode: int
    wall_s: float
    peak_rss_bytes: int
    timed_out: bool
    log_path: Path


#: Seconds the processes a run started may outlive it before :func:`launch_training` ends them.
LEFTOVER_GRACE_S = 10.0


def tree_rss(root, seen: dict | None = None) -> int:
    """Resident memory of the psutil process ``root`` and its descendants, summed; adds each descendant to ``seen``
    (keyed by pid and start) when given."""
    import psutil

    total = 0
    try:
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    for process in processes:
        try:
            total += process.memory_info().rss
            if process is not root and seen is not None:
                seen.setdefault((process.pid, process.create_time()), process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def _end_leftovers(seen: dict, log) -> None:
    """End the processes of a finished run that outlive it by :data:`LEFTOVER_GRACE_S` (e.g. a Ray worker that missed
    its cluster's shutdown and keeps a core busy), and say so in its log. psutil refuses a pid reused since."""
    import psutil

    _, alive = psutil.wait_procs(list(seen.values()), timeout=LEFTOVER_GRACE_S)
    names = kill_processes(alive)
    if names:
        log.write(
            f"\n[launch_training] ended {len(names)} process(es) of the run still alive {LEFTOVER_GRACE_S:.0f} s "
            f"after it exited: {', '.join(sorted(names))}\n"
        )


def _kill_tree(root) -> None:
    import psutil

    try:
        processes = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    kill_processes(processes, wait_s=10)


def launch_training(
    overrides: list[str],
    log_path: str | Path,
    *,
    entry_module: str = "verl.trainer.main_ppo",
    config_dir: str | Path | None = None,
    config_name: str = "ppo_trainer_cpu",
    timeout_s: float | None = None,
    env: dict[str, str] | None = None,
    echo: Callable[[str], None] | None = None,
    cwd: str | Path | None = None,
    sample_s: float = 0.5,
    append_log: bool = False,
) -> TrainingRun:
    """Run ``python -m <entry_module> --config-path <config_dir> --config-name <config_name> <overrides>``.

    Output is written to ``log_path`` and, line by line, passed to ``echo``. On timeout the process and all its
    descendants (the Ray cluster it started) are killed; after any exit, the processes it started that outlive it by
    :data:`LEFTOVER_GRACE_S` are ended, with a line in the log. The run starts its own Ray instance
    (``RAY_ADDRESS=local``) unless ``env`` names a cluster: a plain ``ray.init()`` would otherwise join whatever
    cluster ``RAY_ADDRESS`` or the machine's last ``ray start`` points to, and then refuse the run's ``ray_init``
    resources.

    Args:
        overrides: Hydra overrides.
        log_path: where to write the combined stdout/stderr.
        entry_module: module run with ``python -m`` (a Hydra main).
        config_dir: ``--config-path`` (absolute; default :func:`verl_cpu_config_dir`).
        config_name: ``--config-name``.
        timeout_s: kill the run after this many seconds (None: no limit).
        env: extra environment variables (``RAY_ADDRESS`` here attaches the run to that cluster).
        echo: called with each output line (without newline), e.g. ``print``.
        cwd: working directory (Hydra writes its ``outputs/`` folder there unless ``hydra.run.dir`` is set).
        sample_s: memory sampling period.
        append_log: add to ``log_path`` after a header line (a resumed run keeps the earlier runs' lines) instead
            of starting it anew.
    """
    import psutil

    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        entry_module,
        "--config-path",
        str(Path(config_dir or verl_cpu_config_dir()).resolve()),
    ]
    command += ["--config-name", config_name, *overrides]
    process_env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_ADDRESS": "local", **(env or {})}
    start = time.monotonic()
    peak = 0
    timed_out = False
    with open(log_path, "a" if append_log else "w") as log:
        if append_log:
            log.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} python -m {entry_module} {' '.join(overrides)}\n")
            log.flush()
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=process_env, cwd=cwd
        )
        root = psutil.Process(process.pid)
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            for line in process.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        last_sample = 0.0
        finished_output = False
        exited_at = None
        seen: dict = {}
        try:
            while True:
                try:
                    line = lines.get(timeout=sample_s)
                except queue.Empty:
                    line = ""
                if line is None:
                    finished_output = True
                elif line:
                    log.write(line)
                    if echo is not None:
                        echo(line.rstrip("\n"))
                now = time.monotonic()
                if now - last_sample >= sample_s:
                    peak = max(peak, tree_rss(root, seen))
                    last_sample = now
                if exited_at is None and process.poll() is not None:
                    exited_at = now
                # A process the run left behind (Ray's) may hold the output pipe open: once the run itself exited,
                # its output gets LEFTOVER_GRACE_S more seconds to end.
                if exited_at is not None and (finished_output or now - exited_at > LEFTOVER_GRACE_S):
                    break
                if timeout_s is not None and now - start > timeout_s:
                    timed_out = True
                    _kill_tree(root)
                    process.wait()
                    log.write(f"\n[launch_training] killed after {timeout_s:.0f} s timeout\n")
                    break
        except BaseException:  # interrupted (Ctrl-C, a test's time-out): the run must not train on unattended
            _kill_tree(root)
            process.wait()
            raise
        _end_leftovers(seen, log)
    return TrainingRun(
        returncode=process.returncode,
        wall_s=time.monotonic() - start,
        peak_rss_bytes=peak,
        timed_out=timed_out,
        log_path=log_path,
    )
