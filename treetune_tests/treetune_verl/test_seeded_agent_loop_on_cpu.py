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
"""treetune_verl.seeded_agent_loop: each request (vLLM or verl-cpu's hf) carries its own seed, registered through
verl's plugin hook."""

import asyncio
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from treetune_verl.rollout_seeds import (
    SEEDED_AGENT_LOOP,
    SeedingServerClient,
    configured_seeding_problem,
    sample_seed,
)
from treetune_verl.version import verl_is


class _RecordingClient:
    """Stands in for verl's LLMServerClient: records what each ``generate`` call was sent."""

    def __init__(self):
        self.calls: list[dict] = []
        self.config = "the client's own attribute"

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.calls.append({"request_id": request_id, "prompt_ids": prompt_ids, **kwargs, **sampling_params})
        return len(self.calls)


def _send(rollout_seed: int, requests: list[tuple[int, list[int]]], sampling_params: dict) -> list[dict]:
    """Send ``(priority, prompt_ids)`` requests through a seeding client; return what the inner client received."""
    recorder = _RecordingClient()
    seeding = SeedingServerClient(recorder, rollout_seed)

    async def send_all():
        for priority, prompt_ids in requests:
            await seeding.generate("id", prompt_ids=prompt_ids, sampling_params=sampling_params, priority=priority)

    asyncio.run(send_all())
    return recorder.calls


def test_the_n_samples_of_a_prompt_get_n_seeds_that_a_rerun_repeats():
    prompt = [5, 9, 2]
    group = [(row, prompt) for row in range(4)]  # one prompt, n = 4: rows 0-3 of the batch
    first = [call["seed"] for call in _send(7, group, {"temperature": 1.0})]
    assert len(set(first)) == 4, first
    # A rerun sends the same requests in another order: each keeps its seed.
    rerun = {call["priority"]: call["seed"] for call in _send(7, group[::-1], {"temperature": 1.0})}
    assert [rerun[row] for row in range(4)] == first
    # Control: another rollout seed, or another prompt on the same rows, draws other seeds.
    assert not set(first) & {call["seed"] for call in _send(8, group, {"temperature": 1.0})}
    assert not set(first) & {call["seed"] for call in _send(7, [(row, [5, 9, 3]) for row in range(4)], {})}


def test_the_seed_is_a_63_bit_int_that_does_not_depend_on_the_process():
    script = "from treetune_verl.rollout_seeds import sample_seed; print(sample_seed(3, 11, [1, 2, 3]))"
    other_process = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    seed = sample_seed(3, 11, [1, 2, 3])
    assert int(other_process.stdout) == seed  # Python's hash() is salted per process; this must not be
    assert 0 <= seed < 2**63


def test_a_seed_the_caller_set_is_kept_and_the_callers_params_are_not_changed():
    params = {"temperature": 1.0, "seed": 123}
    calls = _send(7, [(0, [1]), (1, [1])], params)
    assert [call["seed"] for call in calls] == [123, 123]
    unseeded = {"temperature": 1.0}
    _send(7, [(0, [1])], unseeded)
    assert unseeded == {"temperature": 1.0}
    # Every other attribute is the wrapped client's.
    assert SeedingServerClient(_RecordingClient(), 0).config == "the client's own attribute"


def _run_config(engine: str, agent_loop: str = SEEDED_AGENT_LOOP):
    rollout = {"name": engine, "agent": {"default_agent_loop": agent_loop}}
    return OmegaConf.create({"actor_rollout_ref": {"rollout": rollout}})


def test_the_preflight_refuses_the_seeded_loop_where_it_cannot_seed():
    assert configured_seeding_problem(_run_config("hf", agent_loop="single_turn_agent")) is None
    if verl_is("0.7.1"):
        # The release is checked first: no engine can be seeded there.
        assert "needs verl 0.9.1" in configured_seeding_problem(_run_config("hf"))
        assert "needs verl 0.9.1" in configured_seeding_problem(_run_config("vllm"))
    else:
        assert "for the rollout engines ['vllm', 'hf'], not 'sglang'" in configured_seeding_problem(
            _run_config("sglang")
        )
        assert configured_seeding_problem(_run_config("vllm")) is None
        assert configured_seeding_problem(_run_config("hf")) is None


@pytest.mark.parametrize("plugins", ["auto", "none"])
def test_verl_registers_the_seeded_loop_through_the_entry_point(plugins):
    # verl 0.9.1 imports every "verl.plugins" entry point with itself, unless VERL_USE_EXTERNAL_PLUGINS=none (the
    # control); verl 0.7.1 has no plugin loading.
    script = (
        "import verl.experimental.agent_loop.agent_loop as m, sys; "
        f"print({SEEDED_AGENT_LOOP!r} in m._agent_loop_registry, 'treetune_verl.seeded_agent_loop' in sys.modules)"
    )
    env_script = f"import os; os.environ['VERL_USE_EXTERNAL_PLUGINS'] = {plugins!r}; {script}"
    output = subprocess.run([sys.executable, "-c", env_script], capture_output=True, text=True, check=True).stdout
    registered = plugins == "auto" and not verl_is("0.7.1")
    assert output.split() == [str(registered), str(registered)], output
