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
"""Rollout draws that depend on the request, not on batching or timing: verl's vLLM rollout and verl-cpu's ``hf``
rollout, verl 0.9.1.

This module holds the seed, the client wrapper that adds it and the checks; it imports nothing of verl's agent loop,
so the recipe's preflight can ask it before Ray starts. The agent loop itself is
:class:`treetune_verl.seeded_agent_loop.SeededSingleTurnAgentLoop`.

verl's vLLM server samples a request from vLLM's shared random stream unless the request brings a seed of its own, so
the tokens a request draws depend on which requests vLLM schedules beside it and in what order they arrived, and two
runs with every seed equal need not sample the same responses. verl's ``rollout.full_determinism=true`` does give each
request a seed, but the same one (``rollout.seed`` + the replica's rank) to all of them: the n requests of a prompt
then draw the same random numbers, so its n responses come out alike, which leaves a group estimator nothing to
compare.

``SeededSingleTurnAgentLoop`` is verl's single-turn agent loop, registered as ``seeded_single_turn_agent``, whose
requests each carry their own seed, :func:`sample_seed`: a hash of ``actor_rollout_ref.rollout.seed``, the sample's
row in the rollout batch (verl 0.9.1's per-sample ``priority``) and its prompt ids. Same config and data order, same
seeds: every method of a comparison samples its step-1 responses from the same random numbers, and a request's draws
no longer depend on its neighbours. A vLLM request with a seed samples from its own generator; its logits can still
differ in the last bits with the batch it is computed in, which can flip a rare token.

The training step is not part of the key (the agent loop does not see it): on vLLM a prompt that lands on the same row
at two steps reuses its random numbers, with the newer weights (the ``hf`` server adds the step to its own key).

Use it on verl 0.9.1: ``actor_rollout_ref.rollout.agent.default_agent_loop=seeded_single_turn_agent``
(:func:`treetune_verl.tiny_run.tiny_run_overrides` sets it for the project's CPU runs). The package's ``verl.plugins``
entry point (:mod:`treetune_verl.plugin`) imports this module wherever verl's agent loop is imported, so the name is
known in every agent-loop worker; the recipe's preflight refuses it elsewhere (:func:`configured_seeding_problem`).
verl-cpu's ``hf`` server seeds each request itself (``verl_cpu.hf_server.request_seed``) from the prompt, the step
and, since verl's client forwards the row to vLLM servers only, the occurrence of the prompt: which of a prompt's n
samples gets which draw then follows the order they arrive in, which varies from run to run. With this loop the
request's seed takes the occurrence's place, so each row keeps its draw (a method that reads a row's siblings, such
as SDPO's, sees the same ones in a rerun or a resume).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from treetune_verl.version import verl_is

#: Name of :class:`SeededSingleTurnAgentLoop` in verl's agent-loop registry.
SEEDED_AGENT_LOOP = "seeded_single_turn_agent"
#: Rollout engines whose servers take a per-request ``seed`` sampling parameter.
SEEDED_ENGINES = ("vllm", "hf")


def sample_seed(rollout_seed: int, priority: int, prompt_ids: list[int]) -> int:
    """Seed of one request: the first 63 bits of BLAKE2b over ``[rollout_seed, priority, prompt_ids]`` as JSON.

    Stable across processes and machines (unlike Python's salted ``hash``). ``priority`` is the sample's row in the
    rollout batch, so the n samples of one prompt get n seeds.
    """
    key = [int(rollout_seed), int(priority), [int(token) for token in prompt_ids]]
    digest = hashlib.blake2b(json.dumps(key, separators=(",", ":")).encode(), digest_size=8, person=b"treetune.seed")
    return int.from_bytes(digest.digest(), "little") & (2**63 - 1)


def seeding_problem(engine: str) -> str | None:
    """Why this agent loop cannot seed the requests of rollout engine ``engine`` here, or None if it can."""
    if verl_is("0.7.1"):
        # SYNC WARNING: verl/experimental/agent_loop/single_turn_agent_loop.py:SingleTurnAgentLoop.run (0.7.1 passes
        # no per-sample priority, so the n samples of a prompt would share one seed)
        return f"The {SEEDED_AGENT_LOOP} agent loop needs verl 0.9.1 (its per-sample priority); use single_turn_agent."
    if engine not in SEEDED_ENGINES:
        return (
            f"The {SEEDED_AGENT_LOOP} agent loop seeds requests for the rollout engines {list(SEEDED_ENGINES)}, not "
            f"{engine!r}; use verl's single_turn_agent."
        )
    return None


def configured_seeding_problem(config) -> str | None:
    """What is wrong with a run config that selects this agent loop where it cannot seed, or None (for the
    preflight: inside a worker the loop would stop the run only after Ray started)."""
    rollout = config.actor_rollout_ref.rollout
    agent = rollout.get("agent") or {}
    if agent.get("default_agent_loop") != SEEDED_AGENT_LOOP:
        return None
    problem = seeding_problem(rollout.get("name"))
    return f"actor_rollout_ref.rollout.agent.default_agent_loop={SEEDED_AGENT_LOOP}: {problem}" if problem else None


class SeedingServerClient:
    """Forwards every call to the agent loop's server client; ``generate`` adds the request's seed, unless the
    sampling parameters already hold one."""

    def __init__(self, client: Any, rollout_seed: int) -> None:
        self._client = client
        self._rollout_seed = rollout_seed

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, **kwargs: Any) -> Any:
        seeded = dict(sampling_params)
        seeded.setdefault("seed", sample_seed(self._rollout_seed, kwargs.get("priority", 0), prompt_ids))
        return await self._client.generate(request_id, prompt_ids=prompt_ids, sampling_params=seeded, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)
