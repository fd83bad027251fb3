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
"""OPSD's and SDPO's per-token distribution losses against a direct full-vocabulary computation.

The direct computation below works in probability space from the full-vocabulary softmax of random logits: explicit
probabilities gathered at the ids, renormalised by division or completed with the complement's summed mass (the
tail), and KL(P‖Q) = Σ xlogy(p, p) - xlogy(p, q). It shares no code with the module under test. Each corruption
(student and teacher swapped, β → 1 - β, tail bucket dropped, the other side's top-k ids) must fail the same
assertion. TRL (``trl.experimental.sdpo.loss_utils``, ``trl.experimental.gkd``) is a second oracle when installed.
"""

import os

import pytest
import torch
from torch.distributions import Categorical, kl_divergence

from treetune_recipe.cpo.methods.distribution_losses import (
    alpha_jsd,
    clipped_importance_weight,
    jsd_beta,
    opsd_token_loss,
    renormalised,
    sdpo_token_loss,
    with_tail_bucket,
)

TAU = 1.1  # OPSD's published temperature; the losses see log-probs of logits / τ
B, T = 2, 3
CASES = [(50, 5), (50, 50), (640, 5), (640, 640)]  # (V, k)


def assert_matches(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """The one assertion of every value check and of its corrupted controls."""
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)


def random_logits(vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    student = 2.5 * torch.randn(B, T, vocab, generator=g)
    teacher = 2.5 * torch.randn(B, T, vocab, generator=g)
    return student, teacher


def top_ids(logits: torch.Tensor, k: int) -> torch.Tensor:
    return torch.topk(logits, k, dim=-1).indices


def gathered_log_probs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """What a trainer pass hands to the losses: full-vocabulary log-softmax at temperature τ, gathered at the ids."""
    return torch.log_softmax(logits / TAU, dim=-1).gather(-1, ids)


# ------------------------------------------------------------------------------------------------------------------
# The independent direct computation (probability space, plain sums)
# ------------------------------------------------------------------------------------------------------------------


def kl_direct(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return (torch.xlogy(p, p) - torch.xlogy(p, q)).sum(-1)


def generalized_jsd_direct(p_student: torch.Tensor, p_teacher: torch.Tensor, w: float) -> torch.Tensor:
    """w = 0: KL(T‖S); w = 1: KL(S‖T); else w·KL(T‖m) + (1-w)·KL(S‖m), m = (1-w)·p_S + w·p_T."""
    if w == 0:
        return kl_direct(p_teacher, p_student)
    if w == 1:
        return kl_direct(p_student, p_teacher)
    m = (1 - w) * p_student + w * p_teacher
    return w * kl_direct(p_teacher, m) + (1 - w) * kl_direct(p_student, m)


def probs(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits / TAU, dim=-1)


def opsd_direct(student_logits, teacher_logits, k: int, beta: float) -> torch.Tensor:
    """Teacher's top-k, probabilities at them divided by their sum (k = V: the full-vocabulary JSD_β)."""
    ids = top_ids(teacher_logits, k)
    p_s, p_t = probs(student_logits).gather(-1, ids), probs(teacher_logits).gather(-1, ids)
    return generalized_jsd_direct(p_s / p_s.sum(-1, keepdim=True), p_t / p_t.sum(-1, keepdim=True), beta)


def with_tail_direct(full_probs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The k probabilities, then the summed probability of the tokens NOT among the ids (0 when k = V)."""
    outside = torch.ones_like(full_probs, dtype=torch.bool).scatter(-1, ids, False)
    tail = (full_probs * outside).sum(-1, keepdim=True)
    return torch.cat([full_probs.gather(-1, ids), tail], dim=-1)


def sdpo_direct(student_logits, teacher_logits, k: int, alpha: float) -> torch.Tensor:
    """Student's top-k, each side's probabilities there plus its tail mass, a (k+1)-way α-JSD."""
    ids = top_ids(student_logits, k)
    return generalized_jsd_direct(
        with_tail_direct(probs(student_logits), ids), with_tail_direct(probs(teacher_logits), ids), alpha
    )


# ------------------------------------------------------------------------------------------------------------------
# Supports
# ------------------------------------------------------------------------------------------------------------------


def test_renormalised_and_tail_bucket_are_distributions():
    s, _ = random_logits(64, seed=0)
    ids = top_ids(s, 5)
    lp = gathered_log_probs(s, ids)
    assert_matches(renormalised(lp).exp().sum(-1), torch.ones(B, T))
    tailed = with_tail_bucket(lp)
    assert tailed.shape == (B, T, 6)
    assert_matches(tailed.exp().sum(-1), torch.ones(B, T))
    assert_matches(tailed.exp(), with_tail_direct(probs(s), ids))
    with pytest.raises(AssertionError):  # control: the renormalised k entries are not the tailed ones
        assert_matches(torch.cat([renormalised(lp), lp[..., :1]], dim=-1).exp(), with_tail_direct(probs(s), ids))


def test_tail_bucket_stays_finite_when_the_k_entries_hold_all_the_mass():
    s, _ = random_logits(50, seed=1)
    full = gathered_log_probs(s, top_ids(s, 50))
    tailed = with_tail_bucket(full + 1e-6)  # rounding above 1 included
    assert torch.isfinite(tailed).all()
    assert (tailed[..., -1].exp() <= 2e-7).all()


# ------------------------------------------------------------------------------------------------------------------
# OPSD
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("vocab", "k"), CASES)
@pytest.mark.parametrize("beta", [0.5, 0.2, 0.0, 1.0])
def test_opsd_token_loss_equals_direct_computation(vocab, k, beta):
    s, t = random_logits(vocab, seed=vocab + k)
    ids = top_ids(t, k)
    loss = opsd_token_loss(gathered_log_probs(s, ids), gathered_log_probs(t, ids), beta)
    assert loss.shape == (B, T)
    assert_matches(loss, opsd_direct(s, t, k, beta))


@pytest.mark.parametrize(("vocab", "k"), CASES)
def test_opsd_controls_fail(vocab, k):
    beta = 0.2  # β = 0.5 is symmetric in S and T, so a swap would go unseen there
    s, t = random_logits(vocab, seed=vocab + k)
    ids = top_ids(t, k)
    lp_s, lp_t = gathered_log_probs(s, ids), gathered_log_probs(t, ids)
    expected = opsd_direct(s, t, k, beta)
    with pytest.raises(AssertionError):  # student and teacher swapped
        assert_matches(opsd_token_loss(lp_t, lp_s, beta), expected)
    with pytest.raises(AssertionError):  # β replaced by 1 - β
        assert_matches(opsd_token_loss(lp_s, lp_t, 1 - beta), expected)
    if k < vocab:
        wrong = top_ids(s, k)  # the student's top-k instead of the teacher's
        with pytest.raises(AssertionError):
            assert_matches(opsd_token_loss(gathered_log_probs(s, wrong), gathered_log_probs(t, wrong), beta), expected)


def test_opsd_full_vocabulary_is_the_exact_jsd_in_any_id_order():
    s, t = random_logits(200, seed=3)
    shuffled = torch.randperm(200, generator=torch.Generator().manual_seed(0)).expand(B, T, 200)
    loss = opsd_token_loss(gathered_log_probs(s, shuffled), gathered_log_probs(t, shuffled), 0.5)
    assert_matches(loss, generalized_jsd_direct(probs(s), probs(t), 0.5))
    assert_matches(jsd_beta(torch.log_softmax(s / TAU, -1), torch.log_softmax(t / TAU, -1), 0.5), loss)


# ------------------------------------------------------------------------------------------------------------------
# SDPO
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("vocab", "k"), CASES)
@pytest.mark.parametrize("alpha", [0.5, 0.2, 0.0, 1.0])
def test_sdpo_token_loss_equals_direct_computation(vocab, k, alpha):
    s, t = random_logits(vocab, seed=10 * vocab + k)
    ids = top_ids(s, k)
    loss = sdpo_token_loss(gathered_log_probs(s, ids), gathered_log_probs(t, ids), alpha)
    assert loss.shape == (B, T)
    assert torch.isfinite(loss).all()
    assert_matches(loss, sdpo_direct(s, t, k, alpha))


@pytest.mark.parametrize(("vocab", "k"), [(50, 5), (640, 5)])
def test_sdpo_controls_fail(vocab, k):
    alpha = 0.2
    s, t = random_logits(vocab, seed=10 * vocab + k)
    ids = top_ids(s, k)
    lp_s, lp_t = gathered_log_probs(s, ids), gathered_log_probs(t, ids)
    expected = sdpo_direct(s, t, k, alpha)
    assert_matches(sdpo_token_loss(lp_s, lp_t, alpha), expected)
    with pytest.raises(AssertionError):  # student and teacher swapped
        assert_matches(sdpo_token_loss(lp_t, lp_s, alpha), expected)
    with pytest.raises(AssertionError):  # α replaced by 1 - α
        assert_matches(sdpo_token_loss(lp_s, lp_t, 1 - alpha), expected)
    with pytest.raises(AssertionError):  # tail bucket omitted (renormalised top-k instead)
        assert_matches(alpha_jsd(renormalised(lp_s), renormalised(lp_t), alpha), expected)
    wrong = top_ids(t, k)  # the teacher's top-k instead of the student's
    with pytest.raises(AssertionError):
        assert_matches(sdpo_token_loss(gathered_log_probs(s, wrong), gathered_log_probs(t, wrong), alpha), expected)


@pytest.mark.parametrize("divergence", [jsd_beta, alpha_jsd])
def test_edge_weights_are_forward_and_reverse_kl(divergence):
    s, t = random_logits(100, seed=4)
    lp_s, lp_t = torch.log_softmax(s / TAU, -1), torch.log_softmax(t / TAU, -1)
    forward = kl_divergence(Categorical(logits=lp_t), Categorical(logits=lp_s))  # KL(T‖S)
    reverse = kl_divergence(Categorical(logits=lp_s), Categorical(logits=lp_t))  # KL(S‖T)
    assert_matches(divergence(lp_s, lp_t, 0.0), forward)
    assert_matches(divergence(lp_s, lp_t, 1.0), reverse)
    with pytest.raises(AssertionError):  # control: the two ends swapped
        assert_matches(divergence(lp_s, lp_t, 0.0), reverse)
    with pytest.raises(AssertionError):  # control: the ends are special cases, not limits of the mixture (→ 0)
        assert_matches(divergence(lp_s, lp_t, 1e-6), forward)


def test_alpha_jsd_equals_jsd_beta_at_the_same_weight():
    s, t = random_logits(80, seed=5)
    lp_s, lp_t = torch.log_softmax(s, -1), torch.log_softmax(t, -1)
    for w in (0.0, 0.3, 0.5, 0.9, 1.0):
        assert_matches(alpha_jsd(lp_s, lp_t, w), jsd_beta(lp_s, lp_t, w))


def test_bad_weight_and_shapes_are_refused():
    lp = torch.log_softmax(torch.randn(2, 5), -1)
    with pytest.raises(ValueError, match="beta must be in"):
        jsd_beta(lp, lp, 1.5)
    with pytest.raises(ValueError, match="alpha must be in"):
        alpha_jsd(lp, lp, -0.1)
    with pytest.raises(ValueError, match="same shape"):
        sdpo_token_loss(lp, lp[:, :3], 0.5)


# ------------------------------------------------------------------------------------------------------------------
# Gradients wrt the student's logits
# ------------------------------------------------------------------------------------------------------------------


def _grad(fn, logits: torch.Tensor) -> torch.Tensor:
    z = logits.clone().requires_grad_(True)
    fn(z).sum().backward()
    return z.grad


@pytest.mark.parametrize(("vocab", "k"), [(50, 5), (640, 5), (50, 50)])
def test_opsd_gradient_equals_direct_gradient(vocab, k):
    s, t = random_logits(vocab, seed=20 + vocab + k)
    ids = top_ids(t, k)
    expected = _grad(lambda z: opsd_direct(z, t, k, 0.5), s)
    actual = _grad(lambda z: opsd_token_loss(gathered_log_probs(z, ids), gathered_log_probs(t, ids), 0.5), s)
    assert actual.abs().max() > 1e-3  # a real gradient, not two zeros
    assert_matches(actual, expected)
    if k < vocab:
        wrong = top_ids(s, k)
        corrupted = _grad(lambda z: opsd_token_loss(gathered_log_probs(z, wrong), gathered_log_probs(t, wrong), 0.5), s)
        with pytest.raises(AssertionError):
            assert_matches(corrupted, expected)


@pytest.mark.parametrize("vocab", [50, 640])
@pytest.mark.parametrize("alpha", [0.5, 0.0, 1.0])
def test_sdpo_gradient_equals_direct_gradient(vocab, alpha):
    k = 5
    s, t = random_logits(vocab, seed=30 + vocab)
    ids = top_ids(s, k)
    expected = _grad(lambda z: sdpo_direct(z, t, k, alpha), s)
    actual = _grad(lambda z: sdpo_token_loss(gathered_log_probs(z, ids), gathered_log_probs(t, ids), alpha), s)
    assert actual.abs().max() > 1e-3
    assert_matches(actual, expected)
    no_tail = _grad(
        lambda z: alpha_jsd(renormalised(gathered_log_probs(z, ids)), renormalised(gathered_log_probs(t, ids)), alpha),
        s,
    )
    with pytest.raises(AssertionError):  # control: without the tail bucket
        assert_matches(no_tail, expected)


# ------------------------------------------------------------------------------------------------------------------
# Importance weight
# ------------------------------------------------------------------------------------------------------------------


def test_clipped_importance_weight_values_clip_and_detach():
    old = torch.zeros(1, 7)
    log_ratio = torch.tensor([[-50.0, -0.6931472, 0.0, 0.4054651, 0.6931472, 1.0986123, 50.0]])
    new = (old + log_ratio).requires_grad_(True)
    weight = clipped_importance_weight(new, old, max_ratio=2.0)
    expected = torch.tensor([[torch.exp(torch.tensor(-20.0)).item(), 0.5, 1.0, 1.5, 2.0, 2.0, 2.0]])
    assert_matches(weight, expected)
    assert not weight.requires_grad
    with pytest.raises(AssertionError):  # control: the unclipped ratio
        assert_matches((new - old).detach().clamp(-20, 20).exp(), expected)
    loss_per_token = new * 3.0
    (loss_per_token * weight).sum().backward()
    assert_matches(new.grad, 3.0 * expected)  # the weight scales the gradient and gets none itself


# ------------------------------------------------------------------------------------------------------------------
# TRL as a second oracle (trl.experimental.sdpo.loss_utils and GKD's generalized_jsd_loss)
# ------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trl_losses():
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    pytest.importorskip("trl", reason="TRL is not installed: the second-oracle checks need `trl` (not a dependency)")
    from trl.experimental.gkd.gkd_trainer import GKDTrainer
    from trl.experimental.sdpo import loss_utils

    return loss_utils, GKDTrainer.generalized_jsd_loss


@pytest.mark.parametrize(("vocab", "k"), CASES)
@pytest.mark.parametrize("alpha", [0.5, 0.0, 1.0])
def test_sdpo_token_loss_matches_trl(trl_losses, vocab, k, alpha):
    loss_utils, _ = trl_losses
    s, t = random_logits(vocab, seed=40 + vocab + k)
    ids = top_ids(s, k)
    ours = sdpo_token_loss(gathered_log_probs(s, ids), gathered_log_probs(t, ids), alpha)
    theirs = loss_utils.compute_topk_self_distillation_loss(
        s / TAU, t / TAU, distillation_topk=k, distillation_alpha=alpha, distillation_add_tail=True
    )
    assert_matches(ours, theirs)
    if k < vocab:
        without_tail = loss_utils.compute_topk_self_distillation_loss(
            s / TAU, t / TAU, distillation_topk=k, distillation_alpha=alpha, distillation_add_tail=False
        )
        with pytest.raises(AssertionError):  # control: TRL's own no-tail mode (its default) is a different loss
            assert_matches(ours, without_tail)


@pytest.mark.parametrize(("vocab", "k"), CASES)
@pytest.mark.parametrize("beta", [0.5, 0.2, 0.0, 1.0])
def test_opsd_token_loss_matches_trl_gkd_jsd(trl_losses, vocab, k, beta):
    _, gkd_jsd = trl_losses
    s, t = random_logits(vocab, seed=50 + vocab + k)
    ids = top_ids(t, k)
    ours = opsd_token_loss(gathered_log_probs(s, ids), gathered_log_probs(t, ids), beta)
    # OPSD's top-k path: both sides' logits gathered at the teacher's top-k, then GKD's JSD (log-softmax over k)
    theirs = gkd_jsd(s.gather(-1, ids), t.gather(-1, ids), beta=beta, temperature=TAU, reduction="none").sum(-1)
    assert_matches(ours, theirs)
    if beta != 0.5:
        with pytest.raises(AssertionError):  # control: student and teacher swapped
            assert_matches(opsd_token_loss(gathered_log_probs(t, ids), gathered_log_probs(s, ids), beta), theirs)


def test_importance_weight_matches_trl(trl_losses):
    loss_utils, _ = trl_losses
    g = torch.Generator().manual_seed(6)
    new, old = torch.randn(4, 9, generator=g), torch.randn(4, 9, generator=g)
    theirs = loss_utils.apply_importance_sampling_clipping(torch.ones(4, 9), new, old, 2.0)
    assert_matches(clipped_importance_weight(new, old, 2.0), theirs)
    assert (theirs == 2.0).any() and (theirs < 1.0).any()  # both the clip and the unclipped side are exercised


@pytest.mark.parametrize(("method", "k"), [("opsd", 0), ("opsd", 5), ("sdpo", 7)])
def test_the_loss_in_checkpointed_pieces_equals_the_loss_in_one(method, k):
    """``methods.loss.distribution_token_loss`` in pieces of 1 and 3 tokens (each recomputed in the backward pass) gives
    the per-token loss and the gradient of the student's logits of one piece. Control: the teacher's pieces one token
    out of step with the student's."""
    from treetune_recipe.cpo.config import CPOConfig
    from treetune_recipe.cpo.methods.loss import distribution_token_loss

    cpo = CPOConfig.from_config({"method": method, method: {"top_k": k}})
    gen = torch.Generator().manual_seed(0)
    packed = (torch.randn(20, 50, generator=gen) * 3).requires_grad_(True)
    index = torch.tensor([1, 2, 3, 5, 6, 9, 10, 11, 12, 17])
    teacher = torch.randn(len(index), 50, generator=gen) * 3

    def loss_and_grad(chunk, teacher_logits=teacher):
        packed.grad = None
        per_token = distribution_token_loss(
            cpo.selected_method, cpo.knobs, k, packed, index, teacher_logits, chunk=chunk
        )
        (per_token * torch.arange(1.0, len(index) + 1)).sum().backward()
        return per_token.detach(), packed.grad.clone()

    whole = loss_and_grad(len(index))
    assert whole[0].min() > 0 and whole[1].abs().sum() > 0
    for chunk in (1, 3):
        for got, expected in zip(loss_and_grad(chunk), whole, strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)
    shifted = loss_and_grad(3, teacher_logits=teacher.roll(1, dims=0))
    with pytest.raises(AssertionError):
        torch.testing.assert_close(shifted[0], whole[0], rtol=1e-6, atol=1e-7)
