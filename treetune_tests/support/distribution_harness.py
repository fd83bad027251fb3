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
"""The recipe's distribution-level losses (``opsd``, ``sdpo``) inside verl's FSDP engine update, and the same losses
written out in fp32 from transformers logits.

Shared by ``treetune_tests/treetune_recipe/cpo/test_distribution_loss_engine_on_cpu.py`` and its GPU twin
``test_distribution_loss_engine.py``.

- :func:`distribution_engine`: an actor ``TrainingWorker`` with ``cpo_ppo_loss`` installed, one micro-batch per update
  (8 rows), no KL loss, and a plain batch with its hint-prompt twin (same responses), both scored in fp32.
- :func:`check_engine_update` (:data:`CASES`): one real update with ``distillation_use_topk=True`` and the teacher's
  forward bound to the loss (``treetune_verl.update_teacher.UpdateTeacher`` on the actor's own engine: the ``policy``
  teacher, the same weights under the hint prompt), the hint prompts travelling as the batch's teacher columns; the
  engine's ``actor/distill_loss`` and grad norm equal the fp32 loss written here (:func:`expected_update`), the PG
  term is 0, the teacher ran once per micro-batch, and each corruption of :data:`CONTROLS` fails the same
  assertions.
- The loss alone on random logits on a device under bf16 autocast against fp32 on CPU:
  :mod:`treetune_tests.support.distribution_device_loss` (``check_losses_on_device``).

The expected loss is written independently of ``treetune_recipe.cpo.methods.distribution_losses``: on probabilities (the
mixture and the tail bucket as sums of probabilities), not log-space mixtures.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from verl import DataProto
from verl.utils import tensordict_utils as tu

from treetune_recipe.cpo.config import CPOConfig
from treetune_recipe.cpo.methods.loss import CONTEXT_MASK, cpo_ppo_loss
from treetune_tests.support import engine_harness as harness
from treetune_tests.support.fp32_reference import BATCH, rollout_batch
from treetune_tests.support.shards import load_shards, local_shards
from treetune_verl.update_teacher import UpdateTeacher, teacher_columns

#: Sampling temperature of the batch (OPSD's τ): every log-softmax, the engine's and the expected one, is of logits/τ.
TEMPERATURE = 1.1
#: Rows with a teacher context (cpo_context_mask); the others must not count in the loss.
SOME_CONTEXT = (1, 0, 1, 1, 0, 1, 1, 0)
ALL_CONTEXT = (1,) * BATCH
#: ``k = 0``: every row of the output layer (the trainer's ``top_k=0``), padding rows included.
EVERY_ID = 0


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float


#: The engine's update vs fp32 transformers (distill loss, grad norm, the means of ℓ and w over the kept tokens).
#: verl-cpu's engine computes in fp32 (``platform=cpu``: param_dtype fp32, verl 0.9.1 then skips autocast): measured
#: relative errors ≤ 6.5e-7, the nearest control 10 % away. With the engine, the
#: in-update teacher included, in bf16 (:data:`BF16_OVERRIDES`), measured on CPU: ≤ 3.2 % (sdpo k = 100; the others
#: ≤ 2.1 %), the nearest control 9.7 % away (the ids one position late, opsd k = 5).
FP32_UPDATE = Tolerance(rtol=1e-4, atol=1e-6)
BF16_UPDATE = Tolerance(rtol=0.05, atol=1e-3)
#: The engine's parameters and forward in bf16 (autocast), verl's default on a GPU, in place of the CPU profile's fp32.
BF16_OVERRIDES = ("actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16",)


@dataclass(frozen=True)
class Case:
    """One engine update: ``method`` with ``knob`` (β or α) 0.5, ``k`` ids per token, which rows have a context,
    ``old_shift``: how far below (+) or above (-) the fp32 log-prob each token's ``old_log_probs`` lies, cycled over
    the tokens (0: on-policy, SDPO's weight 1; 2: ratio e² clipped at 2; -0.5: ratio 0.61, not clipped), ``agg``:
    ``cpo.token_loss_agg``, and ``hybrid``: the distillation term's weight in SDPO's hybrid mode (GRPO's clipped loss
    on the verifier's advantages over every row + weight × the distillation term), or None for the pure loss."""

    method: str
    k: int
    context: tuple[int, ...] = ALL_CONTEXT
    old_shift: tuple[float, ...] = (0.0,)
    agg: str = "seq_mean"
    hybrid: float | None = None


CASES = {
    "opsd-k5": Case("opsd", 5, SOME_CONTEXT),
    "opsd-every-id": Case("opsd", EVERY_ID),
    "sdpo-k5-token-mean": Case("sdpo", 5, SOME_CONTEXT, agg="token_mean"),
    "sdpo-k100-clipped-weight": Case("sdpo", 100, SOME_CONTEXT, old_shift=(0.0, 2.0, -0.5)),
    "sdpo-hybrid": Case("sdpo", 5, SOME_CONTEXT, old_shift=(0.0, 2.0, -0.5), hybrid=0.5),
}
#: Corruptions of the expected update; the engine must match none of them (each fails the same assertion):
#: ``student one position early``: the student's distribution read at the position before (an off-by-one gather);
#: ``ids one position late``: each token scored at the previous token's ids and teacher log-probs;
#: ``plain-prompt teacher``: the teacher without its context (the loss is then 0).
#: Where a row has no context (:func:`controls`): ``context mask ignored``: its tokens counted; with the per-sequence
#: mean, ``token mean``: one mean over the context rows' tokens (long responses weigh more) instead; with the token
#: mean, ``context tokens as the denominator``: the sum divided by the context rows' tokens, not by every response
#: token. Where SDPO's weight is not 1: ``importance weight unclipped``, ``no importance weight``.
CONTROLS = ("student one position early", "ids one position late", "plain-prompt teacher")


def controls(case: Case) -> tuple[str, ...]:
    """The corruptions that change ``case``'s loss (the context ones need a row without a context, the weight ones a
    weight that is not 1)."""
    out = CONTROLS
    if 0 in case.context:
        denominator = "token mean" if case.agg == "seq_mean" else "context tokens as the denominator"
        out += ("context mask ignored", denominator)
    if case.method == "sdpo" and any(case.old_shift):
        out += ("importance weight unclipped", "no importance weight")
    if case.hybrid is not None and 0 in case.context:
        out += ("policy term over the context rows only",)
    return out


def compose_config(model_path: Path, *overrides: str):
    """The recipe's tiny CPU profile; one micro-batch of the whole batch per update, no KL loss (SDPO's and OPSD's run
    settings: kl_loss_coef=0), every ratio unclipped (the PG term is 0 anyway)."""
    return harness.compose_config(
        model_path,
        *harness.UNCLIPPED,
        "actor_rollout_ref.actor.use_dynamic_bsz=false",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={BATCH}",
        "actor_rollout_ref.actor.use_kl_loss=false",
        *overrides,
    )


def cpo_config(method: str, k: int | None = None, agg: str = "seq_mean", hybrid: float | None = None) -> CPOConfig:
    knob = {"opsd": "beta", "sdpo": "alpha"}[method]
    block = {knob: 0.5} if k is None else {knob: 0.5, "top_k": k}
    if hybrid is not None:
        block |= {"policy_loss_mode": "hybrid", "distillation_weight": hybrid}
    return CPOConfig.from_config({"method": method, method: block, "token_loss_agg": agg})


def plain_and_hint_batches(model_path: Path, tokenizer, config) -> tuple[DataProto, DataProto]:
    """The plain rollout batch at :data:`TEMPERATURE` and its hint-prompt twin (same responses, ``config``'s hint)."""
    from treetune_recipe.cpo.teacher.hint import HintConfig, build_hint_batch

    plain = rollout_batch(model_path, tokenizer, seed=2)
    plain.meta_info["temperature"] = TEMPERATURE
    hint_config = HintConfig.from_config(config.cpo.hint).resolve(config.data.max_prompt_length)
    hint, _ = build_hint_batch(plain, tokenizer, hint_config)
    assert torch.equal(hint.batch["responses"], plain.batch["responses"])
    return plain, hint


@contextlib.contextmanager
def distribution_engine(assets_dir: Path, *overrides: str):
    """The actor worker (``cpo_ppo_loss`` of ``opsd`` installed), the plain and hint batches, the fp32 model and its
    distributions over the plain batch's responses under the plain prompt (``student``) and the hint prompt
    (``teacher``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_path = Path(assets_dir) / "model"
    config = compose_config(model_path, *overrides)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    plain, hint = plain_and_hint_batches(model_path, tokenizer, config)
    fp32 = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="sdpa").eval()
    with harness.single_process_group():
        actor, actor_config = harness.actor_worker(config, cpo_config("opsd"))
        yield dict(
            actor=actor,
            actor_config=actor_config,
            tokenizer=tokenizer,
            plain=plain,
            hint=hint,
            fp32=fp32,
            vocab=len(tokenizer),
            student=fp32_distributions(fp32, plain, len(tokenizer)),
            teacher=fp32_distributions(fp32, hint, len(tokenizer)),
        )


# ----------------------------------------------------------------------------------------------------------------------
# fp32 references
# ----------------------------------------------------------------------------------------------------------------------


def padding_logit() -> float:
    """The logit verl-cpu gives the output rows beyond the tokenizer's ids (``verl_cpu.patches.engine``): probability
    0, yet finite."""
    return torch.finfo(torch.float32).min / 1e4


def fp32_distributions(model, batch: DataProto, vocab: int, shift: int = 0, grad: bool = False) -> torch.Tensor:
    """``[B, T, rows]`` log-softmax over every output row of logits / τ at each response token (rows at or beyond
    ``vocab`` masked as the engine masks them), one row at a time without padding; 0 off the response. ``shift=1``:
    each token read one position too early. ``grad``: differentiable in the model's parameters."""
    tensors = batch.batch
    prompt_width, width = tensors["prompts"].shape[1], tensors["responses"].shape[1]
    rows = []
    with torch.set_grad_enabled(grad):
        for i in range(len(batch)):
            prompt = tensors["prompts"][i][tensors["attention_mask"][i, :prompt_width].bool()]
            response = tensors["responses"][i][tensors["response_mask"][i].bool()]
            p, r = len(prompt), len(response)
            logits = model(torch.cat([prompt, response])[None]).logits[0].float()
            logits = logits.masked_fill(torch.arange(logits.shape[-1]) >= vocab, padding_logit())
            first = p - 1 - shift
            log_probs = torch.log_softmax(logits[first : first + r] / TEMPERATURE, dim=-1)
            rows.append(torch.nn.functional.pad(log_probs, (0, 0, 0, width - r)))
    return torch.stack(rows)


def roll_positions(values: torch.Tensor) -> torch.Tensor:
    """``values [B, T, ...]`` one position late: slot t holds slot t - 1's (slot 0 its own)."""
    return torch.cat([values[:, :1], values[:, :-1]], dim=1)


def opsd_token_loss(student: torch.Tensor, teacher: torch.Tensor, beta: float) -> torch.Tensor:
    """JSD_β of the two distributions renormalised over the ids: β·KL(t‖m) + (1-β)·KL(s‖m), m = (1-β)·s + β·t."""
    s, t = torch.softmax(student, -1), torch.softmax(teacher, -1)
    return _jsd(s, t, beta)


def sdpo_token_loss(student: torch.Tensor, teacher: torch.Tensor, alpha: float) -> torch.Tensor:
    """α-JSD of the (k+1)-way distributions [p at the ids, tail = 1 - Σ p (at least 1 - e^-1e-7)]."""

    def with_tail(log_probs):
        p = log_probs.exp()
        tail = (1 - p.sum(-1, keepdim=True)).clamp(min=-np.expm1(-1e-7))
        return torch.cat([p, tail], dim=-1)

    return _jsd(with_tail(student), with_tail(teacher), alpha)


def _jsd(s: torch.Tensor, t: torch.Tensor, weight: float) -> torch.Tensor:
    m = (1 - weight) * s + weight * t
    return weight * _kl(t, m) + (1 - weight) * _kl(s, m)


def _kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Σ p·log(p/q) over the last axis, 0·log 0 = 0 with a finite gradient (ids of zero probability: the engine's
    masked padding rows)."""
    positive = p > 0
    ratio = torch.where(positive, p, 1.0) / torch.where(positive, q, 1.0)
    return torch.where(positive, p * torch.log(ratio), 0.0).sum(-1)


@dataclass
class Inputs:
    """The case's batch keys: ``ids`` and ``teacher`` (its log-probs there) ``[B, T, k]``, ``context [B]``,
    ``old [B, T]`` (``old_log_probs``)."""

    ids: torch.Tensor
    teacher: torch.Tensor
    context: torch.Tensor
    old: torch.Tensor


def case_inputs(engine: dict, case: Case) -> Inputs:
    """The batch keys of ``case``: the teacher is the fp32 model under the hint prompt; the ids are its own top-k
    (OPSD) or the student's, fp32 under the plain prompt (SDPO); ``old_log_probs`` are the fp32 sampled-token
    log-probs moved by ``case.old_shift``."""
    mask = engine["plain"].batch["response_mask"]
    student, teacher = engine["student"], engine["teacher"]
    k = case.k or student.shape[-1]
    ids = (teacher if case.method == "opsd" else student).topk(k, dim=-1).indices * mask[..., None]
    sampled = student.gather(-1, engine["plain"].batch["responses"][..., None])[..., 0]
    shifts = torch.tensor(case.old_shift).repeat(sampled.numel() // len(case.old_shift) + 1)[: sampled.numel()]
    return Inputs(
        ids=ids,
        teacher=teacher.gather(-1, ids) * mask[..., None],
        context=torch.tensor(case.context, dtype=torch.float32),
        old=(sampled - shifts.view_as(sampled)) * mask,
    )


@dataclass(frozen=True)
class Update:
    """What the engine reports of one update (and what the fp32 computation expects): ``actor/distill_loss``, the grad
    norm, and the means over the kept tokens of the per-token loss ℓ and of the weight w."""

    distill_loss: float
    grad_norm: float
    token_loss: float
    token_weight: float

    def as_tensor(self) -> torch.Tensor:
        return torch.tensor(
            [self.distill_loss, self.grad_norm, self.token_loss, self.token_weight], dtype=torch.float64
        )


def expected_update(engine: dict, case: Case, inputs: Inputs, control: str | None = None) -> Update:
    """The update's numbers in fp32 from transformers logits; ``control``: one of :data:`CONTROLS`.

    ``seq_mean``: Σ_i c_i · (Σ_t w·ℓ over row i's response tokens) / (row i's token count), divided by the rows of
    the mini-batch (a row without a context counts as 0); ``token_mean``: Σ w·ℓ over the response tokens of rows with a
    context, divided by every response token of the mini-batch (a token without a context counts as 0).
    """
    model, plain = engine["fp32"], engine["plain"]
    model.zero_grad(set_to_none=True)
    mask = plain.batch["response_mask"].float()
    shift = int(control == "student one position early")
    student = fp32_distributions(model, plain, engine["vocab"], shift=shift, grad=True)
    ids, teacher, context = inputs.ids, inputs.teacher, inputs.context
    if control == "ids one position late":
        ids, teacher = roll_positions(ids), roll_positions(teacher)
    if control == "context mask ignored":
        context = torch.ones_like(context)
    if control == "plain-prompt teacher":
        if case.method == "opsd":
            ids = engine["student"].topk(ids.shape[-1], dim=-1).indices
        teacher = engine["student"].gather(-1, ids)
    per_token = (opsd_token_loss if case.method == "opsd" else sdpo_token_loss)(student.gather(-1, ids), teacher, 0.5)
    weight = torch.ones_like(per_token)
    if case.method == "sdpo":
        sampled = student.detach().gather(-1, plain.batch["responses"][..., None])[..., 0]
        weight = torch.exp(sampled - inputs.old)
        if control != "importance weight unclipped":
            weight = weight.clamp(max=2.0)
        if control == "no importance weight":
            weight = torch.ones_like(per_token)
    kept = mask * context[:, None]
    if case.agg == "seq_mean" and control != "token mean":
        row_means = (per_token * weight * kept).sum(-1) / mask.sum(-1)
        loss = row_means.sum() / len(row_means)
    else:
        denominator = kept.sum() if control == "context tokens as the denominator" else mask.sum()
        loss = (per_token * weight * kept).sum() / denominator
    total = loss
    if case.hybrid is not None:
        sampled = student.gather(-1, plain.batch["responses"][..., None])[..., 0]
        pg_mask = kept if control == "policy term over the context rows only" else mask
        pg_loss = clipped_pg_loss(sampled, inputs.old, plain.batch["advantages"], pg_mask, engine["actor_config"])
        total = pg_loss + case.hybrid * loss
    total.backward()
    grads = [p.grad.norm() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return Update(
        distill_loss=loss.item(),
        grad_norm=torch.linalg.vector_norm(torch.stack(grads)).item(),
        token_loss=((per_token * kept).sum() / kept.sum()).item(),
        token_weight=((weight * kept).sum() / kept.sum()).item(),
    )


# ----------------------------------------------------------------------------------------------------------------------
# The engine update
# ----------------------------------------------------------------------------------------------------------------------


def clipped_pg_loss(
    log_probs: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, actor_config
) -> torch.Tensor:
    """GRPO's clipped surrogate written out (verl's ``vanilla`` policy loss with the actor's ε_low, ε_high and dual
    clip c), the token mean over ``mask``: r = exp(log π - log π_old), ℓ = max(-A·r, -A·clip(r, 1-ε_low, 1+ε_high)),
    then min(ℓ, -A·c) where A < 0."""
    low, high, c = actor_config.clip_ratio_low, actor_config.clip_ratio_high, actor_config.clip_ratio_c
    ratio = torch.exp(log_probs - old)
    clipped = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - low, 1 + high))
    per_token = torch.where(advantages < 0, torch.minimum(clipped, -advantages * c), clipped)
    return (per_token * mask).sum() / mask.sum()


def case_batch(engine: dict, case: Case, inputs: Inputs, teacher: DataProto | None = None) -> DataProto:
    """The plain batch (random advantages) with the case's keys: the teacher's token columns (the hint batch's rows,
    or ``teacher``'s), the context mask and ``old_log_probs``."""
    plain = engine["plain"]
    tensors = plain.batch.clone()
    tensors.update(teacher_columns(engine["hint"] if teacher is None else teacher))
    tensors[CONTEXT_MASK], tensors["old_log_probs"] = inputs.context, inputs.old
    return DataProto(batch=tensors, non_tensor_batch=plain.non_tensor_batch, meta_info=dict(plain.meta_info))


def engine_update(engine: dict, case: Case, inputs: Inputs) -> dict:
    """One actor update of the plain batch with the case's keys, as ``RayPPOTrainer._update_actor`` inside
    ``student_logits_in_update``, the teacher's forward bound to the loss as ``set_loss_fn_with_teacher`` binds it (the
    actor's own engine: a ``policy`` teacher); the actor's weights are put back afterwards. Returns the metrics."""
    actor, batch = engine["actor"], case_batch(engine, case, inputs)
    data = harness.update_request(batch, distillation_use_topk=True)
    teacher = UpdateTeacher(actor.engine, name="policy teacher")
    cpo = cpo_config(case.method, case.k, case.agg, case.hybrid)
    actor.set_loss_fn(partial(cpo_ppo_loss, config=engine["actor_config"], cpo=cpo, teacher=teacher))
    module = actor.engine.module
    before = local_shards(module)
    try:
        with harness.recorded_model_inputs(actor.engine) as calls:
            output = actor.train_mini_batch(data)
    finally:
        load_shards(module, before)
    # one micro-batch: the student's forward, and the teacher's beside it
    assert len(calls) == 2 and teacher.forwards == 1, f"expected one micro-batch, got {len(calls)} forwards"
    return tu.get(output, "metrics")


def reported(metrics: dict) -> Update:
    """The engine's numbers of a one-micro-batch update."""
    keys = {"distill_loss": "actor/distill_loss", "grad_norm": "grad_norm"}
    keys |= {"token_loss": "cpo/token_loss", "token_weight": "cpo/token_weight"}
    assert all(len(metrics[key]) == 1 for key in keys.values()), metrics
    return Update(**{name: float(metrics[key][0]) for name, key in keys.items()})


def assert_update_matches(got: Update, expected: Update, tolerance: Tolerance, what: str) -> None:
    torch.testing.assert_close(
        got.as_tensor(),
        expected.as_tensor(),
        rtol=tolerance.rtol,
        atol=tolerance.atol,
        msg=lambda m: f"{what}: engine {got} vs fp32 {expected}: {m}",
    )


def pg_loss_with_advantages_kept(engine: dict, inputs: Inputs) -> float:
    """verl's ``ppo_loss`` PG term on the case's batch with its advantages (what a loss that did not zero them would
    give), on the fp32 log-probs."""
    from verl.workers.utils.losses import ppo_loss

    batch = case_batch(engine, CASES["opsd-k5"], inputs)
    data = harness.engine_format(batch, engine["actor_config"])
    sampled = engine["student"].gather(-1, batch.batch["responses"][..., None])[..., 0]
    model_output = {"log_probs": harness.as_nested(sampled, batch, data)}
    _, metrics = ppo_loss(engine["actor_config"], model_output, data)
    return metrics["actor/pg_loss"].aggregate()


def check_engine_update(engine: dict, name: str, tolerance: Tolerance) -> dict[str, float]:
    """One engine update of case ``name`` against fp32 (see the module docstring). Returns the largest relative error
    of the four numbers and, per control, their largest relative distance from the control's (a control fails the
    assertion when any of the four is off)."""
    case = CASES[name]
    inputs = case_inputs(engine, case)
    metrics = engine_update(engine, case, inputs)
    got, expected = reported(metrics), expected_update(engine, case, inputs)
    assert_update_matches(got, expected, tolerance, name)
    assert got.grad_norm > 0 and got.distill_loss > 0, got
    if case.hybrid is None:
        # The PG term is 0 (advantages zeroed); control: the same batch with its advantages gives a PG loss.
        torch.testing.assert_close(float(metrics["actor/pg_loss"][0]), 0.0, rtol=0, atol=0)
        with pytest.raises(AssertionError):
            torch.testing.assert_close(pg_loss_with_advantages_kept(engine, inputs), 0.0, rtol=0, atol=0)
    else:
        # The PG term is GRPO's over every row, written out by hand; control: over the context rows only.
        plain = engine["plain"]
        with torch.no_grad():
            student = fp32_distributions(engine["fp32"], plain, engine["vocab"])
        sampled = student.gather(-1, plain.batch["responses"][..., None])[..., 0]
        mask, advantages = plain.batch["response_mask"].float(), plain.batch["advantages"]
        got_pg = torch.tensor(float(metrics["actor/pg_loss"][0]))
        expected_pg = clipped_pg_loss(sampled, inputs.old, advantages, mask, engine["actor_config"])
        torch.testing.assert_close(got_pg, expected_pg, rtol=tolerance.rtol, atol=tolerance.atol)
        with pytest.raises(AssertionError):
            context_rows = mask * inputs.context[:, None]
            torch.testing.assert_close(
                got_pg,
                clipped_pg_loss(sampled, inputs.old, advantages, context_rows, engine["actor_config"]),
                rtol=tolerance.rtol,
                atol=0,
            )
    error = ((got.as_tensor() - expected.as_tensor()).abs() / expected.as_tensor().abs()).max().item()
    measured = {"max relative error": error}
    for control in controls(case):
        corrupted = expected_update(engine, case, inputs, control)
        with pytest.raises(AssertionError):
            assert_update_matches(got, corrupted, tolerance, f"{name} vs {control}")
        distance = (got.as_tensor() - corrupted.as_tensor()).abs() / corrupted.as_tensor().abs().clamp(min=1e-12)
        measured[control] = distance.max().item()
    return measured


def actor_config_of(model_path: Path, *overrides: str):
    """The ``ActorConfig`` of :func:`compose_config` (no worker)."""
    from verl.utils.config import omega_conf_to_dataclass

    return omega_conf_to_dataclass(compose_config(model_path, *overrides).actor_rollout_ref.actor)
