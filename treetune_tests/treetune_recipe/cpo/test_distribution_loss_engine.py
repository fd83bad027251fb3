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
"""GPU tier: the distribution-level methods' loss (``opsd``, ``sdpo``) on CUDA against fp32 on CPU.

- On random logits: ``cpo_ppo_loss``'s logits call and loss call on CUDA under bf16 autocast (as inside the engine,
  bf16 logits) against fp32 on CPU: per-token loss, loss, distill metric, gradient.
- In a real update of verl's FSDP engine on CUDA with bf16 parameters and autocast, on the context-sensitive tiny
  model: the engine's ``actor/distill_loss``, grad norm and the means of ℓ and w against fp32 transformers on CPU.

Each with its controls (``treetune_tests/support/distribution_device_loss.py`` and
``treetune_tests/support/distribution_harness.py``, shared with the CPU twin
``test_distribution_loss_engine_on_cpu.py``). No Ray: the engine worker runs in the test process; without flash-attn,
verl's unpad helpers are swapped for verl's own pure-torch ones, as the CPU tests do.
"""

import pytest
import torch

from treetune_verl.tiny_assets import CONTEXT_SENSITIVE, build_tiny_assets

pytestmark = pytest.mark.gpu
#: The harness's cases (``distribution_harness.CASES``), named here so collection needs no engine import.
CASES = ("opsd-every-id", "opsd-k5", "sdpo-hybrid", "sdpo-k100-clipped-weight", "sdpo-k5-token-mean")


@pytest.fixture(scope="module")
def checks():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    import treetune_verl.verl_runtime  # noqa: F401  (pure-torch pad/unpad where flash-attn is missing, as in a run)
    from treetune_tests.support import distribution_harness

    assert tuple(sorted(distribution_harness.CASES)) == CASES
    return distribution_harness


@pytest.fixture(scope="module")
def engine(checks):
    with checks.distribution_engine(build_tiny_assets(config=CONTEXT_SENSITIVE), *checks.BF16_OVERRIDES) as state:
        from verl.utils.device import get_device_name

        assert get_device_name() == "cuda"  # the engine, its process group and its tensors are on CUDA
        assert state["actor"].engine._autocast_dtype == torch.bfloat16  # bf16 parameters and autocast, not fp32
        yield state


@pytest.mark.parametrize("method", ["opsd", "sdpo"])
def test_loss_on_cuda_under_bf16_autocast_matches_fp32_cpu(checks, method):
    from treetune_tests.support.distribution_device_loss import check_losses_on_device

    actor_config = checks.actor_config_of(build_tiny_assets(config=CONTEXT_SENSITIVE) / "model")
    measured = check_losses_on_device(actor_config, method, "cuda")
    print(f"\n{method}: {measured}")


@pytest.mark.parametrize("case", CASES)
def test_distill_loss_of_a_bf16_cuda_engine_update_matches_fp32_cpu(checks, engine, case):
    measured = checks.check_engine_update(engine, case, checks.BF16_UPDATE)
    print(f"\n{case}: {measured}")
