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
"""CPU twin of the GPU tier's engine tests (``test_cpo_engine.py``): the CPO loss and the hinted log-prob pass through
verl's FSDP engine in this process, against fp32 transformers. On CPU the engine still computes under bf16
autocast, so the tolerances are the same as on CUDA.
"""

import importlib.util
from pathlib import Path

import pytest

from treetune_scripts.make_tiny_assets import build_tiny_assets


def _load_engine_checks():
    path = Path(__file__).with_name("engine_harness.py")
    spec = importlib.util.spec_from_file_location("cpo_engine_harness", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


checks = _load_engine_checks()


@pytest.fixture(scope="module")
def engine():
    with checks.engine_fixture(build_tiny_assets()) as harness:
        yield harness


def test_cpo_update_through_the_engine_matches_fp32_transformers(engine):
    checks.check_cpo_update(engine)


def test_hinted_log_probs_through_the_engine_match_fp32_transformers(engine):
    checks.check_hinted_log_probs(engine)
