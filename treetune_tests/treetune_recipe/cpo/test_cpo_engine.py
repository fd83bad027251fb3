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
"""GPU tier: the old-log-prob, ref and hinted passes and the CPO update through verl's FSDP engine on CUDA (bf16
parameters and autocast, nccl) against fp32 transformers on CPU, on the context-sensitive tiny model, each with its
corrupted-forward controls. No Ray: engine workers in the test process (``treetune_tests/support/engine_harness.py``;
the checks, shared with the CPU twin ``test_cpo_engine_on_cpu.py``: ``treetune_tests/support/engine_checks.py``).

Without flash-attn installed (it comes with ``make install-gpu``), verl's unpad helpers are swapped for verl's own
pure-torch equivalents, as the CPU tests do; the engine itself runs with ``use_remove_padding=false`` and sdpa.
"""

import pytest
import torch

from treetune_verl.tiny_assets import CONTEXT_SENSITIVE, build_tiny_assets

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", params=["fixed_micro_batches", "dynamic_batch_size"])
def engine(request):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    import treetune_verl.verl_runtime  # noqa: F401  (pure-torch pad/unpad where flash-attn is missing, as in a run)
    from treetune_tests.support import engine_checks as checks
    from treetune_tests.support.engine_harness import BATCHING, engine_fixture

    assets = build_tiny_assets(config=CONTEXT_SENSITIVE)
    with engine_fixture(assets, *BATCHING[request.param]) as engine:
        from verl.utils.device import get_device_name

        assert get_device_name() == "cuda"  # the engine, its process group and its tensors are on CUDA
        yield checks, engine


def test_old_log_prob_pass_on_cuda_matches_fp32_cpu(engine):
    checks, state = engine
    checks.check_log_probs(state, "actor")


def test_ref_pass_on_cuda_matches_fp32_cpu(engine):
    checks, state = engine
    checks.check_log_probs(state, "ref")


def test_cpo_update_through_the_cuda_engine_matches_fp32_cpu(engine):
    checks, state = engine
    checks.check_cpo_update(state)


def test_hinted_log_probs_through_the_cuda_engine_match_fp32_cpu(engine):
    checks, state = engine
    checks.check_hinted_log_probs(state)
