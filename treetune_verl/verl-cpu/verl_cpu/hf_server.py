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
"""The ``hf`` rollout: a Hugging Face transformers generation server plugged into verl's agent loop.

Three pieces, each the counterpart of one piece of verl's vLLM rollout:

- :class:`HFGenerationServer` (a Ray actor, like ``vLLMHttpServer``): owns an fp32 copy of the policy and answers
  ``generate(prompt_ids, sampling_params, request_id, ...) -> TokenOutput``, the token-in/token-out contract the
  agent loop uses. Concurrent requests are gathered for a short window, grouped by sampling settings, left-padded
  and decoded together on a thread (:mod:`verl_cpu.hf_generation`), so the event loop keeps accepting requests. Each
  request samples from its own RNG, seeded from the request alone (:func:`request_seed`), so its tokens do not
  depend on the requests it is batched with. It also implements the lifecycle calls verl makes on a server (sleep,
  wake_up, abort, resume, clear_kv_cache, profiling, ...), as no-ops where nothing needs freeing on CPU.
- :class:`HFReplica` (a ``RolloutReplica``, like ``vLLMReplica``): started by ``AgentLoopManager``; launches one
  named server per replica next to its trainer worker (hybrid mode).
- :class:`HFServerAdapter` (a ``BaseRollout``, like vLLM's ``ServerAdapter``): lives in the trainer worker;
  ``update_weights`` gathers the full weights the engine yields and sends them to the server each step.

Both registries are filled by :func:`verl_cpu.registrations.register_hf_rollout`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import ray
import torch
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import HFModelConfig, RolloutConfig
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutMode, RolloutReplica, TokenOutput

from verl_cpu.hf_generation import Generation, SamplingSettings, decode_batch, resolve_max_tokens

logger = logging.getLogger(__name__)

#: Seconds the server waits after the first pending request so that concurrent requests share one batch.
BATCH_WINDOW_S = 0.01
#: Environment variable setting the server's torch thread count. Unset: torch's default in a Ray actor (Ray sets
#: OMP_NUM_THREADS=1), which is fastest for tiny models on few cores; raise it for larger models.
THREADS_ENV = "VERL_CPU_HF_SERVER_THREADS"
#: Seed of the server's sampling, mixed into every request's own RNG seed (:func:`request_seed`), so that a run's
#: rollouts are reproducible; a run sets another one with ``++actor_rollout_ref.rollout.engine_kwargs.hf.seed=<int>``.
SAMPLING_SEED = 1234


def sampling_seed(rollout_config) -> int:
    """``actor_rollout_ref.rollout.engine_kwargs.hf.seed`` if set, else :data:`SAMPLING_SEED`."""
    hf_kwargs = (getattr(rollout_config, "engine_kwargs", None) or {}).get("hf") or {}
    seed = hf_kwargs.get("seed")
    return SAMPLING_SEED if seed is None else int(seed)


def request_seed(
    server_seed: int,
    replica_rank: int,
    global_steps: int | None,
    priority: int,
    prompt_ids: list[int],
    occurrence: int,
) -> int:
    """Seed of one request's sampling RNG: a 63-bit hash of everything that identifies the request.

    The key is hashed with BLAKE2b over a canonical JSON encoding (stable across processes and machines, unlike
    Python's salted ``hash()``), so a request's sampled tokens depend on the request only, not on its arrival time or
    on the requests it shares a decoding batch with.

    Args:
        server_seed: the server's sampling seed (:func:`sampling_seed`).
        replica_rank: the server's replica (occurrences are counted per server: with several replicas, the samples
            of one prompt that land on different servers must still draw differently).
        global_steps: trainer step of the server's weights (None: never set).
        priority: the caller's per-sample id (see :meth:`HFGenerationServer.generate`).
        prompt_ids: prompt token ids.
        occurrence: number of earlier requests with the same ``(global_steps, priority, prompt_ids)`` on this server.

    Returns:
        An int in ``[0, 2**63)``.
    """
    steps = -1 if global_steps is None else int(global_steps)
    key = [int(server_seed), int(replica_rank), steps, int(priority), int(occurrence)]
    payload = json.dumps([key, [int(token) for token in prompt_ids]], separators=(",", ":")).encode()
    digest = hashlib.blake2b(payload, digest_size=8, person=b"verl_cpu.hf").digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def server_actor_name(replica_rank: int, is_reward_model: bool = False) -> str:
    """Ray actor name of the server of one replica (looked up by the worker-side adapter)."""
    return f"verl_cpu_hf_server{'_reward' if is_reward_model else ''}_{replica_rank}"


@dataclass
class _Request:
    prompt_ids: list[int]
    max_tokens: int
    settings: SamplingSettings
    generator: torch.Generator = field(repr=False)
    future: asyncio.Future = field(repr=False)


class HFGenerationServer:
    """Token-in/token-out generation server around a Hugging Face causal LM (use as a Ray async actor).

    Args:
        config: rollout config (``RolloutConfig`` or its DictConfig).
        model_config: model config (``HFModelConfig`` or the DictConfig ``actor_rollout_ref.model``).
        replica_rank: rank of the replica this server belongs to, part of every request's seed. With one replica
            (the CPU default) a run's draws are reproducible; with several, which replica serves a request follows
            verl's load balancer, and so do its draws.
        batch_window_s: how long to wait for more requests before decoding a batch.
    """

    def __init__(self, config, model_config, replica_rank: int = 0, batch_window_s: float = BATCH_WINDOW_S):
        from transformers import AutoModelForCausalLM

        self.config: RolloutConfig = omega_conf_to_dataclass(config)
        self.model_config: HFModelConfig = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.replica_rank = replica_rank
        self.batch_window_s = batch_window_s
        if os.environ.get(THREADS_ENV):
            torch.set_num_threads(int(os.environ[THREADS_ENV]))

        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_config.local_path,
            dtype=torch.float32,
            attn_implementation="sdpa",
            trust_remote_code=self.model_config.trust_remote_code,
        )
        self.model.eval()
        self.max_model_len = self._resolve_max_model_len()
        self.eos_token_ids = self._eos_token_ids()
        pad = self.model_config.tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else self.eos_token_ids[0]

        self.global_steps: int | None = None
        self.weight_updates = 0
        self.decoded_batches = 0
        self._pending: list[_Request] = []
        self._batcher: asyncio.Task | None = None
        self._model_lock = asyncio.Lock()
        self._sampling_seed = sampling_seed(self.config)
        # occurrences of each (priority, prompt) since global_steps last changed (key: hash of the two)
        self._occurrences: dict[bytes, int] = {}
        self._occurrences_steps: int | None = None

    def _resolve_max_model_len(self) -> int:
        positions = getattr(self.model.config, "max_position_embeddings", None)
        configured = self.config.max_model_len
        if configured is None:
            if positions is None:
                return self.config.prompt_length + self.config.response_length
            return int(positions)
        if positions is not None and configured > positions:
            raise ValueError(
                f"rollout.max_model_len ({configured}) exceeds the model's max_position_embeddings ({positions})."
            )
        return int(configured)

    def _eos_token_ids(self) -> list[int]:
        ids: set[int] = set()
        if self.model_config.tokenizer.eos_token_id is not None:
            ids.add(int(self.model_config.tokenizer.eos_token_id))
        generation_config = self.model_config.generation_config
        eos = getattr(generation_config, "eos_token_id", None) if generation_config is not None else None
        if eos is not None:
            ids.update(int(token) for token in (eos if isinstance(eos, list | tuple) else [eos]))
        if not ids:
            raise ValueError(f"The tokenizer at {self.model_config.local_path} has no eos_token; set one.")
        return sorted(ids)

    # ---------------------------------------------------------------- generation

    async def ready(self) -> bool:
        """Returns once the model is loaded (the constructor ran)."""
        return True

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: list[Any] | None = None,
        video_data: list[Any] | None = None,
        priority: int = 0,
    ) -> TokenOutput:
        """Generate a continuation of ``prompt_ids`` (same contract as verl's ``vLLMHttpServer.generate``).

        Args:
            prompt_ids: prompt token ids.
            sampling_params: ``temperature, top_p, top_k, repetition_penalty`` (``temperature=0`` or
                ``do_sample=False``: greedy), ``logprobs`` (bool: return per-token log-probs), optional
                ``max_tokens``/``max_new_tokens``, optional ``seed`` (vLLM's per-request seed: an int that takes the
                priority's place in the request's key, so a caller that seeds each sample gets that sample's draw
                whatever order the samples of a prompt arrive in).
            request_id: caller's id (unused: requests are independent).
            image_data, video_data: not supported (text-only server).
            priority: the caller's id of the sample; it does not order requests. It is part of the key of the
                request's sampling RNG (:func:`request_seed`) with the server's seed, ``global_steps``, the prompt ids
                and the occurrence (the number of earlier requests with the same priority and prompt since
                ``global_steps`` last changed). Equal keys give equal tokens, whatever batch the request is decoded
                in, so a rerun with the same seed samples the same. verl 0.9.1's agent loop computes a batch-unique
                priority per sample (its row) but its ``LLMServerClient`` forwards it to vLLM servers only, and
                verl 0.7.1 has none: the server then gets 0, and the occurrence tells apart the samples of a
                prompt (which of them gets which draw follows their arrival order, unless each brings a ``seed``).

        Returns:
            ``TokenOutput`` with the generated ids (eos kept), their log-probs if asked, ``stop_reason="completed"``
            and ``extra_fields["global_steps"]`` (the trainer step of the weights that generated it).
        """
        if image_data or video_data:
            raise NotImplementedError("The hf rollout server is text-only; image/video inputs are not supported.")
        prompt_ids = [int(token) for token in prompt_ids]
        params = dict(sampling_params)
        want_log_probs = bool(params.pop("logprobs", False))
        request_key = params.pop("seed", None)
        sample_id = int(priority) if request_key is None else int(request_key)
        max_tokens = resolve_max_tokens(
            params,
            len(prompt_ids),
            max_model_len=self.max_model_len,
            prompt_length=self.config.prompt_length,
            response_length=self.config.response_length,
        )
        settings = SamplingSettings.from_params(params)
        generator = torch.Generator().manual_seed(self._request_seed(sample_id, prompt_ids))

        future = asyncio.get_running_loop().create_future()
        self._pending.append(_Request(prompt_ids, max_tokens, settings, generator, future))
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.create_task(self._run_batches())
        generation: Generation = await future
        return TokenOutput(
            token_ids=generation.token_ids,
            log_probs=generation.log_probs if want_log_probs else None,
            stop_reason="completed",
            extra_fields={"global_steps": self.global_steps},
        )

    def _request_seed(self, priority: int, prompt_ids: list[int]) -> int:
        """Seed of a new request's RNG; counts the request among those with its ``(global_steps, priority, prompt)``.

        The counts restart whenever ``global_steps`` changes, so they hold one step's requests at most.
        """
        if self.global_steps != self._occurrences_steps:
            self._occurrences.clear()
            self._occurrences_steps = self.global_steps
        identity = hashlib.blake2b(json.dumps([priority, prompt_ids], separators=(",", ":")).encode()).digest()
        occurrence = self._occurrences.get(identity, 0)
        self._occurrences[identity] = occurrence + 1
        return request_seed(self._sampling_seed, self.replica_rank, self.global_steps, priority, prompt_ids, occurrence)

    async def _run_batches(self) -> None:
        """Drain pending requests: wait a short window, then decode them grouped by sampling settings."""
        while self._pending:
            await asyncio.sleep(self.batch_window_s)
            requests, self._pending = self._pending, []
            groups: dict[SamplingSettings, list[_Request]] = defaultdict(list)
            for request in requests:
                groups[request.settings].append(request)
            for settings, group in groups.items():
                async with self._model_lock:
                    try:
                        generations = await asyncio.to_thread(
                            decode_batch,
                            self.model,
                            [request.prompt_ids for request in group],
                            [request.max_tokens for request in group],
                            settings,
                            eos_token_ids=self.eos_token_ids,
                            pad_token_id=self.pad_token_id,
                            vocab_size=len(self.model_config.tokenizer),
                            generators=[request.generator for request in group],
                        )
                        self.decoded_batches += 1
                    except Exception as error:  # surface to every caller of the batch
                        for request in group:
                            if not request.future.done():
                                request.future.set_exception(error)
                        continue
                for request, generation in zip(group, generations, strict=True):
                    if not request.future.done():
                        request.future.set_result(generation)

    # ---------------------------------------------------------------- weights

    async def update_weights(self, named_tensors: dict[str, torch.Tensor], global_steps: int | None = None) -> int:
        """Load new policy weights (full, unsharded, Hugging Face names) into the server's model.

        Waits for the batch being decoded to finish first. Tied output embeddings may be omitted.

        Args:
            named_tensors: parameter name -> full tensor (any float dtype; cast to the server's dtype).
            global_steps: trainer step of these weights (reported back in ``TokenOutput.extra_fields``).

        Returns:
            Number of tensors loaded.

        Raises:
            KeyError: if a name is not a parameter or buffer of the model.
        """
        async with self._model_lock:
            own = self.model.state_dict(keep_vars=True)  # includes tied names (e.g. lm_head.weight)
            unknown = sorted(set(named_tensors) - set(own))
            if unknown:
                raise KeyError(
                    f"update_weights got {len(unknown)} tensor name(s) the rollout model does not have, e.g. "
                    f"{unknown[:3]}; the trainer and rollout models differ."
                )
            with torch.no_grad():
                for name, tensor in named_tensors.items():
                    own[name].copy_(tensor.to(own[name].dtype))
            self.weight_updates += 1
            if global_steps is not None:
                self.global_steps = global_steps
            return len(named_tensors)

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def get_stats(self) -> dict[str, Any]:
        """Counters for tests and debugging."""
        return {
            "weight_updates": self.weight_updates,
            "global_steps": self.global_steps,
            "decoded_batches": self.decoded_batches,
        }

    # ---------------------------------------------------------------- lifecycle (nothing to free on CPU)

    async def wake_up(self) -> None:
        """No-op: the model stays in host memory."""

    async def sleep(self) -> None:
        """No-op: the model stays in host memory."""

    async def clear_kv_cache(self) -> None:
        """No-op: the KV cache lives only for the duration of one batch."""

    async def wait_for_requests_to_drain(self) -> None:
        """Return once no request is pending or being decoded."""
        while self._pending or (self._batcher is not None and not self._batcher.done()):
            await asyncio.sleep(self.batch_window_s)

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict[str, Any]:
        """Nothing is aborted: requests are short and always run to completion (no partial rollout).

        ``reject_request`` (verl 0.9.1: fail requests arriving while generation is blocked) has nothing to act on:
        generation is never blocked.
        """
        return {"aborted_count": 0, "request_ids": []}

    async def abort_request(self, request_id: str, reset_prefix_cache: bool = True) -> dict[str, Any]:
        return {"aborted": False, "request_id": request_id}

    async def release_kv_cache(self) -> None:
        """No-op (verl 0.9.1, non-naive weight sync): there is no persistent KV cache to release."""

    async def resume_kv_cache(self) -> None:
        """No-op (verl 0.9.1): see :meth:`release_kv_cache`."""

    async def resume_generation(self) -> None:
        """No-op: generation is never paused."""

    async def start_profile(self, **kwargs) -> None:
        """No-op: profiling is not supported by this server."""

    async def stop_profile(self) -> None:
        """No-op: profiling is not supported by this server."""


class HFReplica(RolloutReplica):
    """One ``hf`` rollout replica: a single :class:`HFGenerationServer` actor next to its trainer worker."""

    async def launch_servers(self):
        if self.rollout_mode != RolloutMode.HYBRID:
            raise NotImplementedError(
                f"The hf rollout supports only hybrid mode (rollout inside the trainer workers), not "
                f"{self.rollout_mode}; keep the actor, rollout and ref in one worker group."
            )
        if self.world_size != 1:
            raise ValueError(
                f"The hf rollout runs one process per replica; set actor_rollout_ref.rollout.tensor_model_parallel_"
                f"size=1 (and data/pipeline parallel size 1), got a rollout world size of {self.world_size}."
            )
        node_id = await self.workers[0].__ray_call__.remote(lambda worker: ray.get_runtime_context().get_node_id())
        name = server_actor_name(self.replica_rank, self.is_reward_model)
        server = (
            ray.remote(HFGenerationServer)
            .options(
                name=name,
                num_cpus=0,
                max_concurrency=self.max_concurrency,
                scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                    node_id=node_id, soft=False
                ),
            )
            .remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        )
        await server.ready.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"hf://{name}"

    def rollout_worker_use_gpu(self) -> bool:
        return False


class HFServerAdapter(BaseRollout):
    """Worker-side end of the ``hf`` rollout: forwards weight updates from the trainer engine to the server."""

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        rollout_world_size = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        rank = int(os.environ.get("RANK", "0"))
        self.replica_rank = rank // rollout_world_size if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % rollout_world_size
        self._server = None

    def _server_handle(self):
        if self._server is None:
            self._server = ray.get_actor(server_actor_name(self.replica_rank))
        return self._server

    async def update_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], wire_format: str = "named_tensors", **kwargs
    ) -> None:
        """Gather the full weights and load them into this replica's server.

        Every rank consumes the generator (yielding full tensors is a collective under FSDP); rank 0 of the
        replica sends them.

        Args:
            weights: ``(name, tensor)`` pairs from the engine's ``get_per_tensor_param``.
            wire_format: ``named_tensors`` only (verl 0.9.1 also defines ``delta_flush``, for its delta checkpoint
                engines; verl 0.7.1 never passes it).
            **kwargs: ``global_steps`` is forwarded; ``peft_config`` must be None (LoRA adapters are not supported).
        """
        if wire_format != "named_tensors":
            raise NotImplementedError(
                f"The hf rollout loads full named tensors only, got wire_format={wire_format!r}; use the naive "
                "checkpoint engine (actor_rollout_ref.rollout.checkpoint_engine.backend=naive, the default)."
            )
        if kwargs.get("peft_config") is not None:
            raise NotImplementedError("The hf rollout does not support LoRA adapter sync; set lora.merge=True.")
        named_tensors = {name: tensor.detach().to("cpu").clone() for name, tensor in weights}
        if self.rollout_rank != 0:
            return
        await self._server_handle().update_weights.remote(named_tensors, global_steps=kwargs.get("global_steps"))

    async def resume(self, tags: list[str]):
        """No-op: the server keeps its weights and has no persistent KV cache."""

    async def release(self):
        """No-op: the server keeps its weights and has no persistent KV cache."""
