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
"""The hf rollout server's token-in/token-out contract, weight updates and lifecycle calls (in-process, no Ray)."""

import asyncio
import inspect
import os
import random
import re
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM
from verl.workers.config import RolloutConfig
from verl.workers.rollout.replica import RolloutReplica, TokenOutput
from verl_cpu.hf_generation import SamplingSettings, decode_batch
from verl_cpu.hf_server import SAMPLING_SEED, HFGenerationServer, HFServerAdapter, request_seed

from treetune_verl.tiny_assets import CONTEXT_SENSITIVE, build_tiny_assets

PROMPT_LENGTH, RESPONSE_LENGTH = 64, 12
GREEDY = {"temperature": 0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
SAMPLED = {**GREEDY, "temperature": 1.0}


@pytest.fixture(scope="module")
def model_dir():
    """A model whose next tokens depend on the context, so a rollout that drops or misplaces context is caught."""
    return build_tiny_assets(config=CONTEXT_SENSITIVE) / "model"


@pytest.fixture
def make_server(model_dir):
    """``make_server(seed=None)``: a new server (``engine_kwargs.hf.seed=seed`` if given) on the tiny model."""

    def make(seed: int | None = None) -> HFGenerationServer:
        config = RolloutConfig(
            name="hf",
            prompt_length=PROMPT_LENGTH,
            response_length=RESPONSE_LENGTH,
            tensor_model_parallel_size=1,
            engine_kwargs={} if seed is None else {"hf": {"seed": seed}},
        )
        model_config = OmegaConf.create({"path": str(model_dir), "override_config": {"attn_implementation": "sdpa"}})
        return HFGenerationServer(config=config, model_config=model_config)

    return make


@pytest.fixture
def server(make_server):
    return make_server()


def prompts_for(server, count):
    tokenizer = server.model_config.tokenizer
    questions = ["What is 2 + 3?", "Tom has 7 pens and buys 5 more. How many pens?", "9 - 4 = ?", "1"]
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for q in questions[:count]
    ]


def tokenizer_ids(server) -> int:
    """The server samples among the tokenizer's ids only (the model's output layer has padding rows beyond them)."""
    return len(server.model_config.tokenizer)


async def generate_all(server, prompts, params):
    return await asyncio.gather(
        *[server.generate(prompt_ids=p, sampling_params=dict(params), request_id=str(i)) for i, p in enumerate(prompts)]
    )


def test_concurrent_greedy_requests_are_batched_and_match_one_by_one_decoding(server, model_dir, naive_greedy):
    prompts = prompts_for(server, 4)
    outputs = asyncio.run(generate_all(server, prompts, GREEDY))
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for prompt, output in zip(prompts, outputs):
        assert isinstance(output, TokenOutput)
        expected_tokens, expected_log_probs = naive_greedy(
            reference, prompt, RESPONSE_LENGTH, server.eos_token_ids, tokenizer_ids(server)
        )
        assert output.token_ids == expected_tokens
        torch.testing.assert_close(torch.tensor(output.log_probs), torch.tensor(expected_log_probs))
        assert output.stop_reason == "completed"
        # Control: the same decoding with one prompt token dropped gives another continuation or other log-probs.
        dropped = prompt[: len(prompt) // 2] + prompt[len(prompt) // 2 + 1 :]
        control_tokens, control_log_probs = naive_greedy(
            reference, dropped, RESPONSE_LENGTH, server.eos_token_ids, tokenizer_ids(server)
        )
        if control_tokens == output.token_ids:
            with pytest.raises(AssertionError):
                torch.testing.assert_close(torch.tensor(output.log_probs), torch.tensor(control_log_probs))
    stats = asyncio.run(server.get_stats())
    assert stats["decoded_batches"] < len(prompts)  # concurrent requests shared a decoding batch


async def _sample_requests(server, requests, *, concurrently: bool) -> dict[tuple[int, tuple[int, ...]], list[int]]:
    """Send ``(priority, prompt)`` requests (sampled at temperature 1) in the given order, all at once or one by one."""

    def call(index, priority, prompt):
        return server.generate(
            prompt_ids=prompt, sampling_params=dict(SAMPLED), request_id=str(index), priority=priority
        )

    calls = [call(index, priority, prompt) for index, (priority, prompt) in enumerate(requests)]
    outputs = await asyncio.gather(*calls) if concurrently else [await request for request in calls]
    return {(priority, tuple(prompt)): output.token_ids for (priority, prompt), output in zip(requests, outputs)}


def test_sampled_tokens_depend_on_the_request_not_on_arrival_order_or_batch(make_server):
    prompts = prompts_for(make_server(), 3)
    # each prompt twice, under two priorities (verl 0.9.1's agent loop: one priority per sample, unique in a batch)
    requests = [(priority, prompts[priority % 3]) for priority in range(6)]
    shuffled = random.Random(0).sample(requests, len(requests))
    batched_server, sequential_server = make_server(), make_server()
    batched = asyncio.run(_sample_requests(batched_server, shuffled, concurrently=True))
    sequential = asyncio.run(_sample_requests(sequential_server, requests[::-1], concurrently=False))
    assert asyncio.run(batched_server.get_stats())["decoded_batches"] < len(requests)  # they shared a batch
    assert asyncio.run(sequential_server.get_stats())["decoded_batches"] == len(requests)  # one at a time
    assert batched == sequential
    assert all(len(tokens) > 0 for tokens in batched.values())
    # the same prompt under another priority is another sample
    for priority in range(3):
        prompt = tuple(prompts[priority])
        assert batched[(priority, prompt)] != batched[(priority + 3, prompt)]
    # Control: a server with another seed samples other tokens for every request.
    other_seed = asyncio.run(_sample_requests(make_server(seed=7), shuffled, concurrently=True))
    assert all(other_seed[key] != tokens for key, tokens in batched.items())


def test_samples_of_one_prompt_without_priorities_are_distinct_and_reproducible(make_server):
    """verl 0.7.1 (and 0.9.1's client for a non-vLLM server) sends no priority: the occurrence tells the n apart."""
    (prompt,) = prompts_for(make_server(), 1)
    requests = [(0, prompt)] * 4

    async def sample(server, concurrently):
        calls = [
            server.generate(prompt_ids=prompt, sampling_params=dict(SAMPLED), request_id=str(index))
            for index in range(len(requests))
        ]
        outputs = await asyncio.gather(*calls) if concurrently else [await request for request in calls]
        return [output.token_ids for output in outputs]

    batched = asyncio.run(sample(make_server(), concurrently=True))
    sequential = asyncio.run(sample(make_server(), concurrently=False))
    assert len({tuple(tokens) for tokens in batched}) == len(requests)  # n distinct draws
    assert batched == sequential  # here they arrive in the same order, so each gets the same draw


def test_a_request_seed_picks_its_draw_whatever_the_arrival_order_of_the_samples_of_its_prompt(make_server):
    """vLLM's per-request ``seed`` (treetune's seeded agent loop sends one per row): without a priority, the n samples
    of a prompt get their draws by arrival order, so a row's response follows the order they arrive in; with a seed
    each, a row keeps its response."""
    (prompt,) = prompts_for(make_server(), 1)
    seeds = [11, 12, 13, 14]

    async def sample(server, order, seeded):
        calls = [
            server.generate(
                prompt_ids=prompt,
                sampling_params={**SAMPLED, **({"seed": seeds[row]} if seeded else {})},
                request_id=str(row),
            )
            for row in order
        ]
        return dict(zip(order, [output.token_ids for output in await asyncio.gather(*calls)], strict=True))

    forward = asyncio.run(sample(make_server(), [0, 1, 2, 3], seeded=True))
    backward = asyncio.run(sample(make_server(), [3, 2, 1, 0], seeded=True))
    assert len({tuple(tokens) for tokens in forward.values()}) == len(seeds)  # n distinct draws
    assert backward == forward
    # Control: without seeds, reversing the arrival order reverses which row gets which draw.
    unseeded_forward = asyncio.run(sample(make_server(), [0, 1, 2, 3], seeded=False))
    unseeded_backward = asyncio.run(sample(make_server(), [3, 2, 1, 0], seeded=False))
    assert unseeded_backward != unseeded_forward
    assert sorted(map(tuple, unseeded_backward.values())) == sorted(map(tuple, unseeded_forward.values()))


def test_a_request_samples_with_the_seed_of_its_key_and_the_counts_restart_with_each_weight_version(server):
    (prompt,) = prompts_for(server, 1)

    async def sample(priority=0):
        output = await server.generate(
            prompt_ids=prompt, sampling_params=dict(SAMPLED), request_id="x", priority=priority
        )
        return output.token_ids

    def expected(global_steps, priority, occurrence):
        seed = request_seed(SAMPLING_SEED, 0, global_steps, priority, prompt, occurrence)
        (generation,) = decode_batch(
            server.model,
            [prompt],
            [RESPONSE_LENGTH],
            SamplingSettings(temperature=1.0),
            eos_token_ids=server.eos_token_ids,
            pad_token_id=server.pad_token_id,
            vocab_size=tokenizer_ids(server),
            generators=[torch.Generator().manual_seed(seed)],
        )
        return generation.token_ids

    assert asyncio.run(sample()) == expected(None, 0, 0)
    assert asyncio.run(sample()) == expected(None, 0, 1)  # the same request again: its second occurrence
    assert asyncio.run(sample(priority=9)) == expected(None, 9, 0)
    asyncio.run(server.set_global_steps(3))
    at_step_3 = asyncio.run(sample())
    assert at_step_3 == expected(3, 0, 0)
    assert asyncio.run(sample()) == expected(3, 0, 1)
    asyncio.run(server.set_global_steps(4))
    assert asyncio.run(sample()) == expected(4, 0, 0)
    asyncio.run(server.set_global_steps(3))
    assert asyncio.run(sample()) == at_step_3  # the counts restarted when the step changed
    # Control: the keys above are distinct draws.
    assert len({tuple(expected(*key)) for key in [(None, 0, 0), (None, 0, 1), (None, 9, 0), (3, 0, 0)]}) == 4


def test_request_seed_is_a_stable_63_bit_hash_of_every_part_of_the_key():
    base = request_seed(1234, 0, None, 0, [1, 2, 3], 0)
    assert base == request_seed(1234, 0, -1, 0, [1, 2, 3], 0)  # global_steps None is -1
    # The same in another process with another hash salt (Python's hash() would differ).
    code = "from verl_cpu.hf_server import request_seed; print(request_seed(1234, 0, None, 0, [1, 2, 3], 0))"
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    other_process = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert int(other_process.stdout.split()[-1]) == base
    variants = [
        request_seed(1235, 0, None, 0, [1, 2, 3], 0),
        request_seed(1234, 1, None, 0, [1, 2, 3], 0),
        request_seed(1234, 0, 0, 0, [1, 2, 3], 0),
        request_seed(1234, 0, None, 1, [1, 2, 3], 0),
        request_seed(1234, 0, None, 0, [1, 2, 4], 0),
        request_seed(1234, 0, None, 0, [1, 2, 3, 0], 0),
        request_seed(1234, 0, None, 0, [1, 2, 3], 1),
    ]
    assert len({base, *variants}) == len(variants) + 1
    assert all(0 <= seed < 2**63 for seed in [base, *variants])


def test_log_probs_only_when_asked_and_max_tokens_rule(server):
    (prompt,) = prompts_for(server, 1)
    params = {**GREEDY, "logprobs": False}
    (default_length,) = asyncio.run(generate_all(server, [prompt], params))
    assert default_length.log_probs is None
    assert len(default_length.token_ids) <= RESPONSE_LENGTH
    (short,) = asyncio.run(generate_all(server, [prompt], {**params, "max_tokens": 3}))
    assert short.token_ids == default_length.token_ids[:3]


def test_eos_is_kept_as_last_token_when_generation_stops_early(server, model_dir, naive_greedy):
    (prompt,) = prompts_for(server, 1)
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    free_run, _ = naive_greedy(reference, prompt, RESPONSE_LENGTH, eos=(), vocab_size=tokenizer_ids(server))
    server.eos_token_ids = [free_run[1]]  # make the second greedy token an end-of-sequence token
    (output,) = asyncio.run(generate_all(server, [prompt], GREEDY))
    assert output.token_ids == free_run[: free_run.index(free_run[1]) + 1]
    assert output.token_ids[-1] == free_run[1]


def test_update_weights_changes_generation_to_that_of_the_new_weights(server, model_dir, naive_greedy):
    prompts = prompts_for(server, 2)
    trained = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    torch.manual_seed(3)
    with torch.no_grad():
        for parameter in trained.parameters():
            parameter.add_(0.5 * torch.randn_like(parameter))
    # bf16 like the FSDP engine sends; tied lm_head.weight included like a state_dict
    named = {name: tensor.to(torch.bfloat16) for name, tensor in trained.state_dict().items()}
    trained.load_state_dict({name: tensor.float() for name, tensor in named.items()})
    before = asyncio.run(generate_all(server, prompts, GREEDY))
    loaded = asyncio.run(server.update_weights(named, global_steps=7))
    after = asyncio.run(generate_all(server, prompts, GREEDY))
    assert loaded == len(named)
    for prompt, new in zip(prompts, after):
        expected, _ = naive_greedy(trained, prompt, RESPONSE_LENGTH, server.eos_token_ids, tokenizer_ids(server))
        assert new.token_ids == expected
        assert new.extra_fields["global_steps"] == 7
    assert [o.token_ids for o in before] != [n.token_ids for n in after]


def test_update_weights_rejects_names_the_model_does_not_have(server):
    with pytest.raises(KeyError, match="does not have"):
        asyncio.run(server.update_weights({"model.not_a_layer.weight": torch.zeros(2)}))


def test_server_implements_every_lifecycle_call_of_the_replica_and_manager(server):
    # every call the installed verl's RolloutReplica makes on its server handles, read from its source
    replica_source = inspect.getsource(RolloutReplica)
    called_by_replica = set(re.findall(r"server\.(\w+)\.remote\(", replica_source))
    assert {"wake_up", "sleep", "abort_all_requests", "resume_generation", "clear_kv_cache"} <= called_by_replica
    # and what vLLMReplica / CheckpointEngineManager / the agent loop call on them
    called_elsewhere = {"wait_for_requests_to_drain", "abort_request", "set_global_steps"}
    for name in sorted(called_by_replica | called_elsewhere):
        assert inspect.iscoroutinefunction(getattr(server, name, None)), name
    forwards_reject = "abort_all_requests.remote(reject_request=" in replica_source  # verl 0.9.1

    async def exercise():
        await server.sleep()
        await server.wake_up()
        await server.clear_kv_cache()
        await server.wait_for_requests_to_drain()
        await server.resume_generation()
        aborted = await (
            server.abort_all_requests(reject_request=True) if forwards_reject else server.abort_all_requests()
        )
        return aborted, await server.abort_request("x")

    aborted, single = asyncio.run(exercise())
    assert aborted == {"aborted_count": 0, "request_ids": []}
    assert single["aborted"] is False


def test_adapter_refuses_a_weight_format_it_cannot_load():
    adapter = object.__new__(HFServerAdapter)  # the check comes before any use of the adapter's state

    async def sync():
        await adapter.update_weights(iter([]), wire_format="delta_flush")

    with pytest.raises(NotImplementedError, match="wire_format='delta_flush'"):
        asyncio.run(sync())


def test_multimodal_input_is_refused_with_a_clear_error(server):
    with pytest.raises(NotImplementedError, match="text-only"):
        asyncio.run(server.generate(prompt_ids=[1, 2], sampling_params={}, request_id="x", image_data=[object()]))


def test_sampling_seed_comes_from_the_hf_engine_kwargs():
    from types import SimpleNamespace

    from verl_cpu.hf_server import SAMPLING_SEED, sampling_seed

    assert sampling_seed(SimpleNamespace(engine_kwargs={})) == SAMPLING_SEED
    assert sampling_seed(SimpleNamespace(engine_kwargs={"hf": {"seed": 7}})) == 7
    assert sampling_seed(SimpleNamespace(engine_kwargs={"hf": {"seed": None}, "vllm": {}})) == SAMPLING_SEED
