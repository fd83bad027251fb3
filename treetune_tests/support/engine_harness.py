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
"""verl FSDP engine workers in the test process (no Ray), called as verl's trainer calls them.

Shared by the CPO engine tests (``treetune_tests/treetune_recipe/cpo/test_cpo_engine_on_cpu.py``, its GPU twin
``test_cpo_engine.py``; their checks: :mod:`treetune_tests.support.engine_checks`), the distribution-pass and
distribution-loss tests and the SFT-loss test (process group, recorded model inputs).

- :func:`actor_worker` / :func:`ref_worker` build verl's ``TrainingWorker`` for the actor (with the CPO loss installed)
  and for the reference policy the way ``ActorRolloutRefWorker.init_model`` does, on the device torch sees.
- :func:`engine_log_probs`, :func:`update_request` / :func:`engine_update` and :func:`engine_format` send a batch as
  ``_compute_old_log_prob``, ``_update_actor`` and ``FSDPEngine.forward_backward_batch`` do.
- :func:`engine_fixture`: the actor and ref workers on the tiny assets' model, and what the checks need.

The batches and the fp32 expectation they are compared with: :mod:`treetune_tests.support.fp32_reference`.
"""

from __future__ import annotations

import contextlib
import os
import socket
from functools import partial
from pathlib import Path

import torch
import verl_cpu.activate  # noqa: F401  (as in every Ray process of a CPU run: verl-cpu when no accelerator)
from hydra import compose, initialize_config_dir
from verl import DataProto
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

from treetune_recipe.cpo import CONFIG_DIR, CONFIG_NAME
from treetune_recipe.cpo.config import CPOConfig
from treetune_recipe.cpo.methods.loss import cpo_ppo_loss
from treetune_tests.support.fp32_reference import BATCH

#: Batching profiles of the engine checks: fixed micro-batches of 2 (infer) / 4 (update) rows, or dynamic batch size
#: with a token budget of 256 (about four plain rows or one hinted row per micro-batch).
BATCHING = {
    "fixed_micro_batches": [
        "actor_rollout_ref.actor.use_dynamic_bsz=false",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={BATCH // 2}",
    ],
    "dynamic_batch_size": [
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=256",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=256",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=256",
    ],
}


#: The update check compares the engine's loss and grad norm with fp32 transformers, whose ratio to the old log-probs
#: is exactly 1; the engine's is 1 +- its bf16 noise, so with verl's clip range (0.2) the few noisiest tokens were
#: clipped in the engine only (1.7 % of them, the grad norm 7 % off on the context-sensitive model). The check is about
#: the forward and backward numerics, not about clipping: no token is clipped (dual clip included).
UNCLIPPED = (
    "actor_rollout_ref.actor.clip_ratio_low=10",
    "actor_rollout_ref.actor.clip_ratio_high=10",
    "actor_rollout_ref.actor.clip_ratio_c=1000",
)


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
    """torch.distributed with one rank in this process (the environment a verl Ray worker, or a process of
    ``torch.distributed.run --nproc_per_node=1``, sees); the variables verl's set-up writes are restored after."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    env["MASTER_PORT"] = str(port)
    saved = {key: os.environ.get(key) for key in (*env, "TOKENIZERS_PARALLELISM", "NCCL_DEBUG")}
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


def _training_worker_config(model_config, role_config):
    """The ``TrainingWorkerConfig`` ``init_model`` builds for a role (actor or ref) from its ``ActorConfig``."""
    from verl.workers.config import TrainingWorkerConfig

    role_config.model_config = model_config
    return TrainingWorkerConfig(
        model_type="language_model",
        model_config=model_config,
        engine_config=role_config.engine,
        optimizer_config=role_config.optim,
        checkpoint_config=role_config.checkpoint,
    )


def actor_worker(config, cpo: CPOConfig):
    """verl's actor ``TrainingWorker`` with ``cpo_ppo_loss`` installed; returns ``(worker, actor_config)``."""
    from verl.workers.engine_workers import TrainingWorker

    # SYNC WARNING: verl/workers/engine_workers.py:ActorRolloutRefWorker.init_model (actor part) builds the same
    # TrainingWorkerConfig and engine settings from the actor, rollout and model sections.
    model_config = omega_conf_to_dataclass(config.actor_rollout_ref.model)
    actor_config = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    training_config = _training_worker_config(model_config, actor_config)
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


def ref_worker(config):
    """verl's reference-policy ``TrainingWorker`` (forward only), configured as ``init_model`` configures it."""
    from omegaconf import open_dict
    from verl.workers.engine_workers import TrainingWorker

    # SYNC WARNING: verl/workers/engine_workers.py:ActorRolloutRefWorker.init_model (l.465-500, reference part):
    # the ref section's log_prob_* keys become its ppo_* keys, then the same TrainingWorkerConfig as the actor's.
    ref = config.actor_rollout_ref.ref.copy()
    with open_dict(ref):
        ref.ppo_mini_batch_size = config.actor_rollout_ref.actor.ppo_mini_batch_size
        ref.ppo_micro_batch_size = ref.pop("log_prob_micro_batch_size", None)
        ref.ppo_micro_batch_size_per_gpu = ref.pop("log_prob_micro_batch_size_per_gpu", None)
        ref.use_dynamic_bsz = ref.pop("log_prob_use_dynamic_bsz", False)
        ref.ppo_max_token_len_per_gpu = ref.pop("log_prob_max_token_len_per_gpu", None)
    model_config = omega_conf_to_dataclass(config.actor_rollout_ref.model)
    training_config = _training_worker_config(model_config, omega_conf_to_dataclass(ref))
    engine = training_config.engine_config
    engine.forward_only = True
    engine.use_dynamic_bsz = ref.use_dynamic_bsz
    engine.infer_max_token_len_per_gpu = ref.ppo_max_token_len_per_gpu
    engine.infer_micro_batch_size_per_gpu = ref.ppo_micro_batch_size_per_gpu
    engine.use_remove_padding = model_config.use_remove_padding
    worker = TrainingWorker(config=training_config)
    worker.reset()
    return worker


def engine_log_probs(worker, batch: DataProto, calculate_entropy: bool = True):
    """``(log_probs [B, T], entropy [B, T] or None)`` of the engine's forward pass, as ``_compute_old_log_prob``."""
    # SYNC WARNING: verl/trainer/ppo/ray_trainer.py:RayPPOTrainer._compute_old_log_prob (engine path, steps 1-4)
    data = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(data, calculate_entropy=calculate_entropy, compute_loss=False)
    output = worker.infer_batch(data)
    mask = batch.batch["response_mask"]
    log_probs = no_padding_2_padding(tu.get(output, "log_probs"), data).float().cpu() * mask
    if not calculate_entropy:
        return log_probs, None
    return log_probs, no_padding_2_padding(tu.get(output, "entropy"), data).float().cpu() * mask


def update_request(batch: DataProto, **flags) -> tu.TensorDict:
    """``RayPPOTrainer._update_actor``'s request for one mini-batch of the whole batch, with ``flags`` on top (e.g.
    ``distillation_use_topk=True``, as ``student_logits_in_update`` adds)."""
    # SYNC WARNING: verl/trainer/ppo/ray_trainer.py:RayPPOTrainer._update_actor (engine path, non-tensor keys)
    data = left_right_2_no_padding(batch.to_tensordict())
    settings = dict(
        calculate_entropy=True,
        global_batch_size=len(batch),
        mini_batch_size=len(batch),
        epochs=1,
        seed=0,
        dataloader_kwargs={"shuffle": False},
    )
    tu.assign_non_tensor(data, **{**settings, **flags})
    return data


def engine_update(worker, batch: DataProto) -> dict:
    """One actor update (one mini-batch of the whole batch) as ``RayPPOTrainer._update_actor``; returns the metrics."""
    return tu.get(worker.train_mini_batch(update_request(batch)), "metrics")


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


@contextlib.contextmanager
def recorded_model_inputs(engine):
    """Record the model inputs of each forward micro-batch of ``engine`` inside the block (one dict per micro-batch,
    keys ``input_ids`` and ``attention_mask``): ``with recorded_model_inputs(worker.engine) as calls: ...``.

    Only this engine instance is wrapped (an instance attribute, removed after the block); upstream is untouched.
    """
    original = engine.prepare_model_inputs
    calls = []

    def recording(*args, **kwargs):
        model_inputs, output_args = original(*args, **kwargs)
        calls.append({key: model_inputs.get(key) for key in ("input_ids", "attention_mask")})
        return model_inputs, output_args

    engine.prepare_model_inputs = recording
    try:
        yield calls
    finally:
        del engine.prepare_model_inputs


@contextlib.contextmanager
def engine_fixture(assets_dir: Path, *overrides: str):
    """Actor and ref engine workers on the assets' model and what the checks need (process group torn down after)."""
    from transformers import AutoTokenizer

    from treetune_recipe.cpo.teacher.hint import HintConfig

    model_path = Path(assets_dir) / "model"
    config = compose_config(model_path, *UNCLIPPED, *overrides)
    cpo = CPOConfig(method="mi3", pos_alpha=0.3, neg_alpha=0.5)
    with single_process_group():
        actor, actor_config = actor_worker(config, cpo)
        yield dict(
            config=config,
            actor=actor,
            ref=ref_worker(config),
            actor_config=actor_config,
            cpo=cpo,
            model_path=model_path,
            tokenizer=AutoTokenizer.from_pretrained(model_path),
            hint_config=HintConfig.from_config(config.cpo.hint).resolve(config.data.max_prompt_length),
        )
