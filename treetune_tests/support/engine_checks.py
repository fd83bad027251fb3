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
"""The engine checks the CPU twin (``treetune_tests/treetune_recipe/cpo/test_cpo_engine_on_cpu.py``) and the GPU tier
(``test_cpo_engine.py``) run alike: verl's engine workers (:mod:`treetune_tests.support.engine_harness`) against fp32
transformers (:mod:`treetune_tests.support.fp32_reference`), each with its corrupted-forward controls.

The checks need a model whose outputs depend on their context (``treetune_verl.tiny_assets.CONTEXT_SENSITIVE``):
:func:`check_context_sensitive` asserts it, because on a near-uniform model every token gets the same log-prob under any
mask or position and no comparison can fail.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from verl import DataProto

from treetune_recipe.cpo.methods.loss import cpo_ppo_loss
from treetune_tests.support.engine_harness import (
    actor_worker,
    as_nested,
    engine_format,
    engine_log_probs,
    engine_update,
    recorded_model_inputs,
)
from treetune_tests.support.fp32_reference import (
    CORRUPTIONS,
    SCORE_MEAN_TOL,
    assert_fails_on_corruptions,
    assert_scores_match,
    reference_outputs,
    rollout_batch,
)

#: The update check: the engine's loss within 3e-2 and its grad norm within 5 % of fp32 transformers + cpo_ppo_loss
#: (see :data:`treetune_tests.support.fp32_reference.SCORE_MAX_TOL` for what a corrupted forward moves).
LOSS_ATOL, GRAD_NORM_RTOL = 3e-2, 5e-2


def check_context_sensitive(model_path: Path, tokenizer) -> dict:
    """The model's outputs depend on their context: low entropy, and each corruption moves log-probs by nats."""
    batch = rollout_batch(model_path, tokenizer, seed=3)
    mask = batch.batch["response_mask"].bool()
    log_probs, entropy, _ = reference_outputs(model_path, batch)
    stats = {"entropy": entropy[mask].mean().item()}
    for corruption in CORRUPTIONS:
        corrupted, _, _ = reference_outputs(model_path, batch, corruption=corruption)
        stats[corruption] = (corrupted - log_probs)[mask].abs().mean().item()
    assert stats["entropy"] < 4.0, stats  # log(vocab) is about 6.9
    # Each corruption moves log-probs by many times the mean tolerance (measured with head_dim 32: response-only mask
    # 9.2, shift 10.0, dropped prompt token 0.86 nats per token on average).
    assert all(stats[c] > 5 * SCORE_MEAN_TOL for c in CORRUPTIONS), stats
    return stats


def check_log_probs(engine: dict, role: str) -> None:
    """The old-log-prob pass (``role="actor"``) or the ref pass (``"ref"``) equals fp32 transformers, per token.

    Covers left-padded prompts and responses of different lengths, in several micro-batches.
    """
    batch = rollout_batch(engine["model_path"], engine["tokenizer"], seed=1)
    with recorded_model_inputs(engine[role].engine) as calls:
        got, got_entropy = engine_log_probs(engine[role], batch)
    assert len(calls) > 1, "the batch should span several micro-batches"
    expected, expected_entropy, _ = reference_outputs(engine["model_path"], batch)
    mask = batch.batch["response_mask"]
    assert_scores_match(got, expected, f"{role} log-probs", mask)
    assert_scores_match(got_entropy, expected_entropy, f"{role} entropy", mask)
    assert_fails_on_corruptions(got, engine["model_path"], batch, f"{role} log-probs")


#: Bound on the mean signed per-token difference between the engine's and fp32 transformers' log-probs. bf16 noise
#: is zero-mean; normalising over a padded output layer's extra rows shifts every token by -log(1 - padding mass)
#: (0.02-0.03 on the context-sensitive model's 640 rows for 630 tokens).
VOCABULARY_OFFSET_TOL = 0.01


def mean_signed_offset(got: torch.Tensor, expected: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (got - expected)[mask.bool()].mean()


def check_vocabulary_support(engine: dict) -> None:
    """The actor's log-probs are normalised over the tokenizer's ids, as verl's vLLM rollout samples them.

    Control: the model has padding rows with mass on them, so the same assertion against log-probs normalised over
    every row (an unpatched trainer) must fail.
    """
    batch = rollout_batch(engine["model_path"], engine["tokenizer"], seed=2)
    mask = batch.batch["response_mask"]
    assert len(engine["tokenizer"]) < _output_rows(engine["model_path"]), "the test model needs padding rows"
    got, _ = engine_log_probs(engine["actor"], batch, calculate_entropy=False)
    expected, _, _ = reference_outputs(engine["model_path"], batch)
    full, _, _ = reference_outputs(engine["model_path"], batch, full_vocabulary=True)
    offset = mean_signed_offset(got, expected, mask)
    torch.testing.assert_close(offset, torch.zeros(()), atol=VOCABULARY_OFFSET_TOL, rtol=0)
    with pytest.raises(AssertionError):
        offset = mean_signed_offset(got, full, mask)
        torch.testing.assert_close(offset, torch.zeros(()), atol=VOCABULARY_OFFSET_TOL, rtol=0)


def _output_rows(model_path) -> int:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_path).vocab_size


def check_hinted_log_probs(engine: dict) -> None:
    """The hint batch of :func:`rollout_batch` scored by the engine equals fp32 transformers on the same tokens."""
    from treetune_recipe.cpo.teacher.hint import build_hint_batch

    batch = rollout_batch(engine["model_path"], engine["tokenizer"], seed=2)
    hint, metrics = build_hint_batch(batch, engine["tokenizer"], engine["hint_config"])
    assert metrics["cpo/hint_missing_frac"] == 0
    assert hint.batch["prompts"].shape[1] > batch.batch["prompts"].shape[1]  # the hint prompt is really longer
    got, _ = engine_log_probs(engine["actor"], hint, calculate_entropy=False)
    expected, _, _ = reference_outputs(engine["model_path"], hint)
    mask = hint.batch["response_mask"]
    assert_scores_match(got, expected, "hinted log-probs", mask)
    assert_fails_on_corruptions(got, engine["model_path"], hint, "hinted log-probs")
    # and the hint matters: the same tokens under the plain prompt score differently
    plain, _, _ = reference_outputs(engine["model_path"], batch)
    with pytest.raises(AssertionError):
        assert_scores_match(got, plain, "hinted vs plain", mask)


def _expected_update(engine: dict, batch: DataProto, corruption: str | None = None) -> tuple[float, float]:
    """``(loss, grad_norm)`` of one CPO update computed with fp32 transformers (optionally a corrupted forward)."""
    log_probs, entropy, model = reference_outputs(engine["model_path"], batch, with_grad=True, corruption=corruption)
    data = engine_format(batch, engine["actor_config"])
    model_output = {"log_probs": as_nested(log_probs, batch, data), "entropy": as_nested(entropy, batch, data)}
    loss, _ = cpo_ppo_loss(engine["actor_config"], model_output, data, cpo=engine["cpo"])
    loss.backward()
    grad_norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]))
    return loss.item(), grad_norm.item()


def _update_matches(got: tuple[float, float], expected: tuple[float, float]) -> bool:
    (loss, grad_norm), (expected_loss, expected_grad_norm) = got, expected
    return abs(loss - expected_loss) < LOSS_ATOL and abs(grad_norm - expected_grad_norm) < (
        GRAD_NORM_RTOL * expected_grad_norm
    )


def check_cpo_update(engine: dict) -> None:
    """One actor update with the CPO loss: the engine's loss and grad norm equal fp32 transformers + cpo_ppo_loss.

    The old, ref and hinted log-probs fed to the loss are fp32 references (the ref and hint perturbed), so the engine's
    ratio is about 1 only if its own forward is right; a corrupted forward moves the loss and the gradient.
    """
    batch = rollout_batch(engine["model_path"], engine["tokenizer"], seed=4)
    old, _, _ = reference_outputs(engine["model_path"], batch)
    gen = torch.Generator().manual_seed(2)
    mask = batch.batch["response_mask"].float()
    batch.batch["old_log_probs"] = old
    batch.batch["ref_log_prob"] = old + 0.05 * torch.randn(old.shape, generator=gen) * mask
    batch.batch["teacher_log_probs"] = (old + torch.randn(old.shape, generator=gen)).clamp(max=0) * mask

    expected = _expected_update(engine, batch)
    actor, _ = actor_worker(engine["config"], engine["cpo"])  # a fresh actor: the update changes its weights
    with recorded_model_inputs(actor.engine) as calls:
        metrics = engine_update(actor, batch)
    assert len(calls) > 1, "the update should span several micro-batches"
    got = (float(np.sum(metrics["loss"])), float(np.mean(metrics["grad_norm"])))
    assert _update_matches(got, expected), (got, expected, metrics)
    assert abs(expected[0]) > 10 * LOSS_ATOL or expected[1] > 0  # a non-trivial update
    for corruption in CORRUPTIONS:
        corrupted = _expected_update(engine, batch, corruption=corruption)
        assert not _update_matches(got, corrupted), (corruption, got, corrupted)
