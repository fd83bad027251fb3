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
"""Shared pytest setup: GPU tests are skipped (and reported as skipped) without CUDA; the longest modules run first;
with ``TREETUNE_MODULE_MEMORY=<file>`` each module's peak memory is recorded.

``make test`` hands whole files to two pytest-xdist workers in collection order: starting the longest ones first keeps
one long run from being left alone at the end (longest processing time first). :data:`LONGEST_FIRST` lists the
modules that take minutes, longest first, by their wall time in CI; the order changes nothing but the wall time.

Memory: while a module runs, a thread samples the resident memory of the test process and every process it started
(training runs, Ray, servers; summed, so pages the processes share count more than once) and the memory the whole
machine has in use (total − available: the other worker's module included) every :data:`MEMORY_SAMPLE_S` seconds,
and appends the module's two peaks to the file as one JSON line. ``python -m treetune_scripts.module_memory_table
<file>`` prints the table of the testing guide.
"""

import json
import os
import threading
import time

import pytest
import torch

MEMORY_FILE_ENV = "TREETUNE_MODULE_MEMORY"
MEMORY_SAMPLE_S = 0.5

LONGEST_FIRST = (
    "test_vllm_rollout_e2e_on_cpu.py",
    "test_cpo_cpu_e2e_on_cpu.py",
    "test_cpo_vs_grpo_on_cpu.py",
    "test_verl_cpu_alone_on_cpu.py",
    "test_cpo_interrupted_runs_e2e_on_cpu.py",
    "test_grpo_learns_on_cpu.py",
    "test_distribution_methods_e2e_on_cpu.py",
    "test_rollout_health_e2e_on_cpu.py",
)


def _longest_first(item) -> int:
    name = item.path.name
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_longest_first)  # stable: each module keeps its own order
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="module", autouse=True)
def _record_module_memory(request):
    """With ``TREETUNE_MODULE_MEMORY`` set: the module's peak resident memory, its process tree summed."""
    path = os.environ.get(MEMORY_FILE_ENV)
    if not path:
        yield
        return
    import psutil

    from treetune_verl.tiny_run import tree_rss

    process, peak, machine_peak, done = psutil.Process(), [0], [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], tree_rss(process))
            memory = psutil.virtual_memory()
            machine_peak[0] = max(machine_peak[0], memory.total - memory.available)
            done.wait(MEMORY_SAMPLE_S)

    sampler = threading.Thread(target=sample, daemon=True)
    started = time.time()
    sampler.start()
    yield
    done.set()
    sampler.join()
    record = {
        "module": request.node.nodeid or request.node.name,
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "peak_rss_mib": round(peak[0] / 2**20),
        "machine_used_mib": round(machine_peak[0] / 2**20),
        "start": round(started, 1),
        "end": round(time.time(), 1),
    }
    with open(path, "a") as handle:
        handle.write(json.dumps(record) + "\n")
