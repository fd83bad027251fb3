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
"""CPU twin of the GPU tier's engine tests (``test_cpo_engine.py``): verl's FSDP engine workers in this process against
fp32 transformers, on a model whose log-probs depend on their context (``CONTEXT_SENSITIVE`` tiny assets).

Covered: the old-log-prob pass and the ref pass (log-probs and entropies), the hinted pass, and one actor update with
the CPO loss (loss and grad norm), each with fixed micro-batches and with dynamic batch size, on left-padded prompts
and responses of mixed lengths. Each check also runs its control: the same assertion against a corrupted forward
(response-only attention mask, one-token shift, dropped prompt token) must fail. On CPU the engine still computes
under bf16 autocast, so the tolerances are the same as on CUDA.
"""

import pytest

from treetune_tests.support import engine_checks as checks
from treetune_tests.support.engine_harness import BATCHING, engine_fixture
from treetune_verl.tiny_assets import CONTEXT_SENSITIVE, build_tiny_assets


@pytest.fixture(scope="module", params=sorted(BATCHING))
def engine(request):
    with engine_fixture(build_tiny_assets(config=CONTEXT_SENSITIVE), *BATCHING[request.param]) as harness:
        yield harness


def test_the_test_model_is_context_sensitive():
    from transformers import AutoTokenizer

    model_path = build_tiny_assets(config=CONTEXT_SENSITIVE) / "model"
    stats = checks.check_context_sensitive(model_path, AutoTokenizer.from_pretrained(model_path))
    print(f"\ncontext sensitivity (mean |Δ log-prob| per corruption, nats): {stats}")


def test_old_log_prob_pass_matches_fp32_transformers(engine):
    checks.check_log_probs(engine, "actor")


def test_log_probs_are_normalised_over_the_tokenizers_ids(engine):
    checks.check_vocabulary_support(engine)


def test_ref_pass_matches_fp32_transformers(engine):
    checks.check_log_probs(engine, "ref")


def test_hinted_log_probs_match_fp32_transformers(engine):
    checks.check_hinted_log_probs(engine)


def test_cpo_update_loss_and_grad_norm_match_fp32_transformers(engine):
    checks.check_cpo_update(engine)
