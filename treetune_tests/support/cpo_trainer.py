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
"""``RayCPOTrainer`` on a config composed from ``cpo_trainer.yaml``, against an in-process actor worker group.

:func:`make_trainer` builds the trainer without Ray (only what the CPO paths read from ``RayPPOTrainer.__init__``) and
gives it a :class:`FakeActorGroup`: its log-probs are a deterministic function of each row's own tokens
(:func:`fake_log_probs`: the hint prompt changes them, batch composition does not), it refuses a batch that verl's
dispatch and micro-batching would refuse, and it records every request. :func:`rollout_batch` is the batch ``fit``
hands to ``_update_actor`` (old log-probs, rewards :data:`REWARDS`, GRPO advantages). Tests that use them need the
``verl_pad_helpers`` fixture (the trainer's passes unpad with verl's helpers).
"""

import torch
from hydra import compose, initialize_config_dir
from tensordict import TensorDict
from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils import tensordict_utils as tu

from treetune_recipe.cpo import CONFIG_DIR, CONFIG_NAME
from treetune_recipe.cpo.methods.core_algos import compute_cpo_outcome_advantage
from treetune_recipe.cpo.trainer.ray_trainer import RayCPOTrainer
from treetune_tests.support.hint_batches import PROBLEMS, make_batch
from treetune_tests.support.tokenizer_factory import build_tokenizer


def fake_log_probs(input_ids: torch.Tensor) -> torch.Tensor:
    """Log-prob of token j+1 at position j, a function of the row's own prefix only: [L] -> [L]."""
    prefix = torch.cumsum((input_ids * 7919) % 1009, dim=0)
    next_ids = torch.roll(input_ids, -1)
    return -(((prefix * 31 + next_ids) % 97).float() + 1.0) / 40.0


class FakeActorGroup:
    """Stands in for the actor worker group: checks verl's batch-size constraints and records each request."""

    def __init__(self, dp_size: int, micro_batch_size: int | None):
        self._dispatch_info = {"actor": list(range(dp_size))}
        self.dp_size, self.micro_batch_size = dp_size, micro_batch_size
        self.log_prob_requests: list[TensorDict] = []
        self.update_requests: list[TensorDict] = []
        self.loss_fns: list = []

    def set_loss_fn(self, loss_fn) -> None:
        self.loss_fns.append(loss_fn)

    def compute_log_prob(self, data: TensorDict) -> TensorDict:
        rows = len(data)
        assert rows % self.dp_size == 0, f"{rows} rows cannot be dispatched to {self.dp_size} DP ranks"
        if self.micro_batch_size is not None:
            assert (rows // self.dp_size) % self.micro_batch_size == 0, "fixed micro-batches must divide each rank"
        self.log_prob_requests.append(data)
        per_row = [fake_log_probs(ids) for ids in data["input_ids"].unbind()]
        outputs = {"log_probs": torch.nested.as_nested_tensor(per_row, layout=torch.jagged)}
        if tu.get(data, "calculate_entropy"):  # like verl's engine: entropy only when asked for
            ones = [torch.ones_like(x) for x in per_row]
            outputs["entropy"] = torch.nested.as_nested_tensor(ones, layout=torch.jagged)
        return tu.get_tensordict(outputs, non_tensor_dict={"metrics": {"mfu": 0}})

    def update_actor(self, data: TensorDict) -> TensorDict:
        self.update_requests.append(data)
        return tu.get_tensordict({}, non_tensor_dict={"metrics": {"mfu": 0.0, "pg_loss": 0.0}})


def make_trainer(monkeypatch, *overrides, dp_size=1, dynamic=False, micro_batch_size=2):
    def upstream_init(self, config, tokenizer):  # only what the CPO paths read from RayPPOTrainer.__init__
        self.config, self.tokenizer, self.use_legacy_worker_impl = config, tokenizer, "disable"

    monkeypatch.setattr(RayPPOTrainer, "__init__", upstream_init)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        config = compose(
            CONFIG_NAME,
            overrides=[
                "platform=cpu",
                "data.max_prompt_length=96",
                "actor_rollout_ref.rollout.n=4",
                f"actor_rollout_ref.actor.use_dynamic_bsz={dynamic}",
                f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro_batch_size}",
                "trainer.balance_batch=true",
                *overrides,
            ],
        )
    trainer = RayCPOTrainer(config=config, tokenizer=build_tokenizer("qwen3"))
    trainer.actor_rollout_wg = FakeActorGroup(dp_size, None if dynamic else micro_batch_size)
    trainer.global_steps = 1  # fit() sets it before the first update
    trainer.total_training_steps = 100  # __init__ sets it from the data loader, which the test trainer has none of
    return trainer


# Per problem: rewards of its 4 rollouts (mixed, all wrong, all correct). The dense wrong rewards include -1.
REWARDS = [[1.0, -0.7, 1.0, -1.0], [-1.0, -0.6, -0.9, -1.0], [1.0, 1.0, 1.0, 1.0]]


def rollout_batch(trainer) -> DataProto:
    """12 rollouts of 3 problems, after old log-probs, rewards and GRPO advantages (the batch at step 11 of fit)."""
    batch = make_batch(trainer.tokenizer, PROBLEMS, n=4, seed=3)
    batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(-1).tolist()
    old_log_probs, _ = trainer._compute_old_log_prob(batch)
    batch.batch["old_log_probs"] = old_log_probs.batch["old_log_probs"]
    problem = {uid: k for k, uid in enumerate(dict.fromkeys(sorted(set(batch.non_tensor_batch["uid"]))))}
    seen: dict[str, int] = {}
    rewards = []
    for uid in batch.non_tensor_batch["uid"]:
        rewards.append(REWARDS[problem[uid]][seen.get(uid, 0)])
        seen[uid] = seen.get(uid, 0) + 1
    response_mask = batch.batch["response_mask"]
    last_token = response_mask.sum(-1) - 1
    token_level_rewards = torch.zeros_like(response_mask, dtype=torch.float32)
    token_level_rewards[torch.arange(len(rewards)), last_token] = torch.tensor(rewards)
    batch.batch["token_level_rewards"] = token_level_rewards
    batch.batch["advantages"], _ = compute_cpo_outcome_advantage(
        token_level_rewards, response_mask, batch.non_tensor_batch["uid"]
    )
    trainer.actor_rollout_wg.log_prob_requests.clear()
    return batch
