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
"""``seeded_single_turn_agent``: verl's single-turn agent loop whose requests each carry their own seed.

Everything but the class (the seed, the client wrapper, the checks) is in :mod:`treetune_verl.rollout_seeds`, which
explains why; this module imports verl's agent loop, so only the plugin (:mod:`treetune_verl.plugin`) imports it,
once verl's agent loop is imported anyway.
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from treetune_verl.rollout_seeds import SEEDED_AGENT_LOOP, SeedingServerClient, seeding_problem


@register(SEEDED_AGENT_LOOP)
class SeededSingleTurnAgentLoop(SingleTurnAgentLoop):
    """verl's single-turn agent loop; each request carries a seed of its own (:mod:`treetune_verl.rollout_seeds`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        problem = seeding_problem(self.rollout_config.name)
        if problem:
            raise ValueError(problem)
        self.server_manager = SeedingServerClient(self.server_manager, int(self.rollout_config.seed))
