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
"""CPO algorithm core besides the advantage wrappers: the difficulty mask, the ``loss_position`` masks and the ``cpo``
advantage estimator, with the reference fork's semantics (its differences are noted where they apply).

Importing this module registers ``cpo`` in verl's advantage-estimator registry. The wrappers that shape the
advantages in the actor loss are in :mod:`treetune_recipe.cpo.methods.cpo_wrappers`.
"""

from collections.abc import Callable, Sequence

import numpy as np
import torch
from verl.trainer.ppo import core_algos as verl_core_algos

from treetune_recipe.cpo.methods.advantage_terms import DEFAULT_SUCCESS_VALUE, succeeded

# ----------------------------------------------------------------------------------------------------------------------
# Difficulty mask
# ----------------------------------------------------------------------------------------------------------------------

DIFFICULTY_MODES = ("group", "reference")


def compute_difficulty_mask(
    seq_rewards: torch.Tensor,
    uids: Sequence[str] | np.ndarray,
    mode: str = "group",
    success_value: float = DEFAULT_SUCCESS_VALUE,
) -> torch.Tensor:
    """Per-response label of its prompt group: -1 all responses failed, +1 all succeeded, 0 mixed.

    Args:
        seq_rewards: ``[B]`` sequence rewards. A response succeeded iff its reward == ``success_value``
            (exact equality, :func:`treetune_recipe.cpo.methods.advantage_terms.succeeded`); anything else is a failure.
        uids: ``B`` group ids, one per response (verl's ``non_tensor_batch["uid"]``, object array of str).
        mode: ``"group"`` (the labels above) or ``"reference"`` (all zeros: what the reference fork computed,
            its comparison of a list with a float is never true; reproduces the published runs).
        success_value: the reward of a correct response.

    Returns:
        ``[B]`` float32 on the device of ``seq_rewards``.
    """
    if mode not in DIFFICULTY_MODES:
        raise ValueError(f"Unknown difficulty_mode {mode!r}. Valid modes: {', '.join(DIFFICULTY_MODES)}.")
    uids = np.asarray(uids)
    if uids.shape != (seq_rewards.shape[0],):
        raise ValueError(f"Expected one uid per response: {seq_rewards.shape[0]} rewards, uids of shape {uids.shape}.")
    if mode == "reference":
        return torch.zeros(seq_rewards.shape[0], dtype=torch.float32, device=seq_rewards.device)

    _, inverse = np.unique(uids, return_inverse=True)
    group = torch.as_tensor(inverse.reshape(-1), dtype=torch.long, device=seq_rewards.device)
    num_groups = int(group.max()) + 1 if group.numel() else 0
    group_size = torch.bincount(group, minlength=num_groups)
    group_successes = torch.bincount(group[succeeded(seq_rewards, success_value)], minlength=num_groups)
    label = (group_successes == group_size).float() - (group_successes == 0).float()
    return label[group]


# ----------------------------------------------------------------------------------------------------------------------
# loss_position: which tokens enter the policy, entropy and KL losses
# ----------------------------------------------------------------------------------------------------------------------

HIGH_ENTROPY_QUANTILE = 0.8  # "entropy": keep tokens above this entropy quantile (top 20 %)
FIRST_TOKENS_FRACTION = 0.2  # "first": keep the first 20 % of the tokens


def _high_entropy_batch(response_mask: torch.Tensor, entropy: torch.Tensor) -> torch.Tensor:
    """Reference: V ∧ H > q, q = 0.8-quantile of H·m over all B×T entries of the micro-batch, padding zeros in."""
    threshold = torch.quantile((entropy * response_mask).flatten().float(), HIGH_ENTROPY_QUANTILE)
    return response_mask.bool() & (entropy > threshold)


def _high_entropy_per_sequence(response_mask: torch.Tensor, entropy: torch.Tensor) -> torch.Tensor:
    """Fixed: V ∧ H > q_i, q_i = 0.8-quantile of H over the valid tokens of sequence i only."""
    valid = response_mask.bool()
    masked = entropy.float().masked_fill(~valid, float("nan"))
    threshold = torch.nanquantile(masked, HIGH_ENTROPY_QUANTILE, dim=-1, keepdim=True)
    return valid & (entropy > threshold)


def _first_tokens_batch(response_mask: torch.Tensor, entropy: torch.Tensor) -> torch.Tensor:
    """Reference: V ∧ t < ⌊0.2·T⌋, T the padded width of the micro-batch."""
    width = response_mask.shape[-1]
    positions = torch.arange(width, device=response_mask.device)
    return response_mask.bool() & (positions < int(FIRST_TOKENS_FRACTION * width))


def _first_tokens_per_sequence(response_mask: torch.Tensor, entropy: torch.Tensor) -> torch.Tensor:
    """Fixed: the first ⌊0.2·n_i⌋ valid tokens of sequence i (n_i = its number of valid tokens)."""
    valid = response_mask.bool()
    rank = valid.long().cumsum(dim=-1) - 1  # index of each valid token among its sequence's valid tokens
    keep = torch.floor(valid.sum(dim=-1, keepdim=True).double() * FIRST_TOKENS_FRACTION)
    return valid & (rank < keep)


LOSS_POSITIONS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None] = {
    "all": None,
    "entropy": _high_entropy_batch,
    "first": _first_tokens_batch,
    "entropy_valid": _high_entropy_per_sequence,
    "first_seq": _first_tokens_per_sequence,
}


def apply_loss_position(response_mask: torch.Tensor, entropy: torch.Tensor, position: str) -> torch.Tensor:
    """The response mask restricted to the tokens selected by ``position`` (a new tensor, same dtype).

    Args:
        response_mask: ``[B, T]`` 0/1 mask of valid response tokens.
        entropy: ``[B, T]`` current-policy token entropy (read by the entropy positions only).
        position: ``all`` (unchanged), ``entropy`` / ``first`` (reference semantics, depend on the micro-batch),
            ``entropy_valid`` / ``first_seq`` (per-sequence fixes).
    """
    if position not in LOSS_POSITIONS:
        raise ValueError(f"Unknown loss_position {position!r}. Valid positions: {', '.join(LOSS_POSITIONS)}.")
    select = LOSS_POSITIONS[position]
    if select is None:
        return response_mask.clone()
    return select(response_mask, entropy).to(response_mask.dtype)


# ----------------------------------------------------------------------------------------------------------------------
# Advantage estimator ``cpo`` = GRPO outcome advantage (the wrappers shape it later, in the actor loss)
# ----------------------------------------------------------------------------------------------------------------------


def compute_cpo_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray, config=None, **kwargs
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's GRPO outcome advantage, so that ``algorithm.adv_estimator=cpo`` (the reference scripts' value) works.

    verl's generic estimator path passes ``token_level_rewards, response_mask, config`` (= ``config.algorithm``),
    ``index`` (uid) and optionally ``reward_baselines`` (ignored, as GRPO does); ``norm_adv_by_std_in_grpo`` is
    read from ``config`` (default True, as verl's GRPO branch).

    Returns:
        (advantages, returns), both ``[B, T]``.
    """
    norm_adv_by_std = True if config is None else config.get("norm_adv_by_std_in_grpo", True)
    # SYNC WARNING: verl/trainer/ppo/core_algos.py:compute_grpo_outcome_advantage
    return verl_core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=token_level_rewards,
        response_mask=response_mask,
        index=index,
        norm_adv_by_std_in_grpo=norm_adv_by_std,
        config=config,
    )


def _register_cpo_adv_estimator() -> None:
    """Register ``cpo`` in verl's estimator registry; a no-op when this module was imported before."""
    # SYNC WARNING: verl/trainer/ppo/core_algos.py:ADV_ESTIMATOR_REGISTRY
    registered = verl_core_algos.ADV_ESTIMATOR_REGISTRY.get("cpo")
    ours = compute_cpo_outcome_advantage
    if registered is None:
        verl_core_algos.register_adv_est("cpo")(ours)
    elif (registered.__module__, registered.__qualname__) != (ours.__module__, ours.__qualname__):
        raise ValueError(f"verl advantage estimator 'cpo' is already registered by {registered.__module__}.")


_register_cpo_adv_estimator()
