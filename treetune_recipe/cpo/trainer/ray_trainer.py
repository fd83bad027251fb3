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
"""``RayCPOTrainer``: verl's ``RayPPOTrainer`` plus the recipe's methods (CPO's hint-guided advantage shaping and its
privileged-context peers).

Upstream ``fit()`` runs unchanged. Three methods are overridden, and none names a method: each reads the selected
method's declaration (:mod:`treetune_recipe.cpo.methods.method`):

* ``init_workers`` installs the recipe's loss on the actor workers (``set_loss_fn``; for a distribution-level method
  ``set_loss_fn_with_teacher``, which binds the teacher's forward to it on each worker) and makes every actor update
  return the current-policy entropy the wrappers need.
* ``_update_actor`` runs right after ``compute_advantage`` (where the reference inserted its block): it labels each
  prompt group's difficulty and runs the method's teacher pass, then calls ``super()``. Both passes build their
  teacher rows with the run's context (``teacher.contexts``: ``cpo.context``, else the method's published one; the
  gold solution, the answer, a successful sibling or the environment's feedback):
  - a shaped policy term (``Method.policy="shaped"``): the rows whose shaped advantages read the hint
    (``cpo.hint.rescore=needed``, ``rows_reading_hint``; ``all``: every row) are scored under the context's prompt by
    the run's teacher (``teacher_log_probs``; ``old_log_probs`` on the other rows and on the rows without a context);
  - a distribution-level method: every row's teacher prompt travels with the update's batch as token columns
    (``treetune_verl.update_teacher``), and the update runs with the student's logits handed to the loss
    (``student_logits_in_update``), which runs the teacher's forward on the same micro-batch, on the worker: no
    teacher pass before the update, no top-k tensor through the driver.
  The method's schedule sets the step's knobs; the teacher (:class:`treetune_recipe.cpo.teacher.weights.Teacher`)
  changes its weights before the reference pass (``refreshed``) or after an update that changed the actor (``ema``).
* ``_compute_ref_log_prob`` first lets the teacher take the actor's weights when due, then runs verl's reference pass
  only when something reads its log-probs (a KL term in the loss or the reward, or ``cpo.drift_metrics``).

CPO is opt-in through ``algorithm.adv_estimator=cpo``: with any other estimator this class behaves exactly like
``RayPPOTrainer``, plus its two mixins, which apply to every estimator: ``CompleteCheckpointsMixin`` (checkpoint
markers) and ``RolloutHealthMixin`` (``treetune_verl.rollout_health``: after the old-log-prob pass of each step it
compares the rollout's and the trainer's log-probs, warns or stops the run, and both paths of ``_update_actor`` end in
its ``_update_actor``, which adds ``treetune/rollout_health/*`` to the step's metrics).
"""

from __future__ import annotations

import contextlib
import math
import resource
from functools import partial

import numpy as np
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.debug import marked_timer

from treetune_recipe.cpo.config import CPOConfig
from treetune_recipe.cpo.methods.advantage_terms import succeeded
from treetune_recipe.cpo.methods.core_algos import compute_difficulty_mask  # importing registers the "cpo" estimator
from treetune_recipe.cpo.methods.cpo_wrappers import log_ratio, mutual_information
from treetune_recipe.cpo.methods.loss import CONTEXT_MASK, cpo_ppo_loss
from treetune_recipe.cpo.methods.registry import rows_reading_hint
from treetune_recipe.cpo.reports.credit_dump import maybe_dump_credit
from treetune_recipe.cpo.teacher.weights import Teacher
from treetune_recipe.cpo.trainer.preflight import cpo_is_enabled
from treetune_verl.checkpoint_saves import CompleteCheckpointsMixin
from treetune_verl.patches import request_entropy_in_actor_updates
from treetune_verl.rescoring import score_batch
from treetune_verl.rollout_health import RolloutHealthMixin


class RayCPOTrainer(CompleteCheckpointsMixin, RolloutHealthMixin, RayPPOTrainer):
    """GRPO trainer with the recipe's methods (see the module docstring); its checkpoints are marked complete, and
    every step's rollout-vs-trainer log-prob mismatch is checked before any update (``treetune.rollout_health``)."""

    def __init__(self, *args, cpo_config: CPOConfig | None = None, **kwargs):
        """``cpo_config``: the ``CPOConfig`` the driver built and checked before Ray started
        (``preflight.check_cpo_run``), handed on by the TaskRunner; None builds it from the config's ``cpo`` block
        (tests, other entry points). A GRPO run of the recipe reads its ``success_value`` too."""
        super().__init__(*args, **kwargs)
        self.cpo_enabled = cpo_is_enabled(self.config)
        self.cpo_config = cpo_config if cpo_config is not None else CPOConfig.from_config(self.config.get("cpo"))
        self.method = self.cpo_config.selected_method
        if self.cpo_enabled:
            data = self.config.data
            # The teacher's context (cpo.context, else the method's published one) builds the rows of both teacher
            # passes; its prompt limit is its own (teacher.contexts.TeacherContext.resolve_hint).
            self.context = self.cpo_config.teacher_context
            self.hint_config = self.context.resolve_hint(
                self.cpo_config.hint, data.max_prompt_length, data.max_response_length
            )
            self.teacher = Teacher(self.cpo_config.teacher_config)
            self.installed_config: CPOConfig | None = None
            print(f"[cpo] method: {self.method.describe(self.context.name, self.cpo_config.knobs)}")
            source = "cpo.context" if self.cpo_config.context else f"published setting of {self.method.name}"
            print(f"[cpo] teacher context: {self.context.name} ({source})")
            print(f"[cpo] teacher of the hinted pass: {self.teacher.name} ({self.teacher.config.describe()})")

    def init_workers(self):
        super().init_workers()
        if not self.cpo_enabled:
            return
        self._install_cpo_loss(self.cpo_config)
        request_entropy_in_actor_updates(self.actor_rollout_wg)

    def _save_extra_checkpoint_state(self, folder: str) -> None:
        """A moving teacher's state and weights, beside verl's checkpoint (``Teacher.save``): with every checkpoint
        (``cpo.teacher_checkpoint``), and with the run's last one in any case (the trained teacher)."""
        last = self.global_steps >= self.total_training_steps
        if self.cpo_enabled and (self.cpo_config.teacher_checkpoint or last):
            self.teacher.save(folder, self.global_steps, self.actor_rollout_wg, keep_weights=last)

    def _load_extra_checkpoint_state(self, folder: str) -> None:
        """The moving teacher of the checkpoint ``folder`` (``Teacher.resume``)."""
        if self.cpo_enabled and self.cpo_config.teacher_checkpoint:
            self.teacher.resume(folder, self.global_steps, self.actor_rollout_wg)

    def _install_cpo_loss(self, cpo_config: CPOConfig) -> None:
        """Install ``cpo_ppo_loss`` with ``cpo_config`` on every actor worker (the loss reads its knobs there), unless
        the same knobs are installed already."""
        if cpo_config == self.installed_config:
            return
        # SYNC WARNING: verl/workers/engine_workers.py:ActorRolloutRefWorker.init_model builds the same ActorConfig
        # from the same config section and installs partial(ppo_loss, config=...); set_loss_fn replaces it.
        actor_section = self.config.actor_rollout_ref.actor
        if not self._reference_log_probs_read():
            # No reference pass runs (its log-probs are unread: a KL loss of weight 0), so the loss has no KL term.
            actor_section = OmegaConf.merge(actor_section, {"use_kl_loss": False})
        loss = partial(cpo_ppo_loss, config=omega_conf_to_dataclass(actor_section), cpo=cpo_config)
        if self.method.distribution_level:
            # SYNC WARNING: treetune_verl/teacher_worker.py relies on the fused ActorRolloutRefWorker
            teacher_model = "reference" if self.teacher.scorer == "reference" else "actor"
            self.actor_rollout_wg.set_loss_fn_with_teacher(loss, teacher_model)
        else:
            self.actor_rollout_wg.set_loss_fn(loss)
        self.installed_config = cpo_config

    def _reference_log_probs_read(self) -> bool:
        """Whether anything reads verl's reference log-probs (``ref_log_prob``) in a CPO run: a KL loss of nonzero
        weight, a KL penalty in the reward, the method's reference term (SDPG's α), or ``cpo.drift_metrics``. A
        reference teacher is scored by passes of its
        own (or inside the update), never from them."""
        actor = self.config.actor_rollout_ref.actor
        kl_loss = bool(actor.get("use_kl_loss", False)) and float(actor.get("kl_loss_coef", 0.0)) != 0.0
        kl_reward = bool(self.config.algorithm.get("use_kl_in_reward", False))
        reference_term = self.cpo_config.selected_method.reference is not None
        return kl_loss or kl_reward or reference_term or self.cpo_config.drift_metrics

    def _update_actor(self, batch: DataProto) -> DataProto:
        seq_rewards = batch.batch["token_level_rewards"].sum(dim=-1).float()
        group_metrics = {**self._group_outcome_metrics(batch, seq_rewards), **drift_from_reference_metrics(batch)}
        if not self.cpo_enabled:
            actor_output = super()._update_actor(batch)
            actor_output.meta_info["metrics"].update({**group_metrics, **driver_footprint_metrics(batch)})
            return actor_output

        timing: dict[str, float] = {}
        difficulty = compute_difficulty_mask(
            seq_rewards,
            batch.non_tensor_batch["uid"],
            mode=self.cpo_config.difficulty_mode,
            success_value=self.cpo_config.success_value,
        )
        # The knobs of this step (the method's schedule, e.g. RLSD's decaying λ): the loss and the credit dump use them.
        step_config, schedule_metrics = self.cpo_config.at_step(self.global_steps, self.total_training_steps)
        self._install_cpo_loss(step_config)
        # A credit-dump step scores every row under the hint, so the dump shows the real δ of each response it keeps
        # (the shaped advantages are the same either way: methods.registry.rows_reading_hint).
        dump_step = self.global_steps in self.cpo_config.credit_dump.steps
        hint_metrics, hint_batch = {}, None
        if self.method.policy == "shaped":
            teacher_log_probs, scored_rows, hint_metrics, hint_batch = self._hint_log_probs(
                batch, seq_rewards, difficulty, timing, score_all=dump_step
            )
        else:
            # No sampled-token pass: teacher_log_probs = old_log_probs, and no row's δ statistics are logged.
            teacher_log_probs = batch.batch["old_log_probs"].clone()
            scored_rows = torch.zeros(len(batch), dtype=torch.bool)
        if self.method.distribution_level:
            distribution_metrics, hint_batch = self._distribution_teacher_pass(batch, seq_rewards, timing)
            hint_metrics = {**distribution_metrics, **hint_metrics}
        batch.batch["teacher_log_probs"] = teacher_log_probs
        batch.batch["seq_rewards"] = seq_rewards
        batch.batch["difficulty"] = difficulty
        if dump_step:
            maybe_dump_credit(self, batch, hint_batch, step_config)

        # SYNC WARNING: verl/trainer/ppo/ray_trainer.py:RayPPOTrainer._update_actor returns metrics in
        # meta_info["metrics"] and prefixes the loss's metrics with "actor/"; fit() reduces and logs them.
        with self._distribution_update(batch):
            actor_output = super()._update_actor(batch)
        teacher_metrics = self.teacher.metrics(self.global_steps)
        self.teacher.after_update(self.global_steps, self.actor_rollout_wg, actor_changed=actor_changed(actor_output))
        actor_output.meta_info["metrics"].update(
            {
                **hint_metrics,
                **schedule_metrics,
                **teacher_metrics,
                **group_metrics,
                **self._step_cpo_metrics(batch, scored_rows),
                **driver_footprint_metrics(batch),
                **{f"timing_s/{name}": seconds for name, seconds in timing.items()},
            }
        )
        return actor_output

    @contextlib.contextmanager
    def _distribution_update(self, batch: DataProto):
        """A distribution-level method's update: the student's logits go to the loss (verl 0.9.1's hook). The batch's
        response mask is the policy term's (every row); the distillation term masks itself by ``cpo_context_mask``."""
        if not self.method.distribution_level:
            yield
            return
        from treetune_verl.logits_hook import student_logits_in_update

        with student_logits_in_update(self.actor_rollout_wg):
            yield

    def _distribution_teacher_pass(
        self, batch: DataProto, seq_rewards: torch.Tensor, timing: dict[str, float]
    ) -> tuple[dict[str, float], DataProto]:
        """Add the teacher's rows (``update_teacher.TEACHER_COLUMNS``: the context's prompt and the same response) and
        the context mask to ``batch``; the teacher's forward runs in the update, on the worker.

        The teacher prompt of every row comes from the run's context (``teacher.contexts``, ``cpo.context`` or the
        method's published one).

        Returns:
            ``(metrics, teacher_batch)``; metrics: the context's (``cpo/context_frac``, ``cpo/context_token_frac``),
            ``cpo/topk_k`` (0: the whole vocabulary) and ``cpo/hint_token_ratio`` (the teacher rows' tokens over the
            plain rows').
        """
        from treetune_verl.update_teacher import teacher_columns

        with marked_timer("cpo_teacher_context", timing):
            teacher_batch, has_context, metrics = self._build_teacher_rows(batch, seq_rewards)
        batch.batch.update(teacher_columns(teacher_batch))
        batch.batch[CONTEXT_MASK] = has_context.float()
        response_mask = batch.batch["response_mask"]
        context_tokens = (response_mask * batch.batch[CONTEXT_MASK][:, None]).sum()
        metrics["cpo/context_token_frac"] = (context_tokens / response_mask.sum().clamp(min=1)).item()
        metrics["cpo/topk_k"] = float(self.cpo_config.topk)
        plain_tokens = batch.batch["attention_mask"].sum()
        metrics["cpo/hint_token_ratio"] = (teacher_batch.batch["attention_mask"].sum() / plain_tokens).item()
        metrics["cpo/hint_rows_frac"] = 1.0
        return metrics, teacher_batch

    def _hint_log_probs(
        self,
        batch: DataProto,
        seq_rewards: torch.Tensor,
        difficulty: torch.Tensor,
        timing: dict[str, float],
        score_all: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float], DataProto | None]:
        """``teacher_log_probs`` of the batch: the rows that read them scored under the run's teacher context (the hint
        prompt of the gold solution, the answer, a sibling or the feedback: ``teacher.contexts``), ``old_log_probs``
        elsewhere.

        Rows without a context (no solution with ``cpo.hint.on_missing=skip``, no answer, no successful sibling, no
        feedback) also keep their ``old_log_probs``: log-ratio 0. A step where no row reads the hint runs neither the
        hint-batch build nor the hinted pass.

        Args:
            score_all: score every row, as with ``cpo.hint.rescore=all`` (credit-dump steps).

        Returns:
            ``(teacher_log_probs [B, T], scored_rows bool [B], metrics, hint_batch)``; ``scored_rows`` are the rows
            really scored under a hint prompt; ``metrics`` has ``cpo/hint_rows_frac``, ``cpo/hint_token_ratio`` (tokens
            of the hinted pass over tokens of the old-log-prob pass, both without padding; 0 without a pass) and, when
            a pass ran, the context's metrics (``cpo/context_frac`` over the selected rows); ``hint_batch`` holds the
            teacher prompts of the selected rows (None when no pass ran).
        """
        old_log_probs = batch.batch["old_log_probs"]
        if self.hint_config.rescore == "all" or score_all:
            rows = torch.ones(len(batch), dtype=torch.bool)
        else:
            rows = rows_reading_hint(
                self.cpo_config.method,
                seq_rewards=seq_rewards,
                difficulty=difficulty,
                cfg=self.cpo_config,
                advantages=batch.batch["advantages"],
            ).cpu()
        metrics = {"cpo/hint_rows_frac": rows.float().mean().item(), "cpo/hint_token_ratio": 0.0}
        teacher_log_probs = old_log_probs.clone()
        scored_rows = torch.zeros(len(batch), dtype=torch.bool)
        if not rows.any():
            return teacher_log_probs, scored_rows, metrics, None

        with marked_timer("cpo_hint_batch", timing):
            hint_batch, has_context, build_metrics = self._build_teacher_rows(batch, seq_rewards, rows=rows)
        with marked_timer("cpo_gw_log_prob", timing):
            hinted = self._score_hint_batch(hint_batch).to(old_log_probs.device)
        has_context = has_context.to(old_log_probs.device)
        hinted = torch.where(has_context[:, None], hinted * batch.batch["response_mask"][rows], old_log_probs[rows])
        teacher_log_probs[rows] = hinted
        scored_rows[rows] = has_context.cpu()
        plain_tokens = batch.batch["attention_mask"].sum()
        metrics["cpo/hint_token_ratio"] = (hint_batch.batch["attention_mask"].sum() / plain_tokens).item()
        return teacher_log_probs, scored_rows, {**metrics, **build_metrics}, hint_batch

    def _build_teacher_rows(
        self, batch: DataProto, seq_rewards: torch.Tensor, rows: torch.Tensor | None = None
    ) -> tuple[DataProto, torch.Tensor, dict[str, float]]:
        """The teacher rows of ``batch``'s rows ``rows`` (None: all) under the run's context
        (``TeacherContext.build``): ``(teacher_batch, has_context bool [N], metrics)``."""
        return self.context.build(
            batch,
            tokenizer=self.tokenizer,
            hint_config=self.hint_config,
            success=succeeded(seq_rewards, self.cpo_config.success_value),
            cpo=self.cpo_config,
            rows=rows,
            chat_template_kwargs=self.config.data.get("apply_chat_template_kwargs", None),
        )

    def _score_hint_batch(self, hint_batch: DataProto) -> torch.Tensor:
        """Log-probs ``[N, T]`` of the hint batch's responses under the run's teacher (the actor for ``policy``, verl's
        reference model otherwise; with LoRA the actor without its adapter), scored as verl's old-log-prob pass scores
        the plain batch, without the entropy (the wrappers read the plain pass's):
        ``treetune_verl.rescoring.score_batch``."""
        return score_batch(self, hint_batch, on=self.teacher.scorer).log_probs

    def _compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        """verl's reference pass, after the teacher took the actor's weights when due
        (``Teacher.before_reference_pass``); skipped (no ``ref_log_prob`` key) when nothing reads its log-probs
        (``_reference_log_probs_read``: the peers' published KL loss of weight 0).

        The reference pass is the first use of the reference weights in a step (``fit``: rollout, old log-probs,
        reference log-probs, advantages, actor update), so the step's KL term and teacher pass read the same weights.
        """
        if not self.cpo_enabled:
            return super()._compute_ref_log_prob(batch)
        self.teacher.before_reference_pass(self.global_steps, self.actor_rollout_wg)
        if not self._reference_log_probs_read():
            # SYNC WARNING: verl/trainer/ppo/ray_trainer.py:RayPPOTrainer.fit (0.9.1 l.1618-1622, 0.7.1 l.1437-1441:
            # batch.union of what this returns): an empty table of the batch's rows adds no key.
            return DataProto(batch=TensorDict({}, batch_size=[len(batch)]))
        return super()._compute_ref_log_prob(batch)

    def _group_outcome_metrics(self, batch: DataProto, seq_rewards: torch.Tensor) -> dict[str, float]:
        """Shares of the batch's responses in all-wrong and all-correct prompt groups (``uid``) and of correct ones,
        for every estimator (GRPO too), whatever ``cpo.difficulty_mode``: a group of equal ±1 rewards has GRPO
        advantage 0, so ``cpo/group_all_wrong_frac`` is the share of responses a hint-free method cannot learn from."""
        success_value = self.cpo_config.success_value
        labels = compute_difficulty_mask(seq_rewards, batch.non_tensor_batch["uid"], success_value=success_value)
        return {
            "cpo/group_all_wrong_frac": (labels == -1).float().mean().item(),
            "cpo/group_all_correct_frac": (labels == 1).float().mean().item(),
            "cpo/success_frac": succeeded(seq_rewards, success_value).float().mean().item(),
        }

    def _step_cpo_metrics(self, batch: DataProto, scored_rows: torch.Tensor) -> dict[str, float]:
        """Batch-level CPO diagnostics, exact over the step's valid tokens (the loss adds the advantage changes).

        The log-ratio and MI statistics cover the rows scored under a hint prompt (``scored_rows``); each is left
        out when there is none (e.g. ``cpo/{log_ratio,mi}_mean/correct`` for a step without scored correct rows).
        """
        valid = batch.batch["response_mask"].bool()
        teacher_log_probs, old_log_probs = batch.batch["teacher_log_probs"], batch.batch["old_log_probs"]
        ratios, mis = log_ratio(teacher_log_probs, old_log_probs), mutual_information(teacher_log_probs, old_log_probs)
        correct_rows = succeeded(batch.batch["seq_rewards"], self.cpo_config.success_value)
        metrics = {}
        scored_tokens = valid & scored_rows.to(valid.device)[:, None]
        if scored_tokens.any():
            metrics["cpo/gw_minus_old_mean"] = ratios[scored_tokens].mean().item()
            metrics["cpo/gw_minus_old_absmean"] = ratios[scored_tokens].abs().mean().item()
        splits = (
            (correct_rows, "cpo/log_ratio_mean/correct", "cpo/mi_mean/correct"),
            (~correct_rows, "cpo/log_ratio_mean/wrong", "cpo/mi_mean/wrong"),
        )
        for rows, ratio_key, mi_key in splits:
            tokens = scored_tokens & rows[:, None]
            if tokens.any():
                metrics[ratio_key] = ratios[tokens].mean().item()
                metrics[mi_key] = mis[tokens].mean().item()
        if "acc" in batch.non_tensor_batch:
            metrics["cpo/acc_mean"] = float(np.mean(batch.non_tensor_batch["acc"].astype(float)))
        return metrics


def driver_footprint_metrics(batch: DataProto) -> dict[str, float]:
    """What the step costs the driver (verl's TaskRunner process): ``treetune/update_actor_mb``, the MB of the batch's
    tensors handed to ``update_actor`` (before verl drops padding; ``..._rows`` and ``..._width``: its rows and response
    width), and ``treetune/driver_peak_rss_mb``, the process's peak resident memory so far (``ru_maxrss``)."""
    handed = sum(tensor.numel() * tensor.element_size() for tensor in batch.batch.values())
    return {
        "treetune/update_actor_mb": handed / 2**20,
        "treetune/update_actor_rows": float(len(batch)),
        "treetune/update_actor_width": float(batch.batch["responses"].shape[1]),
        "treetune/driver_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def actor_changed(actor_output: DataProto) -> bool:
    """Whether the actor update changed the weights: some optimizer step had a finite gradient norm (verl's engine
    skips a step whose norm is not finite). True when the update reports no norm."""
    norms = actor_output.meta_info["metrics"].get("actor/grad_norm")
    if norms is None:
        return True
    norms = norms if isinstance(norms, list | tuple) else [norms]
    return any(math.isfinite(float(norm)) for norm in norms)


def drift_from_reference_metrics(batch: DataProto) -> dict[str, float]:
    """How far the rollout policy has moved from the reference weights, unclamped, when the step has reference
    log-probs (``ref_log_prob``: verl's reference pass ran, with a KL term read or ``cpo.drift_metrics``).

    ``treetune/drift/old_minus_ref_mean`` is the mean over response tokens of ``old_log_probs - ref_log_prob``, the
    k1 estimate of KL(π_old ‖ π_ref) per token (unbiased on the rollout's own samples, and never clamped, unlike
    verl's ``low_var_kl``, which saturates at 10 per token); ``treetune/drift/old_minus_ref_seq_mean`` sums it over
    each response first (an estimate of the sequence KL). The reference is the starting model, except under a
    ``refreshed`` teacher, where it restarts from the actor at each refresh.
    """
    if "ref_log_prob" not in batch.batch.keys():
        return {}
    mask = batch.batch["response_mask"].float()
    log_ratio = (batch.batch["old_log_probs"].float() - batch.batch["ref_log_prob"].float()) * mask
    return {
        "treetune/drift/old_minus_ref_mean": (log_ratio.sum() / mask.sum().clamp(min=1)).item(),
        "treetune/drift/old_minus_ref_seq_mean": log_ratio.sum(dim=-1).mean().item(),
    }
