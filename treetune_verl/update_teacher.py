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
"""A teacher forward inside the actor's update, beside the student (verl 0.9.x, FSDP engine).

A distribution-level loss compares the student's next-token distribution under the plain prompt with a teacher's
under a prompt holding privileged context, at every response token. The official codes of OPSD, SDPO, RLSD and
TRL's SDPO compute both in the same micro-batch of the update, in the process that holds the student; so does this
module. Only token columns travel with the update's batch (:func:`teacher_columns`: the teacher's prompt and the same
response, ``[B, tokens]``); the teacher's logits exist on the worker only, one micro-batch at a time.

- Driver: :func:`teacher_columns` turns the teacher batch (same rows, same responses, the context's prompts) into the
  columns :data:`TEACHER_COLUMNS`, added to the batch sent to ``update_actor``.
- Worker: :class:`UpdateTeacher` wraps the engine that scores the teacher (the reference's, or the actor's own for a
  ``policy`` teacher; with LoRA, the actor without its adapter) and, called from the student's logits hook
  (:mod:`treetune_verl.logits_hook`), runs one no-grad forward of the micro-batch's teacher rows through that
  engine's own ``forward_step`` (its packing, temperature and logits handling) and returns the teacher's
  (temperature-scaled) logits at each response token, ``[M, V]`` on the device, in the engine's dtype.

Every data-parallel rank runs the teacher forward once per micro-batch of the update, because verl gives the ranks the
same number of micro-batches (``same_micro_num_in_dp``): the teacher's FSDP collectives line up. Sequence parallelism
is not supported (the hook would see a shard of the packed rows).
"""

from __future__ import annotations

import contextlib

import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import left_right_2_no_padding

from treetune_verl.logits_hook import response_index

__all__ = ["TEACHER_COLUMNS", "TeacherRows", "UpdateTeacher", "teacher_columns"]

#: Columns of the update's batch that carry the teacher's rows, left-padded prompt then right-padded response
#: (``[B, P_teacher + T]``, the response part the same tokens as the batch's ``responses``).
TEACHER_INPUT_IDS = "treetune_teacher_input_ids"
TEACHER_ATTENTION_MASK = "treetune_teacher_attention_mask"
TEACHER_POSITION_IDS = "treetune_teacher_position_ids"
TEACHER_COLUMNS = (TEACHER_INPUT_IDS, TEACHER_ATTENTION_MASK, TEACHER_POSITION_IDS)
#: Request flags of a micro-batch that only the student's pass reads (the teacher's forward turns them off).
_STUDENT_ONLY_FLAGS = dict(calculate_entropy=False, calculate_sum_pi_squared=False)


def teacher_columns(teacher_batch) -> dict[str, torch.Tensor]:
    """The teacher's rows of a verl batch (``input_ids``, ``attention_mask``, ``position_ids``, ``[B, P_t + T]``) as the
    update's columns :data:`TEACHER_COLUMNS`. The teacher batch must hold the update's responses in the same rows."""
    tensors = teacher_batch.batch
    return {
        TEACHER_INPUT_IDS: tensors["input_ids"],
        TEACHER_ATTENTION_MASK: tensors["attention_mask"],
        TEACHER_POSITION_IDS: tensors["position_ids"],
    }


def teacher_micro_batch(micro_batch: TensorDict) -> TensorDict:
    """The teacher's rows of an update micro-batch, in the engine's no-padding layout, with the micro-batch's request
    flags (temperature, padding mode, fused kernels) and the teacher's forward flags: the logits hook on, no log-prob,
    entropy or loss of the engine's own (``distillation_only``)."""
    missing = [key for key in TEACHER_COLUMNS if key not in micro_batch.keys()]
    if missing:
        raise KeyError(f"the update's micro-batch lacks the teacher columns {missing} (treetune_verl.update_teacher)")
    input_ids = micro_batch[TEACHER_INPUT_IDS]
    attention_mask = micro_batch[TEACHER_ATTENTION_MASK]
    responses = micro_batch["responses"]
    prompt_width = input_ids.shape[1] - responses.shape[1]
    if not torch.equal(input_ids[:, prompt_width:].to(responses.device), responses):
        raise ValueError("the teacher columns hold other response tokens than the update's batch (rows out of order?)")
    rows = TensorDict(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": micro_batch[TEACHER_POSITION_IDS],
            "prompts": input_ids[:, :prompt_width],
            "responses": responses,
            "response_mask": attention_mask[:, prompt_width:],
        },
        batch_size=[input_ids.shape[0]],
        device=input_ids.device,
    )
    rows = left_right_2_no_padding(rows)
    # SYNC WARNING: verl/workers/engine/fsdp/transformer_impl.py:FSDPEngineWithLMHead.prepare_model_inputs (0.9.1
    # l.1145-1160: the micro-batch's temperature, use_remove_padding, pad_mode, use_fused_kernels) and
    # .prepare_model_outputs (l.1332-1341 and l.1411-1421: distillation_use_topk hands the logits to the loss,
    # distillation_only skips the log-probs)
    temperature = micro_batch.get("temperature", None)
    if isinstance(temperature, torch.Tensor) and temperature.dim() > 0:  # one temperature per row
        rows["temperature"] = temperature
    elif temperature is not None:
        tu.assign_non_tensor(rows, temperature=tu.get_non_tensor_data(data=micro_batch, key="temperature", default=1.0))
    for key in ("use_remove_padding", "pad_mode", "use_fused_kernels", "sp_size", "pad_token_id"):
        value = tu.get_non_tensor_data(data=micro_batch, key=key, default=None)
        if value is not None:
            tu.assign_non_tensor(rows, **{key: value})
    tu.assign_non_tensor(rows, distillation_use_topk=True, distillation_only=True, **_STUDENT_ONLY_FLAGS)
    return rows


class TeacherRows:
    """The teacher at the response tokens of one micro-batch: ``logits [M, V]`` (temperature-scaled, the engine's
    dtype; their log-softmax is the teacher's distribution) for the ``valid [B, T]`` response slots, row-major."""

    def __init__(self, logits: torch.Tensor, valid: torch.Tensor):
        self.logits, self.valid = logits, valid


class _LogitsCatcher:
    """The loss of the teacher's forward: keeps the response rows of the logits the engine hands its hook, returns
    no model output there and a zero loss from the loss call."""

    def __init__(self):
        self.rows: TeacherRows | None = None

    def __call__(self, *, data: TensorDict, student_logits=None, model_output=None, dp_group=None):
        # SYNC WARNING: verl/workers/engine/fsdp/transformer_impl.py:FSDPEngineWithLMHead.forward_step (0.9.1
        # l.1549-1590: the hook call student_logits=, data=, then loss_function(model_output=, data=, dp_group=))
        if student_logits is None:
            return torch.zeros((), device=data["input_ids"].device), {}
        packed, index, valid = response_index(student_logits, data)
        self.rows = TeacherRows(packed.index_select(0, index), valid)  # a copy: the full logits are freed after
        return {}


class UpdateTeacher:
    """The teacher's forward on the worker that holds the student (see the module docstring).

    Args:
        engine: the verl engine whose module is the teacher (``TrainingWorker.engine`` of the reference, or of the
            actor for a ``policy`` teacher).
        without_adapter: run the actor's engine with its LoRA adapter off (the reference inside the actor).
        name: what the teacher is, for messages.
    """

    def __init__(self, engine, *, without_adapter: bool = False, name: str = "teacher"):
        self.engine, self.without_adapter, self.name = engine, without_adapter, name
        self.forwards = 0  #: teacher forwards run by this process (one per update micro-batch)

    @torch.no_grad()
    def __call__(self, micro_batch: TensorDict) -> TeacherRows:
        """The teacher's logits at each response token of ``micro_batch`` (an update micro-batch holding
        :data:`TEACHER_COLUMNS`), from one forward of its teacher rows."""
        rows = teacher_micro_batch(micro_batch)
        catcher = _LogitsCatcher()
        adapter_off = self.engine.disable_adapter() if self.without_adapter else contextlib.nullcontext()
        # SYNC WARNING: verl/workers/engine/fsdp/transformer_impl.py:FSDPEngineWithLMHead.forward_step (0.9.1
        # l.1549: moves the micro-batch to the device, packs it, runs the module under its autocast dtype)
        with adapter_off:
            self.engine.forward_step(rows, loss_function=catcher, forward_only=True)
        self.forwards += 1
        if catcher.rows is None:
            raise RuntimeError(
                f"the {self.name}'s forward never handed its logits to the hook: the in-update teacher needs the FSDP "
                "engine without fused kernels (actor_rollout_ref.model.use_fused_kernels=false)"
            )
        return catcher.rows
