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
"""The distribution-level losses (``opsd``, ``sdpo``) alone, on random logits, on a device under bf16 autocast (as
inside the engine) against fp32 on CPU: :func:`check_losses_on_device`.

Shared by ``treetune_tests/treetune_recipe/cpo/test_distribution_loss_engine_on_cpu.py`` (CPU autocast) and its GPU
twin ``test_distribution_loss_engine.py`` (CUDA); the engine update they also check is
:mod:`treetune_tests.support.distribution_harness`'s.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from verl import DataProto

from treetune_recipe.cpo.methods.loss import CONTEXT_MASK, cpo_ppo_loss
from treetune_tests.support import engine_harness as harness
from treetune_tests.support.distribution_harness import SOME_CONTEXT, Tolerance, cpo_config, roll_positions
from treetune_tests.support.fp32_reference import BATCH

#: The losses on random logits on a device under bf16 autocast vs fp32 on CPU (as the wrappers' GPU test).
DEVICE_LOSS = Tolerance(rtol=1e-5, atol=1e-5)
#: ... and the gradient of the loss with respect to the bf16 logits, itself bf16: one bf16 rounding step (2^-7).
DEVICE_GRADIENT = Tolerance(rtol=1e-2, atol=1e-7)


def random_micro_batch(method: str, vocab: int = 1000, k: int = 100, seed: int = 0):
    """An engine micro-batch of :data:`BATCH` rows (left-padded prompts, right-padded responses of mixed
    lengths, some rows without a context) with the case keys of ``method``, and random packed student logits
    ``[1, nnz, vocab]`` (bf16 values: what the engine's output layer gives under autocast).

    Returns ``(batch, logits, teacher [B, T, vocab])``, the teacher's log-distribution at each response slot (what
    :class:`FixedTeacher` hands the loss); ``old_log_probs`` lie 0, 2 or -0.5 nats from the student's sampled-token
    log-probs (SDPO's weight 1, clipped at 2, 0.61)."""
    from verl.utils.model import compute_position_id_with_mask

    gen = torch.Generator().manual_seed(seed)
    rows, prompt_width, width = BATCH, 6, 40
    prompt_lens = torch.randint(1, prompt_width + 1, (rows,), generator=gen)
    response_lens = torch.randint(1, width + 1, (rows,), generator=gen)
    response_lens[0] = width
    prompt_mask = (torch.arange(prompt_width)[None, :] >= prompt_width - prompt_lens[:, None]).long()
    response_mask = (torch.arange(width)[None, :] < response_lens[:, None]).long()
    prompts = torch.randint(0, vocab, (rows, prompt_width), generator=gen) * prompt_mask
    responses = torch.randint(0, vocab, (rows, width), generator=gen) * response_mask
    attention_mask = torch.cat([prompt_mask, response_mask], dim=-1)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=-1),
        "attention_mask": attention_mask,
        "position_ids": compute_position_id_with_mask(attention_mask),
        "response_mask": response_mask,
        "advantages": torch.randn(rows, 1, generator=gen) * response_mask,
    }
    # Logits of every prompt + response position, packed as the engine packs them (rows without padding).
    packed = torch.cat([(torch.randn(int(n), vocab, generator=gen) * 3) for n in prompt_lens + response_lens])
    logits = packed.bfloat16().float()[None]
    student = torch.zeros(rows, width, vocab)
    starts = torch.cat([torch.zeros(1, dtype=torch.long), (prompt_lens + response_lens).cumsum(0)[:-1]])
    for i in range(rows):
        first = int(starts[i] + prompt_lens[i] - 1)
        student[i, : response_lens[i]] = torch.log_softmax(logits[0, first : first + int(response_lens[i])], -1)
    teacher = torch.log_softmax(student * 0.5 + torch.randn(rows, width, vocab, generator=gen), -1)
    sampled = student.gather(-1, responses[..., None])[..., 0]
    shifts = torch.tensor([0.0, 2.0, -0.5]).repeat(rows * width // 3 + 1)[: rows * width].view(rows, width)
    tensors.update(
        {
            CONTEXT_MASK: torch.tensor(SOME_CONTEXT, dtype=torch.float32),
            "old_log_probs": (sampled - shifts) * response_mask,
        }
    )
    batch = DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0})
    return batch, logits, teacher


class FixedTeacher:
    """A stand-in for the in-update teacher (``treetune_verl.update_teacher.UpdateTeacher``): hands the loss the given
    ``[B, T, V]`` log-distributions (logits whose log-softmax they are) at the micro-batch's response slots."""

    def __init__(self, teacher: torch.Tensor):
        self.teacher = teacher

    def __call__(self, data):
        from treetune_verl.logits_hook import response_positions
        from treetune_verl.update_teacher import TeacherRows

        valid = response_positions(data)[1]
        return TeacherRows(self.teacher.to(valid.device)[valid], valid)


def device_loss(
    actor_config,
    method: str,
    batch: DataProto,
    logits: torch.Tensor,
    teacher: torch.Tensor,
    device: str,
    autocast: bool,
):
    """``cpo_ppo_loss``'s two engine calls on ``device`` (the logits call, then the loss call with the engine's
    sampled-token log-probs from the same logits); returns ``(per-token loss [B, T], loss, distill metric, d loss /
    d logits)`` on CPU in fp32."""
    from verl.workers.utils.padding import no_padding_2_padding

    from treetune_recipe.cpo.methods.loss import TOKEN_LOSS

    cpo = cpo_config(method)
    data = harness.engine_format(batch, actor_config).to(device)
    dtype = torch.bfloat16 if autocast else torch.float32
    student_logits = logits.detach().to(device=device, dtype=dtype).clone().requires_grad_(True)
    context = torch.autocast(device_type=device, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with context:
        model_output = cpo_ppo_loss(
            actor_config, data=data, cpo=cpo, teacher=FixedTeacher(teacher), student_logits=student_logits
        )
        # the sampled tokens' log-probs, packed as the engine's log_probs (position j predicts token j + 1)
        ids = data["input_ids"].values()
        log_probs = torch.log_softmax(student_logits[0].float(), -1).gather(-1, ids.roll(-1)[:, None])[:, 0]
        model_output["log_probs"] = torch.nested.nested_tensor_from_jagged(log_probs, data["input_ids"].offsets())
        model_output[TOKEN_LOSS] = torch.nested.nested_tensor_from_jagged(
            model_output[TOKEN_LOSS][0], data["input_ids"].offsets()
        )
        loss, metrics = cpo_ppo_loss(actor_config, model_output, data, cpo=cpo)
    loss.backward()
    per_token = no_padding_2_padding(model_output[TOKEN_LOSS], data)
    return (
        per_token.detach().float().cpu(),
        loss.detach().float().cpu(),
        torch.tensor(metrics["actor/distill_loss"].aggregate()),
        student_logits.grad.float().cpu(),
    )


def assert_device_loss_matches(got: tuple, expected: tuple, what: str) -> None:
    """Per-token loss, loss and distill metric within :data:`DEVICE_LOSS`; the gradient (bf16, as the logits) within
    :data:`DEVICE_GRADIENT`."""
    names = ("per-token loss", "loss", "distill loss", "gradient")
    for name, g, e in zip(names, got, expected, strict=True):
        tolerance = DEVICE_GRADIENT if name == "gradient" else DEVICE_LOSS
        torch.testing.assert_close(
            g, e, rtol=tolerance.rtol, atol=tolerance.atol, msg=lambda m, n=name: f"{what}, {n}: {m}"
        )


def check_losses_on_device(actor_config, method: str, device: str) -> dict[str, float]:
    """The loss on random logits on ``device`` under bf16 autocast equals fp32 on CPU (per-token loss, loss, distill
    metric, gradient). Controls, which must fail the same assertion: the CPU loss with the teacher's log-probs
    rounded to bf16 (a loss computed in bf16), and with the teacher one position late. Returns the measured max errors
    and, per control, its max distance from the device's per-token loss."""
    batch, logits, teacher = random_micro_batch(method)
    expected = device_loss(actor_config, method, batch, logits, teacher, "cpu", autocast=False)
    got = device_loss(actor_config, method, batch, logits, teacher, device, autocast=True)
    assert_device_loss_matches(got, expected, f"{method} on {device}")
    assert float(expected[2]) > 0 and float(expected[3].abs().max()) > 0
    measured = {
        name: (g - e).abs().max().item() for name, g, e in zip(("per-token", "loss", "distill", "grad"), got, expected)
    }
    for control in ("bf16 teacher", "teacher one position late"):
        corrupted_teacher = teacher.bfloat16().float() if control == "bf16 teacher" else roll_positions(teacher)
        corrupted = device_loss(actor_config, method, batch, logits, corrupted_teacher, "cpu", autocast=False)
        with pytest.raises(AssertionError):
            assert_device_loss_matches(got, corrupted, f"{method} vs {control}")
        measured[control] = (got[0] - corrupted[0]).abs().max().item()
    return measured
