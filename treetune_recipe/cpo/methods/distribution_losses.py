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
"""Per-token distribution losses of the self-distillation peers: OPSD's top-k JSD and SDPO's tail-bucket α-JSD.

Pure functions on tensors; each public docstring is its formula, the official code it follows (file:line of the
snapshot read) and any difference. Reductions over tokens, masks and loss scaling are the caller's.

Notation (distributions are log-probabilities over the last axis, ``[..., n]``):
    S, T   student and teacher log-distributions; s = e^S, t = e^T
    KL(P‖Q) = Σ_i p_i·(log p_i - log q_i), summed over the last axis (the elementwise term of
           ``F.kl_div(log Q, log P, log_target=True)``, which both official codes sum)
    M_w    log of the mixture (1 - w)·s + w·t (the teacher gets weight w)
    sg(x)  stop-gradient

Inputs of the two token losses are FULL-vocabulary log-probabilities (the log-softmax over the whole vocabulary of the
temperature-scaled logits, τ the rollout temperature) gathered at k token ids: their exponentials sum to the captured
mass ≤ 1, which is what makes the tail bucket meaningful. With OPSD the ids are the teacher's top-k, with SDPO the
student's. Every function is differentiable in its student argument.

Official snapshots read:
    OPSD  ``siyan-zhao/OPSD`` @ 590ec26c59e689a29840a501f65335578251b68c, ``opsd_trainer.py``
    SDPO  ``lasgroup/SDPO`` @ 0e6d5106abe69f578c63bf38a9394e22905c8773 (a verl fork), ``verl/trainer/ppo/core_algos.py``
          and ``verl/workers/actor/dp_actor.py``
"""

import torch

IS_LOG_RATIO_CLAMP = 20.0  # symmetric clamp of log π - log π_old before exp (SDPO core_algos.py:1174)
TAIL_LOG_MASS_MAX = -1e-7  # upper clamp of log Σ_k p before the tail bucket (SDPO core_algos.py:1116)


def _check_pair(student: torch.Tensor, teacher: torch.Tensor) -> None:
    if student.shape != teacher.shape:
        raise ValueError(
            f"student and teacher must have the same shape [..., n], got {tuple(student.shape)} and "
            f"{tuple(teacher.shape)}; gather both at the same token ids"
        )


def _check_weight(name: str, weight: float) -> None:
    if not 0.0 <= float(weight) <= 1.0:
        raise ValueError(f"{name} must be in [0, 1] (0 and 1 are the forward and reverse KL), got {weight}")


def _kl(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """KL(P‖Q) = Σ_i p_i·(log p_i - log q_i) over the last axis. ``[..., n] -> [...]``."""
    return (p_log.exp() * (p_log - q_log)).sum(-1)


def _mixture_divergence(
    student: torch.Tensor, teacher: torch.Tensor, weight: float, log_student_weight: torch.Tensor
) -> torch.Tensor:
    """w·KL(T‖M_w) + (1 - w)·KL(S‖M_w), M_w = logsumexp(S + log(1 - w), T + log w); the log-weight of S is given."""
    log_teacher_weight = torch.log(torch.tensor(weight, dtype=student.dtype, device=student.device))
    mixture = torch.logsumexp(torch.stack([student + log_student_weight, teacher + log_teacher_weight]), dim=0)
    return weight * _kl(teacher, mixture) + (1.0 - weight) * _kl(student, mixture)


# ----------------------------------------------------------------------------------------------------------------------
# Supports: renormalised top-k (OPSD) and top-k plus a tail bucket (SDPO)
# ----------------------------------------------------------------------------------------------------------------------


def renormalised(log_probs: torch.Tensor) -> torch.Tensor:
    """log p̂_i = log p_i - log Σ_j p_j over the last axis (log-softmax over the k entries). ``[..., k] -> [..., k]``.

    OPSD's top-k support (``opsd_trainer.py:419-427``: both sides' logits gathered at the teacher's top-k, then
    ``log_softmax`` over the k entries): a log-softmax is shift invariant, so renormalising full-vocabulary log-probs
    at the ids equals the official log-softmax of the gathered logits. Also SDPO's form when
    ``distillation_add_tail: false`` (``core_algos.py:1120-1131``). No tail bucket.
    """
    return log_probs - torch.logsumexp(log_probs, dim=-1, keepdim=True)


def with_tail_bucket(log_probs: torch.Tensor) -> torch.Tensor:
    """[log p_1, ..., log p_k, log(1 - e^L)], L = min(log Σ_i p_i, -1e-7), 1 - e^L taken as -expm1(L).
    ``[..., k] -> [..., k + 1]``.

    SDPO's ``add_tail`` (``core_algos.py:1112-1118``): the k gathered full-vocabulary probabilities plus one bucket
    holding the rest of the mass, a (k+1)-way distribution. The clamp keeps the tail finite when the k entries hold
    all the mass (k = V, or rounding): it then gets e^-16 ≈ 1e-7 on both sides, whose KL terms are ~1e-7·log-ratio.
    The gradient flows through the tail into every entry, as in the official code.
    """
    log_mass = torch.logsumexp(log_probs, dim=-1, keepdim=True).clamp(max=TAIL_LOG_MASS_MAX)
    return torch.cat([log_probs, torch.log(-torch.expm1(log_mass))], dim=-1)


# ----------------------------------------------------------------------------------------------------------------------
# Divergences on normalised log-distributions
# ----------------------------------------------------------------------------------------------------------------------


def jsd_beta(student: torch.Tensor, teacher: torch.Tensor, beta: float) -> torch.Tensor:
    """JSD_β(S, T) = β·KL(T‖M) + (1 - β)·KL(S‖M), M = log((1 - β)·s + β·t); β = 0: KL(T‖S); β = 1: KL(S‖T).
    ``[..., n], [..., n] -> [...]``.

    OPSD's ``generalized_jsd_loss`` (``opsd_trainer.py:430-449``; the same as TRL's GKD): the teacher's weight in
    the mixture is β and the KL from the teacher gets β; the mixture's student log-weight is ``log1p(-β)``. The two
    ends are special-cased by exact equality and are NOT the limits of the mixture form (which tends to 0): β = 0 is
    the forward KL(T‖S), β = 1 the reverse KL(S‖T). Published: β = 0.5 (symmetric in S and T), τ = 1.1.
    ``n`` is k (renormalised) or the full vocabulary; both arguments must be normalised log-distributions.
    """
    _check_pair(student, teacher)
    _check_weight("beta", beta)
    if beta == 0:
        return _kl(teacher, student)
    if beta == 1:
        return _kl(student, teacher)
    beta_t = torch.tensor(beta, dtype=student.dtype, device=student.device)
    return _mixture_divergence(student, teacher, float(beta), torch.log1p(-beta_t))


def alpha_jsd(student: torch.Tensor, teacher: torch.Tensor, alpha: float) -> torch.Tensor:
    """D_α(S, T) = lerp(KL(S‖M), KL(T‖M), α) = (1 - α)·KL(S‖M) + α·KL(T‖M), M = log((1 - α)·s + α·t);
    α = 0: KL(T‖S) (forward); α = 1: KL(S‖T) (reverse). ``[..., n], [..., n] -> [...]``.

    SDPO's divergence (``core_algos.py:1138-1162``: ``F.kl_div`` terms summed over the last axis, the mixture's
    student log-weight ``log(1 - α)``, ``torch.lerp(kl_student, kl_teacher, α)``). The same function as
    :func:`jsd_beta` with β = α (the teacher weighs α in the mixture and in the sum, the same special cases at 0 and
    1); kept separate because each follows its own code. Published: α = 0.5 (``actor.yaml``; the dataclass default
    in ``verl/workers/config/actor.py`` is 0.0, overridden by the yaml).
    """
    _check_pair(student, teacher)
    _check_weight("alpha", alpha)
    if alpha == 0.0:
        return _kl(teacher, student)
    if alpha == 1.0:
        return _kl(student, teacher)
    alpha_t = torch.tensor(alpha, dtype=student.dtype, device=student.device)
    return _mixture_divergence(student, teacher, float(alpha), torch.log(1 - alpha_t))


# ----------------------------------------------------------------------------------------------------------------------
# Token losses
# ----------------------------------------------------------------------------------------------------------------------


def opsd_token_loss(
    student_at_teacher_ids: torch.Tensor, teacher_at_teacher_ids: torch.Tensor, beta: float = 0.5
) -> torch.Tensor:
    """ℓ_OPSD = JSD_β(renormalised(S[I_T]), renormalised(T[I_T])), I_T = the teacher's top-k ids.
    ``[B, T, k] -> [B, T]``.

    OPSD's full-distribution loss with ``--top_k_loss k`` (``opsd_trainer.py:374-449``, called at l.721-728): the
    top-k of the teacher's temperature-scaled logits, both sides gathered there and renormalised over the k entries
    (no tail), then :func:`jsd_beta` summed over the k entries. With k = V (ids = the whole vocabulary) it is the
    exact full-vocabulary JSD_β, the paper's main form. Published: β = 0.5, τ = 1.1 in every log-softmax,
    ``--top_k_loss 50`` in ``scripts/run_opsd_topkloss.sh``. The official reduction, the caller's: the sum over
    valid response tokens divided by their number (``reduction="batchmean"`` with labels, l.451-459); no importance
    weight.

    Args:
        student_at_teacher_ids: ``[B, T, k]`` the student's full-vocabulary log-probs at the teacher's top-k ids.
        teacher_at_teacher_ids: ``[B, T, k]`` the teacher's full-vocabulary log-probs at the same ids.
        beta: the teacher's weight β in [0, 1].
    """
    return jsd_beta(renormalised(student_at_teacher_ids), renormalised(teacher_at_teacher_ids), beta)


def sdpo_token_loss(
    student_at_student_ids: torch.Tensor, teacher_at_student_ids: torch.Tensor, alpha: float = 0.5
) -> torch.Tensor:
    """ℓ_SDPO = D_α(tail(S[I_S]), tail(T[I_S])), I_S = the student's top-k ids, tail = :func:`with_tail_bucket`.
    ``[B, T, k] -> [B, T]``.

    SDPO's top-k distillation (``core_algos.py:1106-1162``; ids from the student's logits, ``dp_actor.py:363-386``,
    the teacher gathered at them, ``dp_actor.py:820-832``): both sides' full-vocabulary log-probs at the student's
    top-k plus a tail bucket, then :func:`alpha_jsd` summed over the k + 1 entries. Published: k = 100, tail on,
    α = 0.5 (``actor.yaml``), log-probs of the logits / rollout temperature on both sides. In the official loss it is
    then multiplied by :func:`clipped_importance_weight` (``is_clip: 2``) and by verl's rollout-correction weights if
    any (``core_algos.py:1168-1179``), and averaged over response tokens of rows with a teacher context
    (``token-mean`` over ``response_mask · self_distillation_mask``); those are the caller's.

    Args:
        student_at_student_ids: ``[B, T, k]`` the student's full-vocabulary log-probs at its own top-k ids.
        teacher_at_student_ids: ``[B, T, k]`` the teacher's full-vocabulary log-probs at the same ids.
        alpha: the teacher's weight α in [0, 1].
    """
    return alpha_jsd(with_tail_bucket(student_at_student_ids), with_tail_bucket(teacher_at_student_ids), alpha)


def clipped_importance_weight(
    log_probs: torch.Tensor, old_log_probs: torch.Tensor, max_ratio: float = 2.0
) -> torch.Tensor:
    """w = min(exp(clamp(sg(log π - log π_old), -20, 20)), max_ratio), detached. ``[B, T], [B, T] -> [B, T]``.

    SDPO's distillation IS weight (``core_algos.py:1168-1175``, ``is_clip``): log π is the current policy's log-prob
    of the sampled token (the student pass), log π_old the rollout policy's ``old_log_probs`` (``dp_actor.py:794-800``:
    on-policy, a single mini-batch, it is log π detached and w ≡ 1). Only an upper clip; no lower clip (a ratio
    below 1 is kept). Published: ``is_clip: 2``.
    """
    if log_probs.shape != old_log_probs.shape:
        raise ValueError(
            f"log_probs and old_log_probs must have the same shape, got {tuple(log_probs.shape)} and "
            f"{tuple(old_log_probs.shape)}"
        )
    if max_ratio <= 0:
        raise ValueError(f"max_ratio must be positive (SDPO's is_clip), got {max_ratio}")
    log_ratio = (log_probs - old_log_probs).detach().clamp(-IS_LOG_RATIO_CLAMP, IS_LOG_RATIO_CLAMP)
    return log_ratio.exp().clamp(max=max_ratio)
