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
"""The summary's command line (``python -m treetune_scripts.experiments.summary``): several experiment folders of one
warm start summarised as one, and the folders it refuses to combine."""

import csv
import json

import pytest

from treetune_recipe.cpo.experiments import summary
from treetune_recipe.cpo.experiments.cpo_vs_grpo import RESULT_COLUMNS
from treetune_scripts.experiments import summary as summary_script


def _write_csv(path, rows):
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=RESULT_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({column: row.get(column, "") for column in RESULT_COLUMNS})


def _experiment_folder(path, warm_start, rows):
    path.mkdir(parents=True)
    (path / "experiment.json").write_text(json.dumps({"warm_start": warm_start}))
    _write_csv(path / "results.csv", rows)
    return path


def test_summary_of_two_folders_pairs_a_method_added_later_with_the_first_folders_grpo(tmp_path):
    def run(method, seed, final):
        return [
            {"method": method, "seed": seed, "step": 0, "val_acc": 0.2},
            {"method": method, "seed": seed, "step": 2, "val_acc": final, "step_time_s": 1.0},
        ]

    grpo = run("grpo", 0, 0.3) + run("grpo", 1, 0.1)
    first = _experiment_folder(tmp_path / "a", "w1", grpo + run("cpo:rlsd", 0, 0.9))
    added = _experiment_folder(tmp_path / "b", "w1", run("cpo:opsd_token", 0, 0.5) + run("cpo:opsd_token", 1, 0.2))
    out = tmp_path / "both"
    summary_script.main([str(first), str(added), "--output-dir", str(out), "--methods", "grpo,cpo:opsd_token"])
    stats = summary.summarize(summary.read_results(out / "results.csv"))
    assert sorted(stats["methods"]) == ["cpo:opsd_token", "grpo"]  # cpo:rlsd left out
    # Paired with grpo of the same seed: +0.2 and +0.1.
    assert stats["methods"]["cpo:opsd_token"]["final_vs_grpo"][0] == pytest.approx(0.15)
    assert (out / "summary.md").is_file() and (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
    # Controls: another warm start, or the same run in both folders, is refused.
    other = _experiment_folder(tmp_path / "c", "w2", run("cpo:opsd_token", 2, 0.5))
    with pytest.raises(ValueError, match="different warm starts"):
        summary.combine_results([first, other], tmp_path / "x.csv")
    with pytest.raises(ValueError, match="in an earlier folder too"):
        summary.combine_results([first, _experiment_folder(tmp_path / "d", "w1", run("grpo", 1, 0.1))], tmp_path / "x")
