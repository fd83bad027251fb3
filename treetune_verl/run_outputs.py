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
"""Readers of what a training run leaves behind, for comparing two runs of the same command (a straight one and one
killed and resumed): the model shards of a checkpoint folder and verl's rollout dump (``trainer.rollout_data_dir``).
Used by the kill sweep (``treetune_scripts/kill_sweep.py``) and the interrupted-runs e2e test.
"""

from __future__ import annotations

import json
from pathlib import Path


def shard_tensors(folder: str | Path) -> dict[str, object]:
    """Every tensor of the ``model*.pt`` shard files in ``folder`` (a checkpoint's actor or teacher folder), each the
    rank's local tensor, keyed ``<file>:<name>``."""
    import torch

    tensors = {}
    for path in sorted(Path(folder).glob("model*.pt")):
        for name, value in torch.load(path, map_location="cpu", weights_only=False).items():
            tensors[f"{path.name}:{name}"] = value.to_local() if hasattr(value, "to_local") else value
    return tensors


def max_difference(left: dict, right: dict) -> float:
    """Max absolute difference between two sets of named tensors (inf when either is empty or their names differ)."""
    if not left or left.keys() != right.keys():
        return float("inf")
    return max(float((left[k].float() - right[k].float()).abs().max()) for k in left)


def rollout_rows(dump_dir: str | Path, step: int) -> list[tuple[str, str]]:
    """(prompt, response) text of each row of a step's rollout batch, in the trainer's row order, from verl's rollout
    dump ``<dump_dir>/<step>.jsonl`` ([] without one)."""
    path = Path(dump_dir) / f"{step}.jsonl"
    if not path.exists():
        return []
    return [(row["input"], row["output"]) for row in map(json.loads, path.read_text().splitlines())]
