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
"""A second log-prob pass: score a batch's response tokens the way verl's old-log-prob pass does, on the actor or on
the reference model.

verl's ``RayPPOTrainer.fit`` scores each step's batch with the actor (``_compute_old_log_prob``: ``old_log_probs``,
``entropys``) and, with a KL term, the reference (``_compute_ref_log_prob``: ``ref_log_prob``). A recipe that scores
another batch (CPO's hinted pass: the same responses under a prompt holding the gold solution) or the same batch
once more (CPO's credit dump, for the entropy) calls :func:`score_batch` with the trainer, instead of reaching into
those private methods, which neither pad nor balance, and overwrite nothing of the caller's batch.

What :func:`score_batch` does, and why each step is there:

1. picks the worker group, its mesh and batching knobs: ``on="actor"``: the actor (``actor.use_dynamic_bsz``,
   ``rollout.log_prob_micro_batch_size_per_gpu``, as the old-log-prob pass); ``on="reference"``: the reference model
   (``ref.log_prob_use_dynamic_bsz``, ``ref.log_prob_micro_batch_size_per_gpu``, ``compute_ref_log_prob``), or, when
   the reference lives in the actor (LoRA: ``trainer.ref_in_actor``), the actor without its adapter
   (``no_lora_adapter``), as verl's reference pass;
2. pads the batch with repeats of its first rows to a multiple of the DP size (times the micro-batch size without
   dynamic batch size): verl's dispatch splits rows evenly over DP ranks and fixed micro-batches must divide each
   rank's share, while the caller's batch can have any size;
3. with ``trainer.balance_batch``, spreads the rows over the DP ranks by token count as ``fit`` does (on a shallow
   copy: verl's reorder works in place), then puts the scores back in the caller's row order;
4. sends verl's request of the old-log-prob pass (no padding, ``compute_loss=False``), with the entropy only when
   asked for and without verl 0.9.1's sum of squared probabilities; with the parameters resident (FSDP without
   ``param_offload``) it skips the engine's offload switch, whose only effect then is a ``gc.collect()``;
5. with ``loss_outputs`` (verl 0.9.x only), asks the engine to hand the logits to the worker's installed loss
   (``distillation_use_topk``, ``compute_loss``, with the caller's ``loss_flags``) and returns the per-token outputs
   of the loss's logits call named there, from the same forward (e.g. the credit dump's teacher top ids).

The worker keeps its own batching knobs (dynamic batch size and token budget, or fixed micro-batches): nothing here
sets them, so the pass costs what the tokens scored cost.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from verl import DataProto
from verl.protocol import pad_dataproto_to_divisor
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

from treetune_verl.logits_hook import check_distribution_support

__all__ = ["SCORERS", "Scores", "score_batch"]

#: The models :func:`score_batch` can score with.
SCORERS = ("actor", "reference")
# A column that follows each row through the balancing, to put the scores back in the caller's order.
_ROW = "treetune_second_pass_row"


class Scores(NamedTuple):
    """The outputs of :func:`score_batch`, in the caller's row order, padding of the response width included."""

    log_probs: torch.Tensor  #: ``[N, T]`` float32, log-prob of each response token
    entropy: torch.Tensor | None  #: ``[N, T]`` float32 token entropy when asked for, else None
    loss_outputs: dict[str, torch.Tensor] | None = None  #: name -> ``[N, T]`` float32, the loss's per-token outputs


def score_batch(
    trainer,
    batch: DataProto,
    *,
    on: str = "actor",
    entropy: bool = False,
    loss_outputs: tuple[str, ...] = (),
    loss_flags: dict | None = None,
) -> Scores:
    """Score ``batch``'s responses with the actor or the reference model, as verl's old-log-prob pass does.

    Args:
        trainer: a ``RayPPOTrainer`` after ``init_workers`` (reads ``config``, ``actor_rollout_wg``,
            ``ref_policy_wg``, ``ref_in_actor``, ``_get_dp_size`` and ``_balance_batch``).
        batch: ``N`` rows in verl's padded layout: ``prompts [N, P]`` (left-padded), ``responses [N, T]``,
            ``input_ids``, ``attention_mask`` and ``position_ids [N, P+T]``; its ``meta_info`` (e.g.
            ``temperature``, ``global_token_num``) travels with the request. Left unchanged.
        on: ``"actor"`` (the current policy) or ``"reference"`` (verl's reference model; with LoRA, the actor
            without its adapter).
        entropy: also return the token entropy (the old-log-prob pass's ``entropys``).
        loss_outputs: per-token model outputs of the worker's installed loss to return (its logits call, which the
            engine then makes); empty: the loss is not called.
        loss_flags: non-tensor request flags for that loss.

    Returns:
        :class:`Scores`: ``log_probs [N, T]``, ``entropy [N, T]`` (None unless asked for) and ``loss_outputs``
        (None unless asked for), on the CPU.
    """
    if on not in SCORERS:
        raise ValueError(f"score_batch(on={on!r}): valid values: {', '.join(SCORERS)}.")
    if loss_outputs:
        check_distribution_support()
    actor_rollout_ref = trainer.config.actor_rollout_ref
    lora_reference = on == "reference" and trainer.ref_in_actor
    # SYNC WARNING: verl/trainer/ppo/ray_trainer.py:RayPPOTrainer._compute_ref_log_prob (0.9.1 l.1266-1288, 0.7.1
    # l.1105-1130: compute_ref_log_prob on the reference group, or the actor's compute_log_prob with no_lora_adapter
    # when ref_in_actor) and verl/workers/engine_workers.py:ActorRolloutRefWorker.init_model (the reference's knobs
    # log_prob_micro_batch_size_per_gpu / log_prob_use_dynamic_bsz, 0.9.1 l.546-552, 0.7.1 l.469-475; the actor's
    # rollout.log_prob_micro_batch_size_per_gpu and actor.use_dynamic_bsz, 0.9.1 l.619-625, 0.7.1 l.518-524).
    if on == "reference" and not lora_reference:
        worker_group, mesh, model = trainer.ref_policy_wg, "ref", actor_rollout_ref.ref
        dynamic_bsz = model.log_prob_use_dynamic_bsz
        micro_batch_size = model.log_prob_micro_batch_size_per_gpu
    else:
        worker_group, mesh, model = trainer.actor_rollout_wg, "actor", actor_rollout_ref.actor
        dynamic_bsz = model.use_dynamic_bsz
        micro_batch_size = actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu
    # SYNC WARNING: verl/trainer/ppo/ray_trainer.py:RayPPOTrainer._get_dp_size (0.9.1 l.1162, 0.7.1 l.998: the
    # dispatch info of the mesh)
    dp_size = trainer._get_dp_size(worker_group, mesh)
    divisor = dp_size
    if not dynamic_bsz:
        # SYNC WARNING: verl/workers/engine/utils.py:prepare_micro_batches (0.9.1 l.123-127, 0.7.1 l.90-94: fixed
        # micro-batches must divide each rank's rows)
        divisor *= micro_batch_size
    # SYNC WARNING: verl/protocol.py:pad_dataproto_to_divisor (0.9.1 l.74, 0.7.1 l.73) repeats the first rows, and
    # returns its input itself when no row is needed; DataProto.reorder (0.9.1 l.960, 0.7.1 l.962, used by
    # _balance_batch) works in place: balance a shallow copy, never the caller's batch.
    padded, _ = pad_dataproto_to_divisor(batch, divisor)
    padded = DataProto(
        batch=padded.batch.copy(), non_tensor_batch=dict(padded.non_tensor_batch), meta_info=dict(padded.meta_info)
    )
    padded.batch[_ROW] = torch.arange(len(padded))
    if trainer.config.trainer.balance_batch and dp_size > 1:
        # SYNC WARNING: verl/trainer/ppo/ray_trainer.py:RayPPOTrainer._balance_batch (0.9.1 l.1182, 0.7.1 l.1018:
        # reorders in place over the actor's DP ranks; the metrics dict it fills is dropped)
        trainer._balance_batch(padded, metrics={})
    row = padded.batch.pop(_ROW)
    # SYNC WARNING: verl/trainer/ppo/ray_trainer.py:RayPPOTrainer._compute_old_log_prob (0.9.1 l.1290-1325, 0.7.1
    # l.1132-1161: steps 1-4 of the engine path, tensordict, no padding, request flags, back to padding; 0.9.1 also
    # sends calculate_sum_pi_squared, read like calculate_entropy by the engine's forward, 0.9.1
    # verl/workers/engine/fsdp/transformer_impl.py l.1336, 0.7.1 l.996)
    request = left_right_2_no_padding(padded.to_tensordict())
    tu.assign_non_tensor(
        request, calculate_entropy=entropy, calculate_sum_pi_squared=False, compute_loss=bool(loss_outputs)
    )
    if lora_reference:
        tu.assign_non_tensor(request, no_lora_adapter=True)
    if model.strategy in ("fsdp", "fsdp2") and not model.fsdp_config.get("param_offload", False):
        # SYNC WARNING: verl/workers/engine/base.py:BaseEngineCtx._context_switch (0.9.1 l.314, 0.7.1 l.242; the flag
        # is read by TrainingWorker.infer_batch, verl/workers/engine_workers.py 0.9.1 l.402, 0.7.1 l.358): with
        # resident parameters the eval-mode switch only collects garbage, which the plain pass of the step has done.
        tu.assign_non_tensor(request, disable_auto_offload=True)
    if loss_outputs:
        # SYNC WARNING: verl/workers/engine_workers.py:TrainingWorker.infer_batch (0.9.1 l.398-441: the installed
        # loss runs when compute_loss is set) and verl/workers/engine/utils.py:postprocess_batch_func (every model
        # output of the hook comes back, in the request's row order)
        tu.assign_non_tensor(request, distillation_use_topk=True, distillation_only=False, **(loss_flags or {}))
    method = "compute_ref_log_prob" if mesh == "ref" else "compute_log_prob"
    output = getattr(worker_group, method)(request)

    def in_caller_order(values: torch.Tensor) -> torch.Tensor:
        ordered = torch.empty_like(values)
        ordered[row] = values
        return ordered[: len(batch)]

    def per_token(name: str) -> torch.Tensor:
        return in_caller_order(no_padding_2_padding(tu.get(output, name), request).float())

    extra = {name: per_token(name) for name in loss_outputs} if loss_outputs else None
    return Scores(per_token("log_probs"), per_token("entropy") if entropy else None, extra)
