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
"""``RayCPOTrainer``: verl's ``RayPPOTrainer`` plus CPO's hint-guided advantage shaping.

Upstream ``fit()`` runs unchanged. Two methods are overridden:

* ``init_workers`` installs the CPO loss on the actor workers (``set_loss_fn``) and makes every actor update return the
  current-policy entropy the wrappers need.
* ``_update_actor`` runs right after ``compute_advantage`` (where the reference inserted its block): it labels each
  prompt group's difficulty, builds the hint-guided batch, scores the *same* response tokens under it with the actor
  (``gw_log_probs``), adds ``gw_log_probs``/``seq_rewards``/``difficulty`` to the batch and calls ``super()``.

CPO is opt-in through ``algorithm.adv_estimator=cpo``: with any other estimator this class behaves exactly like
``RayPPOTrainer``.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import torch
from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.debug import marked_timer

from treetune_recipe.cpo.config import CPOConfig
from treetune_recipe.cpo.cpo_core_algos import (  # importing registers the "cpo" estimator
    compute_difficulty_mask,
    log_ratio,
    mutual_information,
)
from treetune_recipe.cpo.cpo_credit_dump import CreditDumpConfig, maybe_dump_credit
from treetune_recipe.cpo.cpo_hint import HintConfig, build_hint_batch
from treetune_recipe.cpo.cpo_loss import cpo_ppo_loss
from treetune_recipe.cpo.preflight import check_cpo_config, cpo_is_enabled
from treetune_verl.patches import request_entropy_in_actor_updates


class RayCPOTrainer(RayPPOTrainer):
    """GRPO trainer with CPO advantage shaping (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cpo_enabled = cpo_is_enabled(self.config)
        if self.cpo_enabled:
            check_cpo_config(self.config)
            self.cpo_config = CPOConfig.from_config(self.config.cpo)
            self.hint_config = HintConfig.from_config(self.cpo_config.hint).resolve(self.config.data.max_prompt_length)
            self.credit_dump_config = CreditDumpConfig.from_config(self.cpo_config.credit_dump)

    def init_workers(self):
        super().init_workers()
        if not self.cpo_enabled:
            return
        # SYNC WARNING: verl/workers/engine_workers.py:ActorRolloutRefWorker.init_model builds the same ActorConfig
        # from the same config section and installs partial(ppo_loss, config=...); set_loss_fn replaces it.
        actor_config = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor)
        self.actor_rollout_wg.set_loss_fn(partial(cpo_ppo_loss, config=actor_config, cpo=self.cpo_config))
        request_entropy_in_actor_updates(self.actor_rollout_wg)

    def _update_actor(self, batch: DataProto) -> DataProto:
        if not self.cpo_enabled:
            return super()._update_actor(batch)

        timing: dict[str, float] = {}
        response_mask = batch.batch["response_mask"]
        seq_rewards = batch.batch["token_level_rewards"].sum(dim=-1).float()
        difficulty = compute_difficulty_mask(
            seq_rewards,
            batch.non_tensor_batch["uid"],
            mode=self.cpo_config.difficulty_mode,
            success_value=self.cpo_config.success_value,
        )

        with marked_timer("cpo_hint_batch", timing):
            hint_batch, hint_metrics = build_hint_batch(
                batch,
                self.tokenizer,
                self.hint_config,
                chat_template_kwargs=self.config.data.get("apply_chat_template_kwargs", None),
            )
        with marked_timer("cpo_gw_log_prob", timing):
            # SYNC WARNING: verl/trainer/ppo/ray_trainer.py:RayPPOTrainer._compute_old_log_prob returns (DataProto, mfu)
            hint_log_probs, _ = self._compute_old_log_prob(hint_batch)
        gw_log_probs = hint_log_probs.batch["old_log_probs"].to(response_mask.device) * response_mask
        hint_missing = torch.as_tensor(hint_batch.non_tensor_batch["hint_missing"].astype(bool))
        # Groups without a solution keep their plain log-probs: the log-ratio is 0 there.
        gw_log_probs = torch.where(hint_missing[:, None], batch.batch["old_log_probs"], gw_log_probs)

        batch.batch["gw_log_probs"] = gw_log_probs
        batch.batch["seq_rewards"] = seq_rewards
        batch.batch["difficulty"] = difficulty
        maybe_dump_credit(self, batch, hint_batch)  # cpo.credit_dump: writes only at the listed steps

        # SYNC WARNING: verl/trainer/ppo/ray_trainer.py:RayPPOTrainer._update_actor returns metrics in
        # meta_info["metrics"] and prefixes the loss's metrics with "actor/"; fit() reduces and logs them.
        actor_output = super()._update_actor(batch)
        actor_output.meta_info["metrics"].update(
            {
                **hint_metrics,
                **self._step_cpo_metrics(batch),
                **{f"timing_s/{name}": seconds for name, seconds in timing.items()},
            }
        )
        return actor_output

    def _step_cpo_metrics(self, batch: DataProto) -> dict[str, float]:
        """Batch-level CPO diagnostics, exact over the step's valid tokens (the loss adds the advantage changes).

        ``cpo/{log_ratio,mi}_mean/{correct,wrong}`` are left out for a step without correct (or wrong) responses.
        """
        valid = batch.batch["response_mask"].bool()
        gw_log_probs, old_log_probs = batch.batch["gw_log_probs"], batch.batch["old_log_probs"]
        ratios, mis = log_ratio(gw_log_probs, old_log_probs), mutual_information(gw_log_probs, old_log_probs)
        correct_rows = batch.batch["seq_rewards"] == self.cpo_config.success_value
        difficulty = batch.batch["difficulty"]
        metrics = {
            "cpo/gw_minus_old_mean": ratios[valid].mean().item(),
            "cpo/gw_minus_old_absmean": ratios[valid].abs().mean().item(),
            "cpo/group_all_wrong_frac": (difficulty == -1).float().mean().item(),
            "cpo/group_all_correct_frac": (difficulty == 1).float().mean().item(),
            "cpo/success_frac": correct_rows.float().mean().item(),
        }
        splits = (
            (correct_rows, "cpo/log_ratio_mean/correct", "cpo/mi_mean/correct"),
            (~correct_rows, "cpo/log_ratio_mean/wrong", "cpo/mi_mean/wrong"),
        )
        for rows, ratio_key, mi_key in splits:
            tokens = valid & rows[:, None]
            if tokens.any():
                metrics[ratio_key] = ratios[tokens].mean().item()
                metrics[mi_key] = mis[tokens].mean().item()
        if "acc" in batch.non_tensor_batch:
            metrics["cpo/acc_mean"] = float(np.mean(batch.non_tensor_batch["acc"].astype(float)))
        return metrics
