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
"""Token-credit dump (``cpo.credit_dump.*``): what CPO credits, token by token, at chosen steps.

At each step listed in ``cpo.credit_dump.steps`` the trainer (on the driver, right before the actor update) writes
``<dir>/step_<N>.json`` holding up to ``max_rows`` responses, chosen round-robin from four kinds (correct and wrong
responses of mixed groups, responses of all-wrong and of all-correct groups) so that each kind is shown. Per response:
the plain prompt and the teacher's prompt (``hint_prompt``: the prompt under the run's context, named in the file's
``context``; text and token ids), the reward, the group difficulty and, per response token,
its text and id, ``o`` (``old_log_probs``), ``g`` (``teacher_log_probs``, from the run's teacher, named in the file's
``teacher``), ``δ = g − o``, the entropy, the GRPO advantage
``A`` and the advantage after the configured wrapper.

The wrapper needs the token entropy; the loss uses the current policy's entropy of each update micro-batch, which the
driver never sees. The dump recomputes the entropy with one extra forward pass of the actor on the plain batch
(``treetune_verl.rescoring.score_batch``, the old-log-prob pass's request with the entropy; before the update, so it is
the old policy's; identical to the loss's for the first mini-batch of the first epoch). At a listed step the trainer
also scores every row under the hint (as ``cpo.hint.rescore=all`` would), so the dump shows the real ``δ`` of each
response it keeps. These passes and the file are the whole cost, paid only at the listed steps: with ``steps: []``
(default) nothing runs. Each file is written whole or not at all (a temporary file, renamed); a step trained again after
a resume (``treetune_verl.run_folder``) writes its file again, so the folder holds one file per step, matching the step
the metrics file logs. ``treetune_recipe/cpo/reports/credit_report.py`` turns the files into one HTML page (command
line: ``python -m treetune_scripts.credit_report``).

A distribution-level method (OPSD, SDPO) has no shaped advantage: its rows hold instead the teacher's prompt (its
context), whether the row has one (``has_context``; a row without one is out of the loss), the teacher's
:data:`TOPK_SHOWN` most likely ids of each token (over the whole vocabulary) as ``[id, text, log-prob]``, and the
method's per-token loss ``token_loss`` at the old policy. Both come from the extra pass: its request hands the logits
to the installed loss, which runs the teacher's forward beside the student's on the worker as in the update
(``methods.loss.DUMP_TEACHER_TOP``) and returns them per token; only these few values per token reach the driver.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from treetune_recipe.cpo.methods.advantage_terms import succeeded
from treetune_recipe.cpo.methods.loss import CONTEXT_MASK, DUMP_TEACHER_TOP, TOKEN_LOSS, teacher_top_keys
from treetune_recipe.cpo.methods.registry import get_cpo_wrapper
from treetune_verl.config_block import check_field_types, dataclass_from_block
from treetune_verl.rescoring import score_batch

#: Row kinds, in the order rows are picked round-robin (difficulty label, correct?).
#: Teacher ids shown per token in a distribution-level dump (the most likely among the step's top-k ids).
TOPK_SHOWN = 5
ROW_KINDS = {"mixed_correct": (0, True), "mixed_wrong": (0, False), "all_wrong": (-1, False), "all_correct": (1, True)}
DUMP_VERSION = 1


@dataclasses.dataclass(frozen=True)
class CreditDumpConfig:
    """``cpo.credit_dump.*``."""

    steps: tuple[int, ...] = ()
    dir: str | None = None
    max_rows: int = 32

    def __post_init__(self):
        if self.steps is None:  # null = no step
            object.__setattr__(self, "steps", ())
        check_field_types(self, "cpo.credit_dump")
        if any(step < 1 for step in self.steps):
            raise ValueError(f"cpo.credit_dump.steps must be a list of training steps >= 1, got {self.steps!r}.")
        if self.max_rows < 1:
            raise ValueError(f"cpo.credit_dump.max_rows must be an integer >= 1, got {self.max_rows!r}.")

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> CreditDumpConfig:
        """Build from the ``cpo.credit_dump`` block (``CPOConfig`` builds it as part of the ``cpo`` block)."""
        return dataclass_from_block(cls, config, "cpo.credit_dump")

    def output_dir(self, default_local_dir: str) -> Path:
        """``dir``, or ``<trainer.default_local_dir>/credit_dump`` when null."""
        return Path(self.dir) if self.dir else Path(default_local_dir) / "credit_dump"


def select_rows(difficulty: torch.Tensor, correct: torch.Tensor, max_rows: int) -> list[int]:
    """Up to ``max_rows`` row indices, taken round-robin over :data:`ROW_KINDS` in batch order."""
    queues = [
        [row for row in range(len(difficulty)) if difficulty[row] == label and bool(correct[row]) == is_correct]
        for label, is_correct in ROW_KINDS.values()
    ]
    chosen: list[int] = []
    while len(chosen) < max_rows and any(queues):
        for queue in queues:
            if queue and len(chosen) < max_rows:
                chosen.append(queue.pop(0))
    return chosen


def _row_kind(difficulty: int, correct: bool) -> str:
    return next(kind for kind, (label, ok) in ROW_KINDS.items() if label == difficulty and ok == correct)


def _prompt_ids(prompt_ids: torch.Tensor, attention: torch.Tensor) -> list[int]:
    """The prompt's token ids without its left padding."""
    return prompt_ids[attention.bool()].tolist()


def build_dump(
    batch,
    hint_batch,
    entropy: torch.Tensor,
    tokenizer,
    cpo_config,
    step: int,
    max_rows: int,
    distribution: dict[str, torch.Tensor] | None = None,
) -> dict:
    """The dump of one step as a JSON-ready dict (see the module docstring).

    Args:
        batch: the training ``DataProto`` right before the actor update, holding ``prompts``, ``responses``,
            ``attention_mask``, ``response_mask [B, T]``, ``advantages``, ``old_log_probs``, ``teacher_log_probs``,
            ``seq_rewards [B]`` and ``difficulty [B]``.
        hint_batch: the teacher batch of the same step under the run's context (``prompts``, ``attention_mask``).
        entropy: ``[B, T]`` token entropy used for the wrapper.
        tokenizer: decodes prompts and single response tokens.
        cpo_config: the run's ``CPOConfig``.
        step: the training step.
        max_rows: rows kept (see :func:`select_rows`).
        distribution: a distribution-level method's per-token outputs of the extra pass (``[B, T]`` each, the old
            policy's): ``methods.loss.TOKEN_LOSS`` and the teacher's top ids and log-probs (``teacher_top_keys``).
    """
    tensors = batch.batch
    mask = tensors["response_mask"].bool()
    advantages, old, gw = (
        tensors["advantages"].float(),
        tensors["old_log_probs"].float(),
        tensors["teacher_log_probs"].float(),
    )
    method = cpo_config.selected_method
    if method.distribution_level:
        shaped = None
    else:
        shaped = get_cpo_wrapper(cpo_config.method)(
            advantages,
            teacher_log_probs=gw,
            old_log_probs=old,
            entropy=entropy.float(),
            response_mask=tensors["response_mask"],
            seq_rewards=tensors["seq_rewards"],
            difficulty=tensors["difficulty"],
            cfg=cpo_config,
        )
    correct = succeeded(tensors["seq_rewards"], cpo_config.success_value)
    prompt_width = tensors["prompts"].shape[1]
    hint_width = hint_batch.batch["prompts"].shape[1]
    rows = []
    for row in select_rows(tensors["difficulty"], correct, max_rows):
        valid = mask[row]
        token_ids = tensors["responses"][row][valid].tolist()
        prompt_ids = _prompt_ids(tensors["prompts"][row], tensors["attention_mask"][row][:prompt_width])
        hint_prompt_ids = _prompt_ids(
            hint_batch.batch["prompts"][row], hint_batch.batch["attention_mask"][row][:hint_width]
        )

        def values(matrix: torch.Tensor, row: int = row, valid: torch.Tensor = valid) -> list[float]:
            return [round(float(value), 6) for value in matrix[row][valid]]

        record = {
            "row": row,
            "uid": str(batch.non_tensor_batch["uid"][row]) if "uid" in batch.non_tensor_batch else str(row),
            "kind": _row_kind(int(tensors["difficulty"][row]), bool(correct[row])),
            "difficulty": int(tensors["difficulty"][row]),
            "reward": float(tensors["seq_rewards"][row]),
            "prompt": tokenizer.decode(prompt_ids, skip_special_tokens=False),
            "hint_prompt": tokenizer.decode(hint_prompt_ids, skip_special_tokens=False),
            "tokens": [tokenizer.decode([token_id], skip_special_tokens=False) for token_id in token_ids],
            # Token ids, so that a dump can be re-scored exactly (the numerics e2e test does it).
            "token_ids": token_ids,
            "prompt_ids": prompt_ids,
            "hint_prompt_ids": hint_prompt_ids,
            "old_log_probs": values(old),
            "teacher_log_probs": values(gw),
            "delta": values(gw - old),
            "entropy": values(entropy.float()),
            "advantage": values(advantages),
        }
        if shaped is not None:
            record["advantage_shaped"] = values(shaped)
        else:
            record.update(_distribution_record(tensors, row, valid, distribution, tokenizer))
        rows.append(record)
    return {
        "version": DUMP_VERSION,
        "step": step,
        "method": cpo_config.method,
        "teacher": cpo_config.teacher_config.name,
        "context": cpo_config.context_name,
        "pos_alpha": cpo_config.pos_alpha,
        "neg_alpha": cpo_config.neg_alpha,
        "success_value": cpo_config.success_value,
        "entropy_source": "old policy, plain prompt (extra forward pass of the actor at this step)",
        "batch_size": int(mask.shape[0]),
        "rows": rows,
    }


def _distribution_record(tensors, row: int, valid: torch.Tensor, outputs: dict[str, torch.Tensor], tokenizer) -> dict:
    """A distribution-level row's own columns: its context flag, per-token loss and the teacher's top ids."""
    shown = []
    for i in range(TOPK_SHOWN):
        id_key, log_prob_key = teacher_top_keys(i)
        if id_key in outputs:
            shown.append((outputs[id_key][row][valid].round().long(), outputs[log_prob_key][row][valid]))
    return {
        "has_context": bool(tensors[CONTEXT_MASK][row]),
        "token_loss": [round(float(value), 6) for value in outputs[TOKEN_LOSS][row][valid]],
        "teacher_topk": [
            [[int(ids[t]), tokenizer.decode([int(ids[t])]), round(float(log_probs[t]), 6)] for ids, log_probs in shown]
            for t in range(int(valid.sum()))
        ],
    }


def maybe_dump_credit(trainer, batch, hint_batch, cpo_config) -> Path | None:
    """The trainer hook: at a listed step, write ``step_<N>.json`` shaped with ``cpo_config``, the knobs of the step
    (RLSD's decayed λ included); otherwise return at once (no work)."""
    dump_config: CreditDumpConfig = cpo_config.credit_dump
    step = int(trainer.global_steps)
    if step not in dump_config.steps:
        return None
    # The old policy's entropy on the plain batch: the actor's second pass of the step, as its old-log-prob pass.
    # A distribution-level method: the same pass runs the method's loss with the teacher's forward beside it.
    distribution = {}
    if cpo_config.selected_method.distribution_level:
        keys = (TOKEN_LOSS, *(key for i in range(TOPK_SHOWN) for key in teacher_top_keys(i)))
        distribution = dict(loss_outputs=keys, loss_flags={DUMP_TEACHER_TOP: TOPK_SHOWN})
    scores = score_batch(trainer, batch, on="actor", entropy=True, **distribution)
    entropy = scores.entropy.to(batch.batch["response_mask"].device)
    dump = build_dump(
        batch, hint_batch, entropy, trainer.tokenizer, cpo_config, step, dump_config.max_rows, scores.loss_outputs
    )
    out_dir = dump_config.output_dir(trainer.config.trainer.default_local_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"step_{step}.json"
    temporary = path.with_name(path.name + ".tmp")  # a kill never leaves a half-written dump for the report
    temporary.write_text(json.dumps(dump))
    os.replace(temporary, path)
    return path
