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
"""One verl FSDP engine worker in the test process (no Ray), and the same computations with plain transformers.

Shared by the CPU twin (``test_cpo_engine_on_cpu.py``) and the GPU tier (``test_cpo_engine.py``); loaded by path
(test folders are not packages under ``--import-mode=importlib``).

- :func:`actor_worker` builds verl's ``TrainingWorker`` for the actor the way ``ActorRolloutRefWorker.init_model``
  does (verl 0.7.1), on the device torch sees (CUDA when available), with the CPO loss installed.
- :func:`update_batch` / :func:`hint_batch` build the engine-format inputs of an actor update and of the hinted
  log-prob pass from a rollout-like batch of the tiny assets.
- :func:`reference_outputs` computes per-token log-probs and entropies with ``AutoModelForCausalLM`` in fp32 on CPU,
  the independent expectation.
"""

from __future__ import annotations

import contextlib
import os
import socket
from functools import partial
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from verl import DataProto
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

import treetune_verl.cpu_backend  # noqa: F401  (as in every Ray process of a run: CPU patches when no accelerator)
from treetune_recipe.cpo import CONFIG_DIR, CONFIG_NAME
from treetune_recipe.cpo.config import CPOConfig
from treetune_recipe.cpo.cpo_loss import cpo_ppo_loss

BATCH, PROMPT_WIDTH, RESPONSE_WIDTH = 8, 12, 10


def compose_config(model_path: Path, *overrides: str):
    """The recipe's config with the tiny profile (``platform=cpu`` sets the small sizes, sdpa and fsdp2)."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(
            CONFIG_NAME,
            overrides=[
                "platform=cpu",
                f"actor_rollout_ref.model.path={model_path}",
                f"actor_rollout_ref.actor.ppo_mini_batch_size={BATCH}",
                f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={BATCH // 2}",
                "actor_rollout_ref.rollout.n=1",
                "actor_rollout_ref.actor.use_kl_loss=true",
                *overrides,
            ],
        )


@contextlib.contextmanager
def single_process_group():
    """torch.distributed with one rank in this process (env as a Ray worker of verl would see it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def actor_worker(config, cpo: CPOConfig):
    """verl's actor ``TrainingWorker`` with ``cpo_ppo_loss`` installed; returns ``(worker, actor_config)``."""
    from verl.workers.config import TrainingWorkerConfig
    from verl.workers.engine_workers import TrainingWorker

    # SYNC WARNING: verl/workers/engine_workers.py:ActorRolloutRefWorker.init_model (actor part) builds the same
    # TrainingWorkerConfig and engine settings from the actor, rollout and model sections.
    model_config = omega_conf_to_dataclass(config.actor_rollout_ref.model)
    actor_config = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    actor_config.model_config = model_config
    training_config = TrainingWorkerConfig(
        model_type="language_model",
        model_config=model_config,
        engine_config=actor_config.engine,
        optimizer_config=actor_config.optim,
        checkpoint_config=actor_config.checkpoint,
    )
    engine = training_config.engine_config
    engine.use_dynamic_bsz = config.actor_rollout_ref.actor.use_dynamic_bsz
    engine.infer_max_token_len_per_gpu = config.actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu
    engine.infer_micro_batch_size_per_gpu = config.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu
    engine.max_token_len_per_gpu = config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu
    engine.micro_batch_size_per_gpu = config.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu
    engine.use_remove_padding = model_config.use_remove_padding
    worker = TrainingWorker(config=training_config)
    worker.reset()
    worker.set_loss_fn(partial(cpo_ppo_loss, config=actor_config, cpo=cpo))
    return worker, actor_config


def rollout_batch(tokenizer, seed: int = 0) -> DataProto:
    """Rollout-shaped batch: left-padded prompts, right-padded responses, two rows per prompt group."""
    gen = torch.Generator().manual_seed(seed)
    vocab = [i for i in range(len(tokenizer)) if i not in set(tokenizer.all_special_ids)]
    tokens = torch.tensor(vocab)[torch.randint(0, len(vocab), (BATCH, PROMPT_WIDTH + RESPONSE_WIDTH), generator=gen)]
    prompt_lens = torch.randint(3, PROMPT_WIDTH + 1, (BATCH,), generator=gen)
    response_lens = torch.randint(2, RESPONSE_WIDTH + 1, (BATCH,), generator=gen)
    response_lens[0] = RESPONSE_WIDTH
    prompt_mask = (torch.arange(PROMPT_WIDTH)[None, :] >= PROMPT_WIDTH - prompt_lens[:, None]).long()
    response_mask = (torch.arange(RESPONSE_WIDTH)[None, :] < response_lens[:, None]).long()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    prompts = torch.where(prompt_mask.bool(), tokens[:, :PROMPT_WIDTH], pad)
    responses = torch.where(response_mask.bool(), tokens[:, PROMPT_WIDTH:], pad)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=-1)
    seq_rewards = torch.tensor([1.0, -1.0] * (BATCH // 2))
    token_level_rewards = torch.zeros(BATCH, RESPONSE_WIDTH)
    token_level_rewards[torch.arange(BATCH), response_lens - 1] = seq_rewards
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=-1),
        "attention_mask": attention_mask,
        "position_ids": torch.clip(attention_mask.cumsum(-1) - 1, min=0),
        "response_mask": response_mask,
        "token_level_rewards": token_level_rewards,
        "advantages": torch.randn(BATCH, 1, generator=gen) * response_mask,
        "seq_rewards": seq_rewards,
        "difficulty": torch.zeros(BATCH),
    }
    uids = np.array([f"g{i // 2}" for i in range(BATCH)], dtype=object)
    questions = [tokenizer.decode(prompts[i][prompt_mask[i].bool()]) for i in range(BATCH)]
    extra_info = np.array([{"question": q, "solution": f"{q} = 7"} for q in questions], dtype=object)
    return DataProto.from_dict(
        tensors=tensors,
        non_tensors={"uid": uids, "extra_info": extra_info, "index": np.arange(BATCH)},
        meta_info={"temperature": 1.0},
    )


def reference_outputs(model_path: Path, batch: DataProto, with_grad: bool = False):
    """Per-token ``(log_probs [B, T], entropy [B, T], model)`` of the response tokens, fp32 transformers on CPU."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32, attn_implementation="sdpa")
    width = batch.batch["responses"].shape[1]
    with torch.set_grad_enabled(with_grad):
        logits = (
            model(
                input_ids=batch.batch["input_ids"],
                attention_mask=batch.batch["attention_mask"],
                position_ids=batch.batch["position_ids"],
            )
            .logits[:, -width - 1 : -1]
            .float()
        )
        log_softmax = torch.log_softmax(logits, dim=-1)
        log_probs = log_softmax.gather(-1, batch.batch["responses"][..., None]).squeeze(-1)
        entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    mask = batch.batch["response_mask"].float()
    return log_probs * mask, entropy * mask, model


def engine_log_probs(worker, batch: DataProto) -> torch.Tensor:
    """``old_log_probs [B, T]`` of the engine's forward pass, converted as ``RayPPOTrainer._compute_old_log_prob``."""
    # SYNC WARNING: verl/trainer/ppo/ray_trainer.py:RayPPOTrainer._compute_old_log_prob (engine path, steps 1-4)
    data = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(data, calculate_entropy=True, compute_loss=False)
    output = worker.infer_batch(data)
    return no_padding_2_padding(tu.get(output, "log_probs"), data).float().cpu() * batch.batch["response_mask"]


def engine_update(worker, batch: DataProto) -> dict:
    """One actor update (one mini-batch, two micro-batches) as ``RayPPOTrainer._update_actor``; returns the metrics."""
    # SYNC WARNING: verl/trainer/ppo/ray_trainer.py:RayPPOTrainer._update_actor (engine path, non-tensor keys)
    data = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(
        data,
        calculate_entropy=True,
        global_batch_size=BATCH,
        mini_batch_size=BATCH,
        epochs=1,
        seed=0,
        dataloader_kwargs={"shuffle": False},
    )
    output = worker.train_mini_batch(data)
    return tu.get(output, "metrics")


def engine_format(batch: DataProto, actor_config) -> tu.TensorDict:
    """The whole batch as one engine micro-batch with the per-batch keys ``forward_backward_batch`` adds."""
    # SYNC WARNING: verl/workers/engine/fsdp/transformer_impl.py:FSDPEngine.forward_backward_batch (non-tensor keys)
    data = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(
        data,
        calculate_entropy=True,
        global_batch_size=BATCH,
        use_dynamic_bsz=actor_config.use_dynamic_bsz,
        max_token_len_per_gpu=actor_config.ppo_max_token_len_per_gpu,
        use_remove_padding=False,
        sp_size=1,
        batch_num_tokens=int(batch.batch["response_mask"].sum()),
        dp_size=1,
    )
    return data


def as_nested(values: torch.Tensor, batch: DataProto, data) -> torch.Tensor:
    """Padded response values ``[B, T]`` -> the engine's jagged per-sequence layout (position p - 1 + t)."""
    rows = []
    prompt_lens = batch.batch["attention_mask"][:, : batch.batch["prompts"].shape[1]].sum(-1)
    response_lens = batch.batch["response_mask"].sum(-1)
    for i in range(values.shape[0]):
        p, r = int(prompt_lens[i]), int(response_lens[i])
        row = torch.zeros(p + r, dtype=values.dtype)
        row = torch.cat([row[: p - 1], values[i, :r], row[p - 1 + r :]])
        rows.append(row)
    return torch.nested.nested_tensor_from_jagged(torch.cat(rows), data["input_ids"].offsets())


# --------------------------------------------------------------------------------------------------------------
# The checks (one per test; the CPU twin and the GPU tier run the same ones)
# --------------------------------------------------------------------------------------------------------------
#: Engine (bf16 parameters and autocast) vs fp32 transformers: per-token log-probs (bf16 logits of the tiny model are
#: about -6 +- 3, so a few hundredths), the scalar loss and the gradient norm.
LOG_PROB_TOL, LOSS_ATOL, GRAD_NORM_RTOL = 5e-2, 3e-2, 5e-2


@contextlib.contextmanager
def engine_fixture(assets_dir: Path, *overrides: str):
    """An actor engine worker on the tiny model plus what the checks need; torch.distributed is torn down after."""
    from transformers import AutoTokenizer

    from treetune_recipe.cpo.cpo_hint import HintConfig

    model_path = Path(assets_dir) / "model"
    config = compose_config(model_path, *overrides)
    cpo = CPOConfig(wrap_method="mi3", pos_alpha=0.3, neg_alpha=0.5)
    with single_process_group():
        worker, actor_config = actor_worker(config, cpo)
        yield dict(
            worker=worker,
            actor_config=actor_config,
            cpo=cpo,
            model_path=model_path,
            tokenizer=AutoTokenizer.from_pretrained(model_path),
            hint_config=HintConfig.from_config(config.cpo.hint).resolve(PROMPT_WIDTH),
        )


def check_hinted_log_probs(engine: dict) -> None:
    """The hint batch of :func:`rollout_batch` scored by the engine equals fp32 transformers on the same tokens."""
    from treetune_recipe.cpo.cpo_hint import build_hint_batch

    batch = rollout_batch(engine["tokenizer"])
    hint, metrics = build_hint_batch(batch, engine["tokenizer"], engine["hint_config"])
    assert metrics["cpo/hint_missing_frac"] == 0
    assert hint.batch["prompts"].shape[1] > batch.batch["prompts"].shape[1]  # the hint prompt is really longer
    got = engine_log_probs(engine["worker"], hint)
    expected, _, _ = reference_outputs(engine["model_path"], hint)
    # A token scored at a shifted position or under the wrong padding would be off by whole nats (random tokens).
    torch.testing.assert_close(got, expected, atol=LOG_PROB_TOL, rtol=LOG_PROB_TOL)


def check_cpo_update(engine: dict) -> None:
    """One actor update with the CPO loss: the engine's loss and grad norm equal fp32 transformers + cpo_ppo_loss."""
    batch = rollout_batch(engine["tokenizer"], seed=1)
    old, _, _ = reference_outputs(engine["model_path"], batch)
    gen = torch.Generator().manual_seed(2)
    mask = batch.batch["response_mask"].float()
    batch.batch["old_log_probs"] = old
    batch.batch["ref_log_prob"] = old + 0.05 * torch.randn(old.shape, generator=gen) * mask
    batch.batch["gw_log_probs"] = (old + torch.randn(old.shape, generator=gen)).clamp(max=0) * mask

    log_probs, entropy, model = reference_outputs(engine["model_path"], batch, with_grad=True)
    data = engine_format(batch, engine["actor_config"])
    model_output = {"log_probs": as_nested(log_probs, batch, data), "entropy": as_nested(entropy, batch, data)}
    expected_loss, _ = cpo_ppo_loss(engine["actor_config"], model_output, data, cpo=engine["cpo"])
    expected_loss.backward()
    expected_grad_norm = torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None])
    )

    metrics = engine_update(engine["worker"], batch)
    loss = float(np.sum(metrics["loss"]))
    grad_norm = float(np.mean(metrics["grad_norm"]))
    assert abs(loss - expected_loss.item()) < LOSS_ATOL, (loss, expected_loss.item(), metrics)
    assert abs(grad_norm - expected_grad_norm.item()) < GRAD_NORM_RTOL * expected_grad_norm.item(), (
        grad_norm,
        expected_grad_norm.item(),
    )
    assert abs(expected_loss.item()) > 10 * LOSS_ATOL or expected_grad_norm > 0  # a non-trivial update
