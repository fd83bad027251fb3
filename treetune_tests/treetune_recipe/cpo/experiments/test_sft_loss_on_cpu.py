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
"""verl's SFT trainer, as the warm start runs it on CPU, computes the loss of plain per-sequence transformers.

The warm start (``treetune_recipe/cpo/experiments/warm_start.py``) trains with upstream ``verl.trainer.sft_trainer``:
verl's ``MultiTurnSFTDataset`` + ``SFTTensorCollator`` (``pad_mode=no_padding``), one ``TrainingWorker`` with the
FSDP2 engine and ``sft_loss``, ``use_remove_padding=true`` (verl's default): the sequences of a micro-batch are packed
into one row of shape ``[1, total_tokens]`` with per-sequence ``position_ids`` and no attention mask, and the
attention (``sdpa``) must keep them apart. Here an ``SFTTrainer`` is built in this process (one gloo rank, the CPU
backend, the exact overrides of :func:`~treetune_recipe.cpo.experiments.warm_start.sft_command`) and its first training
batch is run through the validation pass (``TrainingWorker.infer_batch``) and one training step
(``TrainingWorker.train_batch``), as ``SFTTrainer.fit`` calls them. The expectation is fp32 ``AutoModelForCausalLM``
on each sequence alone, the cross-entropy of the tokens the dataset's ``loss_mask`` marks (the assistant turn),
averaged over all those tokens of the batch (``sft_loss``'s reduction).

The model is the context-sensitive tiny Qwen3 (:data:`~treetune_verl.tiny_assets.CONTEXT_SENSITIVE`), so
attention leaking across packed sequences or a one-token shift moves log-probs by nats; the controls show that each
check fails on such input.

Tolerances (the engine computes under bf16 autocast with bf16 parameters; ``logprobs_from_logits`` returns bf16
log-probs and the loss scalar is bf16): per-token log-probs within :data:`LOG_PROB_MAX_ATOL` (max) and
:data:`LOG_PROB_MEAN_ATOL` (mean) nats, the same bounds that plain transformers under bf16 autocast meets against its
own fp32 run; the loss within :data:`LOSS_RTOL` (bf16 keeps 8 significant bits: 2**-9 = 0.2 % rounding); the grad
norm (fp32 gradients and reduction) within :data:`GRAD_NORM_RTOL`.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
import verl_cpu.activate  # noqa: F401  (as VERL_USE_EXTERNAL_MODULES loads it in the warm start's SFT run)
from hydra import compose, initialize_config_dir

from treetune_recipe.cpo.experiments.warm_start import WarmStartConfig, sft_command, sft_rows
from treetune_tests.support import engine_harness
from treetune_verl.tiny_assets import CONTEXT_SENSITIVE, build_tiny_assets

#: Conversations in the batch: plain and hinted prompts of the first RL rows (lengths ~60 and ~110 tokens).
BATCH = 6
LOG_PROB_MAX_ATOL, LOG_PROB_MEAN_ATOL = 0.5, 0.1
LOSS_RTOL, GRAD_NORM_RTOL = 5e-3, 1e-2
#: A check "fails clearly" on a control when the control is off by this many tolerances.
CONTROL_FACTOR = 10


# ----------------------------------------------------------------------------------------------------------------------
# verl's SFT trainer in this process, one batch through its validation pass and one training step
# ----------------------------------------------------------------------------------------------------------------------


def _sft_overrides(model_dir: Path, data: Path, work_dir: Path) -> list[str]:
    """The Hydra overrides of the warm start's ``sft_command`` for a one-batch run (the sizes of this test)."""
    config = WarmStartConfig(assets=CONTEXT_SENSITIVE, sft_batch_size=BATCH, sft_steps=1)
    command = sft_command(config, model_dir, data, data, work_dir)
    overrides = command[command.index("verl.trainer.sft_trainer") + 1 :]
    return [item for item in overrides if not item.startswith("hydra.")]


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    """Build verl's ``SFTTrainer`` as the warm start configures it; run its first batch forward, then train on it."""
    from tensordict.tensorclass import NonTensorData
    from verl.utils import tensordict_utils as tu

    assets = build_tiny_assets(config=CONTEXT_SENSITIVE)
    work_dir = tmp_path_factory.mktemp("sft")
    rows = pd.read_parquet(assets / "data" / "train.parquet").iloc[: BATCH // 2]
    data_path = work_dir / "sft.parquet"
    pd.DataFrame(sft_rows(rows)).to_parquet(data_path, index=False)

    with engine_harness.single_process_group():
        import verl.trainer.sft_trainer as sft_trainer
        from verl.utils.device import auto_set_device
        from verl.utils.distributed import initialize_global_process_group

        # SYNC WARNING: verl/trainer/sft_trainer.py:main, run_sft (config name, auto_set_device, process group)
        with initialize_config_dir(config_dir=str(Path(sft_trainer.__file__).parent / "config"), version_base=None):
            config = compose("sft_trainer_engine", overrides=_sft_overrides(assets / "model", data_path, work_dir))
        auto_set_device(config)
        initialize_global_process_group()
        trainer = sft_trainer.SFTTrainer(config=config)

        trainer.train_sampler.set_epoch(epoch=0)
        batch = next(iter(trainer.train_dataloader))
        # SYNC WARNING: verl/trainer/sft_trainer.py:SFTTrainer.fit (meta_info and the train/val calls below)
        meta_info = {
            "use_remove_padding": config.model.use_remove_padding,
            "use_dynamic_bsz": config.data.use_dynamic_bsz,
            "max_token_len_per_gpu": config.data.max_token_len_per_gpu,
            "micro_batch_size_per_gpu": config.data.micro_batch_size_per_gpu,
            "temperature": 1.0,
            "global_batch_size": trainer.global_batch_size,
            "pad_mode": config.data.pad_mode,
            "pad_token_id": trainer.model_config.tokenizer.pad_token_id,
        }
        val_data = tu.get_tensordict(tensor_dict=dict(batch), non_tensor_dict=meta_info)
        with engine_harness.recorded_model_inputs(trainer.engine) as val_calls:
            val_output = trainer.training_client.infer_batch(val_data)  # the validation pass of fit()

        # Control through the engine: position ids running on across the packed row instead of restarting at each
        # sequence, so nothing marks the boundaries any more: attention spans the whole row (and RoPE positions run on).
        offsets = batch["input_ids"].offsets()
        running = torch.nested.nested_tensor_from_jagged(torch.arange(int(offsets[-1])), offsets)
        leaky_data = tu.get_tensordict(tensor_dict=dict(batch, position_ids=running), non_tensor_dict=meta_info)
        leaky_output = trainer.training_client.infer_batch(leaky_data)

        train_data = tu.get_tensordict(tensor_dict=dict(batch), non_tensor_dict=meta_info)
        seqlens = NonTensorData(trainer._get_batch_seqlens(data=train_data))
        tu.assign_non_tensor(train_data, update_lr_scheduler=True, global_token_num=seqlens)
        with engine_harness.recorded_model_inputs(trainer.engine) as train_calls:
            train_output = trainer.training_client.train_batch(data=train_data)

        yield {
            "model_path": assets / "model",
            "batch": batch,
            "meta_info": meta_info,
            "log_probs": val_output["log_probs"],
            "val_loss": tu.get(val_output, "metrics")["loss"],
            "leaky_log_probs": leaky_output["log_probs"],
            "leaky_val_loss": tu.get(leaky_output, "metrics")["loss"],
            "train_metrics": tu.get(train_output, "metrics"),
            "val_calls": val_calls,
            "train_calls": train_calls,
        }


# ----------------------------------------------------------------------------------------------------------------------
# The expectation: fp32 transformers on each sequence alone
# ----------------------------------------------------------------------------------------------------------------------


def _token_log_probs(logits: torch.Tensor, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``log p(ids[t + 1] | ids[: t + 1])`` for ``t < L - 1`` over the first ``vocab_size`` ids (the tokenizer's, as
    the trainer normalises: ``trainer_vocabulary_support``); logits ``[L, V]``, ids ``[L]`` -> ``[L - 1]``."""
    return torch.log_softmax(logits[:-1, :vocab_size].float(), dim=-1).gather(-1, ids[1:, None]).squeeze(-1)


def _mean_token_loss(log_probs: list[torch.Tensor], loss_masks: list[torch.Tensor], shift: int = 1) -> torch.Tensor:
    """Mean negative log-prob over the batch's loss-mask tokens (verl's ``sft_loss`` reduction, one dp rank).

    ``log_probs[i][t]`` (``[L_i - 1]``) scores token ``t + 1`` of sequence ``i``, so its mask is ``loss_masks[i]``
    (``[L_i]``) at ``t + shift``: 1 is right, 0 the off-by-one control.
    """
    total = sum(lp @ mask[shift : shift + lp.shape[0]].to(lp.dtype) for lp, mask in zip(log_probs, loss_masks))
    return -total / sum(int(mask.sum()) for mask in loss_masks)


def _per_sequence(model, ids: list[torch.Tensor], vocab_size: int) -> list[torch.Tensor]:
    """Each sequence alone (no padding, no mask needed)."""
    return [_token_log_probs(model(input_ids=seq[None]).logits[0], seq, vocab_size) for seq in ids]


def _leaky_packed(model, ids: list[torch.Tensor], vocab_size: int) -> list[torch.Tensor]:
    """Control: the packed row with positions restarting per sequence but a plain causal mask over the whole row (an
    all-ones attention mask turns off transformers' packed-sequence detection), i.e. attention across sequences."""
    packed = torch.cat(ids)[None]
    positions = torch.cat([torch.arange(seq.shape[0]) for seq in ids])[None]
    logits = model(input_ids=packed, position_ids=positions, attention_mask=torch.ones_like(packed)).logits[0]
    chunks = logits.split([seq.shape[0] for seq in ids])
    return [_token_log_probs(chunk, seq, vocab_size) for chunk, seq in zip(chunks, ids)]


def _loss_and_grad_norm(model, log_probs: list[torch.Tensor], loss_masks: list[torch.Tensor]) -> tuple[float, float]:
    """``(loss, grad norm over all parameters)`` of :func:`_mean_token_loss`; ``log_probs`` still hold the graph."""
    model.zero_grad(set_to_none=True)
    loss = _mean_token_loss(log_probs, loss_masks)
    loss.backward()
    grads = [p.grad.norm() for p in model.parameters() if p.grad is not None]  # tied embeddings counted once
    return loss.item(), torch.linalg.vector_norm(torch.stack(grads)).item()


@pytest.fixture(scope="module")
def reference(sft_run):
    """fp32 transformers on the batch: per sequence alone (the expectation), under bf16 autocast (what bf16 explains)
    and leaky (the control); with the loss and grad norm of the expectation and of the control."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(sft_run["model_path"], dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    vocab_size = len(AutoTokenizer.from_pretrained(sft_run["model_path"]))
    ids = list(sft_run["batch"]["input_ids"].unbind())
    loss_masks = list(sft_run["batch"]["loss_mask"].unbind())

    log_probs = _per_sequence(model, ids, vocab_size)
    loss, grad_norm = _loss_and_grad_norm(model, log_probs, loss_masks)
    leaky = _leaky_packed(model, ids, vocab_size)
    leaky_loss, leaky_grad_norm = _loss_and_grad_norm(model, leaky, loss_masks)
    with torch.no_grad(), torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        bf16 = _per_sequence(model, ids, vocab_size)
    return {
        "loss_masks": loss_masks,
        "log_probs": [lp.detach() for lp in log_probs],
        "bf16": bf16,
        "leaky": [lp.detach() for lp in leaky],
        "loss": loss,
        "grad_norm": grad_norm,
        "leaky_loss": leaky_loss,
        "leaky_grad_norm": leaky_grad_norm,
    }


def _diff(got: list[torch.Tensor], expected: list[torch.Tensor]) -> tuple[float, float]:
    """``(max, mean)`` absolute difference over all tokens of all sequences."""
    diff = torch.cat([(g.float() - e.float()).abs() for g, e in zip(got, expected)])
    return diff.max().item(), diff.mean().item()


def _engine_log_probs(sft_run, key: str = "log_probs") -> list[torch.Tensor]:
    """The engine's per-token log-probs ``[L_i - 1]``, without each sequence's last position (``input_ids`` rolled
    over the packed row: it scores the next sequence's first token, and the rolled loss mask drops it)."""
    return [row[:-1].float() for row in sft_run[key].unbind()]


# ----------------------------------------------------------------------------------------------------------------------
# The checks
# ----------------------------------------------------------------------------------------------------------------------


def test_batch_is_packed_sequences_of_different_lengths(sft_run):
    lengths = sft_run["batch"]["input_ids"].offsets().diff().tolist()
    assert len(lengths) == BATCH and len(set(lengths)) >= 3, lengths
    assert sft_run["meta_info"]["use_remove_padding"] is True  # verl's default, as in the warm start
    for calls in (sft_run["val_calls"], sft_run["train_calls"]):
        # One micro-batch: all sequences packed in one row, no attention mask (only the position ids separate them).
        assert len(calls) == 1, calls
        assert calls[0]["attention_mask"] is None
        assert tuple(calls[0]["input_ids"].shape) == (1, sum(lengths))
    # sft_loss rolls the flattened loss mask left by one, so each sequence's last position takes the next sequence's
    # first mask value: that scores a token of another sequence unless every sequence starts outside the loss mask.
    masks = sft_run["batch"]["loss_mask"].unbind()
    assert all(int(mask[0]) == 0 and int(mask.sum()) > 0 for mask in masks), [mask.tolist() for mask in masks]


def test_model_is_context_sensitive(reference):
    """The controls can only fail if the context moves log-probs: it does, by > 1 nat per token on average (a
    sequence alone vs preceded by the batch's earlier sequences; measured 3.3)."""
    _, mean = _diff(reference["leaky"][1:], reference["log_probs"][1:])
    assert mean > 1.0, mean


def test_packed_log_probs_equal_per_sequence_transformers(sft_run, reference):
    """Every next-token log-prob of the validation pass (prompt and answer tokens) equals the sequence alone."""
    got = _engine_log_probs(sft_run)
    assert [g.shape for g in got] == [e.shape for e in reference["log_probs"]]
    max_diff, mean_diff = _diff(got, reference["log_probs"])  # measured 0.36, 0.061
    assert max_diff < LOG_PROB_MAX_ATOL and mean_diff < LOG_PROB_MEAN_ATOL, (max_diff, mean_diff)
    # The tolerances are what bf16 explains: plain transformers under bf16 autocast vs its fp32 run meets them too.
    bf16_max, bf16_mean = _diff(reference["bf16"], reference["log_probs"])  # measured 0.27, 0.053
    assert bf16_max < LOG_PROB_MAX_ATOL and bf16_mean < LOG_PROB_MEAN_ATOL, (bf16_max, bf16_mean)

    # Controls, each off by many tolerances: the engine's own pass over the batch with running position ids
    # (attention across sequences; measured mean 3.1), the leaky transformers reference (2.9), a one-token shift (4.5).
    _, engine_leak = _diff(_engine_log_probs(sft_run, "leaky_log_probs"), reference["log_probs"])
    _, leak = _diff(got, reference["leaky"])
    _, shift = _diff([g[1:] for g in got], [e[:-1] for e in reference["log_probs"]])
    assert min(engine_leak, leak, shift) > CONTROL_FACTOR * LOG_PROB_MEAN_ATOL, (engine_leak, leak, shift)


def test_sft_loss_reduces_over_the_assistant_tokens_of_the_batch(sft_run, reference):
    """verl's ``sft_loss`` on the fp32 reference log-probs, laid out as the engine returns them, is the per-token mean
    over the loss-mask tokens of the batch; each sequence's last position (another sequence's token) is ignored."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import sft_loss

    batch = sft_run["batch"]
    junk = torch.tensor([-1e4])  # the last position; a loss that read it would be off by ~1e4 / tokens
    rows = torch.cat([torch.cat([lp, junk]) for lp in reference["log_probs"]])
    model_output = {"log_probs": torch.nested.nested_tensor_from_jagged(rows, batch["input_ids"].offsets())}
    data = tu.get_tensordict(tensor_dict=dict(batch), non_tensor_dict=sft_run["meta_info"])
    # SYNC WARNING: verl/workers/engine/fsdp/transformer_impl.py:FSDPEngine.forward_backward_batch (keys for the loss)
    tu.assign_non_tensor(data, batch_num_tokens=int(batch["loss_mask"].sum()), dp_size=1)
    loss, _ = sft_loss(config=None, model_output=model_output, data=data)

    expected = _mean_token_loss(reference["log_probs"], reference["loss_masks"])
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)
    # Controls: the mask read one token early (measured 0.87 off) and a mean of per-sequence means.
    shifted = _mean_token_loss(reference["log_probs"], reference["loss_masks"], shift=0)
    per_sequence = -torch.stack(
        [lp @ mask[1:].float() / mask.sum() for lp, mask in zip(reference["log_probs"], reference["loss_masks"])]
    ).mean()
    assert min(abs(shifted - expected), abs(per_sequence - expected)) > 1e-3, (shifted, per_sequence, expected)


def test_engine_loss_and_grad_norm_equal_per_sequence_transformers(sft_run, reference):
    """The loss of the validation pass and of the training step, and the step's grad norm, as fit() logs them."""
    expected, tolerance = reference["loss"], LOSS_RTOL * abs(reference["loss"])
    val_loss, train_loss = sft_run["val_loss"], sft_run["train_metrics"]["loss"]
    assert abs(val_loss - expected) < tolerance, (val_loss, expected)  # measured 13.5 vs 13.471
    assert abs(train_loss - expected) < tolerance, (train_loss, expected)
    grad_norm = sft_run["train_metrics"]["grad_norm"]  # measured 7.583 vs 7.594 (0.1 %)
    assert abs(grad_norm - reference["grad_norm"]) < GRAD_NORM_RTOL * reference["grad_norm"], (grad_norm, reference)

    # Controls: the mask read one token early, and the leaky reference's grad norm. A leak is not one of them here: it
    # moves this batch's mean loss much less than its tokens (per-token errors of both signs cancel; on the head_dim-32
    # model the engine's pass with running position ids is off by 0.065, one tolerance), so the per-token check above
    # (test_packed_log_probs_equal_per_sequence_transformers) is the one that catches it.
    shifted = _mean_token_loss(reference["log_probs"], reference["loss_masks"], shift=0).item()
    assert abs(shifted - expected) > CONTROL_FACTOR * tolerance, (shifted, expected)
    leaky_grad_norm = reference["leaky_grad_norm"]
    assert abs(leaky_grad_norm - reference["grad_norm"]) > 5 * GRAD_NORM_RTOL * reference["grad_norm"], (
        leaky_grad_norm,
        reference["grad_norm"],
    )
