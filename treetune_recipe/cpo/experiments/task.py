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
"""The chain task's RL settings, shared by every run on a warm start (the demo, each experiment run, the tests that
train from the warm start): the hint wording, the task's RL overrides, its validation metric, and the shape of a
regime's prompt set."""

from __future__ import annotations

import dataclasses
from pathlib import Path

#: The experiments' hint wording: the default's opening and request on one line (the default's rules would triple the
#: length of every hinted sequence on these short problems); RL runs get it through :data:`HINT_OVERRIDES`.
HINT_USER_TEMPLATE = (
    "Problem: {question} Worked solution (private; for your reference only): {solution} Solve the problem yourself, "
    "step by step, and reach the same final answer as the worked solution."
)
HINT_OVERRIDES = [f"cpo.hint.user_template='{HINT_USER_TEMPLATE}'", "cpo.hint.max_prompt_length=160"]
#: RL settings of the chain task, shared by every run on a warm start (the demo and each experiment run): the ±1
#: reward the CPO wrappers are written for, batch and lengths sized to the task, greedy validation from step 0 (verl's
#: agent loop validates with ``val_kwargs.temperature`` and ignores ``val_kwargs.do_sample``: temperature 0 is greedy).
TASK_RL_OVERRIDES = [
    "reward.custom_reward_function.name=compute_binary_score",
    "data.train_batch_size=8",
    "data.max_prompt_length=96",
    "data.max_response_length=48",
    "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.actor.optim.lr=2e-4",
    "actor_rollout_ref.rollout.val_kwargs.temperature=0",
    "actor_rollout_ref.rollout.val_kwargs.n=1",
    "trainer.val_before_train=true",
]


#: The long regime's lengths (``long_chain`` problems: prompts up to ~110 tokens, solutions of 80-150): applied after
#: the task's, and the teacher prompt's limit after :data:`HINT_OVERRIDES` (the hint or a sibling holds a solution).
LONG_CHAIN_OVERRIDES = [
    "data.max_prompt_length=128",
    "data.max_response_length=160",
    "cpo.hint.max_prompt_length=320",
]


def override_value(overrides, key: str, default: int | None = None) -> int:
    """The last integer value ``overrides`` assign to ``key`` (``default`` when none does; a deletion ``~key`` assigns
    nothing)."""
    from treetune_verl.config_block import override_key

    values = [int(item.partition("=")[2]) for item in overrides if "=" in item and override_key(item) == key]
    if values:
        return values[-1]
    if default is None:
        raise KeyError(f"no override sets {key}")
    return default


def val_acc_key(samples: int) -> str:
    """verl's validation metric of the task: mean accuracy of ``samples`` responses per held-out plain prompt."""
    return f"val-core/tiny_arith/acc/mean@{samples}"


#: The task's validation metric under :data:`TASK_RL_OVERRIDES`: greedy accuracy, one response per prompt.
GREEDY_VAL_ACC_KEY = val_acc_key(1)


@dataclasses.dataclass(frozen=True)
class RegimePrompts:
    """A regime's prompts (the hard ones of ``hard_prompts.py``, the long chains of ``long_chain.py``): training and
    held-out parquet files in the task's schema, and what was measured on them (``info.json``)."""

    train: Path
    val: Path
    info: dict
