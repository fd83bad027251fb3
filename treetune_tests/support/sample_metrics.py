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
"""A small metrics file in verl's ``file`` logger format, for the tests of its plotter and of the plotter's command
line: three steps, numbers and non-numbers, a key logged only at some steps, and a trailing blank line."""

import json
from pathlib import Path

SAMPLE_RECORDS = [
    {"step": 1, "data": {"critic/score/mean": -0.9, "timing_s/step": 2.5, "actor/pg_loss": 0.1,
                         "cpo/weight/mean": 1.0, "actor/cpo/clip_frac": 0.0, "note": "text", "flag": True,
                         "training/global_step": 1}},
    {"step": 2, "data": {"critic/score/mean": -0.7, "timing_s/step": 2.0, "actor/pg_loss": 0.05,
                         "cpo/weight/mean": 0.9, "actor/cpo/clip_frac": 0.1, "training/global_step": 2}},
    {"step": 3, "data": {"critic/score/mean": -0.25, "actor/pg_loss": 0.02, "val-core/acc": 0.5,
                         "training/global_step": 3}},
]  # fmt: skip


def write_sample_metrics(path: Path) -> Path:
    """Write :data:`SAMPLE_RECORDS` to ``path`` (one JSON record per line) and return it."""
    path.write_text("\n".join(json.dumps(record) for record in SAMPLE_RECORDS) + "\n\n")
    return path
