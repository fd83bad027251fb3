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
"""``treetune_verl.metrics_history``: a resumed run's validation-only record is told from a training step by every
reader, and a line cut by a kill is skipped."""

import json

from treetune_verl.metrics_history import read_metrics, step_times, training_steps


def line(step: int, **data) -> str:
    return json.dumps({"step": step, "data": data}) + "\n"


def test_readers_tell_a_resumes_validation_record_from_a_training_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        line(0, **{"val-core/acc": 0.25})  # the initial validation
        + line(1, **{"training/global_step": 1, "val-core/acc": 0.5, "actor/pg_loss": 1.0})
        + line(1, **{"val-core/acc": 0.75})  # a resume from step 1 validated again
        + line(2, **{"training/global_step": 2, "actor/pg_loss": 2.0})
        + '{"step": 3, "data": {"training/glo'  # cut by a kill
    )
    assert training_steps(path) == [1, 2]
    assert read_metrics(path) == {
        0: {"val-core/acc": 0.25},
        1: {"training/global_step": 1, "val-core/acc": 0.5, "actor/pg_loss": 1.0},
        2: {"training/global_step": 2, "actor/pg_loss": 2.0},
    }


def test_a_step_logged_twice_shows_twice(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(line(1, **{"training/global_step": 1}) * 2)
    assert training_steps(path) == [1, 1]
    assert training_steps(tmp_path / "missing.jsonl") == []


def test_step_times_reads_the_file_logger_format(tmp_path):
    path = tmp_path / "metrics.jsonl"
    records = [
        {"step": 1, "data": {"timing_s/step": 7.5, "training/global_step": 1}},
        {"step": 2, "data": {"timing_s/step": 2.25, "x": 1, "training/global_step": 2}},
    ]
    path.write_text("\n".join(json.dumps(record) for record in records) + "\n")
    assert step_times(path) == [(1, 7.5), (2, 2.25)]
