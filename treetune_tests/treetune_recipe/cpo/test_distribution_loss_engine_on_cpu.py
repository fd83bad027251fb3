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
"""The distribution-level methods' loss (``opsd``, ``sdpo``) in a real actor update of verl's FSDP engine, in this
process on the context-sensitive tiny model, against the same loss written out in fp32 from transformers logits
(``treetune_tests/support/distribution_harness.py``, shared with the GPU twin ``test_distribution_loss_engine.py``; the
loss alone under autocast: ``treetune_tests/support/distribution_device_loss.py``).

Each case runs one update micro-batch of 8 rows with ``cpo_ppo_loss`` installed and ``distillation_use_topk=True``,
at temperature 1.1; the teacher is the same model under the hint prompt (its log-probs depend on that context), the
ids its own top-k (OPSD: k = 5 and every output row) or the student's (SDPO: k = 5 and 100, three rows without a
context, ``old_log_probs`` that make the importance weight 1, clipped at 2 or 0.61). Checked: the engine's
``actor/distill_loss``, grad norm, and the means of ℓ and w over the kept tokens; the PG term 0. Controls (each must
fail the same assertion): the student read one position early, the ids one position late, the plain-prompt teacher,
the context mask ignored, every response token as the denominator, SDPO's weight unclipped or left out.

verl-cpu's engine computes in fp32 on CPU (the ``platform=cpu`` profile), so the tolerance is tight; the GPU twin runs
the same checks with the engine in bf16 on CUDA.
"""

import pytest

from treetune_tests.support import distribution_harness as checks
from treetune_tests.support.distribution_device_loss import check_losses_on_device
from treetune_verl.tiny_assets import CONTEXT_SENSITIVE, build_tiny_assets
from treetune_verl.version import installed_verl_version

pytestmark = pytest.mark.skipif(
    not installed_verl_version().startswith("0.9."), reason="the student-logits hook is verl 0.9.x only"
)


@pytest.fixture(scope="module")
def engine():
    with checks.distribution_engine(build_tiny_assets(config=CONTEXT_SENSITIVE)) as state:
        yield state


@pytest.mark.parametrize("case", sorted(checks.CASES))
def test_distill_loss_of_an_engine_update_matches_fp32_transformers(engine, case):
    measured = checks.check_engine_update(engine, case, checks.FP32_UPDATE)
    print(f"\n{case}: {measured}")


@pytest.mark.parametrize("method", ["opsd", "sdpo"])
def test_loss_on_random_logits_under_bf16_autocast_matches_fp32(engine, method):
    """The GPU twin's device check, here on CPU autocast: keeps the shared helper exercised."""
    measured = check_losses_on_device(engine["actor_config"], method, "cpu")
    print(f"\n{method}: {measured}")
