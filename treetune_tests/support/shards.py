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
"""Save and restore a module's process-local parameter shards (FSDP2 ``DTensor`` or plain tensors), so that a test
that updates an engine's weights puts them back for the next test of its module."""

from __future__ import annotations

import torch

from treetune_verl.teacher_worker import local_shard


def local_shards(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of every parameter's local shard, by name."""
    return {name: local_shard(p).detach().clone() for name, p in module.named_parameters()}


@torch.no_grad()
def load_shards(module: torch.nn.Module, shards: dict[str, torch.Tensor]) -> None:
    """Write ``shards`` (from :func:`local_shards`) back into the module's parameters."""
    for name, p in module.named_parameters():
        local_shard(p).copy_(shards[name])
