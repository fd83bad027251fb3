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
"""SDPG (``treetune_recipe.cpo.methods.sdpg``): its terms against independent computations.

The distillation KL against ``torch.nn.functional.kl_div``, the four reference modes against verl's own KL estimators
and their derived gradients, the β schedule against the paper's closed form, the gating, and the declaration the
trainer reads. Each check has a control that must fail it.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from verl.trainer.ppo.core_algos import kl_penalty_forward

from treetune_recipe.cpo.config import CPOConfig
from treetune_recipe.cpo.methods.registry import get_method
from treetune_recipe.cpo.methods.sdpg import (
    KL_CAP,
    SDPGKnobs,
    beta_schedule,
    positive_advantages,
    reference_penalty,
    sdpg_kl,
)


def log_distributions(seed: int, tokens: int = 7, vocab: int = 11, scale: float = 2.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.log_softmax(scale * torch.randn(tokens, vocab, generator=generator, dtype=torch.float64), dim=-1)


def test_the_distillation_term_is_the_students_kl_to_the_teacher_over_the_vocabulary():
    student, teacher = log_distributions(0), log_distributions(1)
    # KL(S ‖ T) = F.kl_div(input=T, target=S, log_target=True) summed over the vocabulary.
    expected = F.kl_div(teacher, student, log_target=True, reduction="none").sum(-1)
    torch.testing.assert_close(sdpg_kl(student, teacher, SDPGKnobs()), expected)
    reverse = F.kl_div(student, teacher, log_target=True, reduction="none").sum(-1)
    with pytest.raises(AssertionError):  # control: the other direction
        torch.testing.assert_close(sdpg_kl(student, teacher, SDPGKnobs()), reverse)


def test_a_token_above_the_cap_contributes_the_cap_and_no_gradient():
    logits = torch.tensor([[12.0, 0.0, 0.0], [0.5, 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    teacher = torch.log_softmax(torch.tensor([[-30.0, 0.0, 0.0], [0.0, 0.5, 0.0]], dtype=torch.float64), dim=-1)
    kl = sdpg_kl(torch.log_softmax(logits, dim=-1), teacher, SDPGKnobs())
    assert kl[0].item() == KL_CAP and kl[1].item() < KL_CAP
    kl.sum().backward()
    assert torch.all(logits.grad[0] == 0) and torch.any(logits.grad[1] != 0)


@pytest.mark.parametrize("mode", ["urkl", "ufkl"])
def test_the_unnormalised_modes_are_verls_k2_and_k3_estimators(mode):
    """urkl = verl's ``mse`` (k2) = logw²/2; ufkl = verl's ``low_var_kl`` (k3) + 1 = π_ref/π + logw, where k3 is not
    clamped (|k3| < 10)."""
    log_probs = torch.log(torch.tensor([0.3, 0.05, 0.9, 0.6], dtype=torch.float64))
    ref = torch.log(torch.tensor([0.2, 0.4, 0.85, 0.6], dtype=torch.float64))
    estimator, offset = {"urkl": ("mse", 0.0), "ufkl": ("low_var_kl", 1.0)}[mode]
    expected = kl_penalty_forward(log_probs, ref, estimator) + offset
    got = reference_penalty(log_probs - ref, SDPGKnobs(kl_mode=mode))
    torch.testing.assert_close(got, expected)
    other = {"urkl": "ufkl", "ufkl": "urkl"}[mode]
    with pytest.raises(AssertionError):  # control: the other mode
        torch.testing.assert_close(reference_penalty(log_probs - ref, SDPGKnobs(kl_mode=other)), expected)


@pytest.mark.parametrize(
    ("mode", "gradient"),
    [
        ("fkl", lambda w: -torch.exp(-w)),
        ("rkl", lambda w: w + 1),
        ("ufkl", lambda w: 1 - torch.exp(-w)),
        ("urkl", lambda w: w),
    ],
)
def test_each_reference_mode_has_the_gradient_of_its_kl(mode, gradient):
    """d penalty / d log π (the paper's §3.4 surrogates): fkl -π_ref/π, rkl logw + 1, ufkl 1 - π_ref/π, urkl logw."""
    log_ratio = torch.tensor([-1.5, -0.2, 0.0, 0.7, 2.0], dtype=torch.float64, requires_grad=True)
    reference_penalty(log_ratio, SDPGKnobs(kl_mode=mode)).sum().backward()
    torch.testing.assert_close(log_ratio.grad, gradient(log_ratio.detach()))


def test_the_beta_schedule_is_the_papers_closed_form():
    """β_t = β·min(1, t/W)·min(1, (T - t)/D), the paper's §3.5.2, with its W = 50, D = 350, T = 400."""
    knobs = SDPGKnobs(beta=1e-3, beta_warmup_steps=50, beta_decay_steps=350)
    for step in (1, 25, 49, 50, 51, 200, 399, 400):
        expected = 1e-3 * min(1.0, step / 50) * min(1.0, (400 - step) / 350)
        got, metrics = beta_schedule(knobs, step, 400)
        assert math.isclose(got.beta, expected, rel_tol=1e-12) and metrics == {"cpo/sdpg_beta": got.beta}
    # The script's default: no schedule, β constant; control: the paper's schedule moves it.
    assert {beta_schedule(SDPGKnobs(), step, 400)[0].beta for step in (1, 200, 400)} == {1e-3}
    assert beta_schedule(knobs, 200, 400)[0].beta != 1e-3


def test_the_gate_keeps_the_responses_with_a_positive_advantage():
    advantages = torch.tensor([[0.5, 0.5], [0.0, 0.0], [-0.3, -0.3]])
    gated = positive_advantages(advantages, SDPGKnobs(positive_advantage_only=True))
    torch.testing.assert_close(gated, torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]))
    torch.testing.assert_close(positive_advantages(advantages, SDPGKnobs()), torch.ones_like(advantages))


def test_sdpg_is_declared_whole_as_published():
    sdpg = get_method("sdpg")
    assert (sdpg.policy, sdpg.context, sdpg.published_teacher, sdpg.token_loss_agg) == (
        "verifier",
        "answer_only",
        "policy",
        "token_mean",
    )
    assert sdpg.distillation.topk_knob is None and sdpg.topk(SDPGKnobs()) == 0  # the exact full-vocabulary KL
    assert sdpg.weights(SDPGKnobs(beta=0.25)) == (1.0, 0.25)
    assert {"actor_rollout_ref.actor.clip_ratio_c=10.0", "actor_rollout_ref.actor.clip_ratio_high=0.28"} <= set(
        sdpg.run_settings
    )
    config = CPOConfig.from_config({"method": "sdpg"})
    assert config.distillation_agg == "token_mean" and config.teacher_config.name == "policy"
    assert CPOConfig.from_config({"method": "sdpg", "token_loss_agg": "seq_mean"}).distillation_agg == "seq_mean"


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"kl_mode": "kl"}, "cpo.sdpg.kl_mode must be one of fkl, rkl, ufkl, urkl"),
        ({"beta": -1.0}, "cpo.sdpg.beta must be >= 0"),
        ({"beta_warmup_steps": 1.5}, "cpo.sdpg.beta_warmup_steps must be an integer"),
        ({"positive_advantage_only": 1}, "cpo.sdpg.positive_advantage_only must be"),
    ],
)
def test_invalid_sdpg_knobs_are_refused_in_one_line(block, message):
    with pytest.raises(ValueError, match=message):
        CPOConfig.from_config({"method": "sdpg", "sdpg": block})
