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
"""Tests of the metrics plotter (``treetune_verl/metrics_plot.py``) on a hand-written file-logger jsonl; its command
line is tested in ``treetune_tests/treetune_scripts/test_plot_metrics_on_cpu.py``."""

import json

import pytest

from treetune_tests.support.sample_metrics import write_sample_metrics
from treetune_verl import metrics_plot as plot_module
from treetune_verl.metrics_plot import plot_metrics, read_metrics, select_keys, summarize_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def jsonl_path(tmp_path):
    return write_sample_metrics(tmp_path / "run.jsonl")


def test_read_metrics(jsonl_path):
    series = read_metrics(jsonl_path)
    assert series["critic/score/mean"] == [(1, -0.9), (2, -0.7), (3, -0.25)]
    assert series["timing_s/step"] == [(1, 2.5), (2, 2.0)]
    assert "note" not in series and "flag" not in series


def test_default_keys_add_cpo_metrics_and_note_missing(jsonl_path):
    plotted, missing = select_keys(list(read_metrics(jsonl_path)), None)
    assert plotted == ["critic/score/mean", "actor/pg_loss", "timing_s/step", "actor/cpo/clip_frac", "cpo/weight/mean"]
    assert missing == ["critic/rewards/mean", "actor/grad_norm", "response_length/mean"]


def test_plot_writes_png(jsonl_path, tmp_path, capsys):
    png = plot_metrics(jsonl_path, tmp_path / "plots" / "run.png")
    assert png == tmp_path / "plots" / "run.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert "'actor/grad_norm' not in" in capsys.readouterr().err


def test_keys_selection_changes_the_figure(jsonl_path, tmp_path, monkeypatch):
    drawn = []
    original = plot_module.select_keys

    def spy(available, keys):
        plotted, missing = original(available, keys)
        drawn.append(plotted)
        return plotted, missing

    monkeypatch.setattr(plot_module, "select_keys", spy)
    one = plot_metrics(jsonl_path, tmp_path / "one.png", keys=["val-core/acc", "no/such/key"])
    assert drawn == [["val-core/acc"]]
    assert one.read_bytes()[:8] == PNG_MAGIC
    # One subplot gives a narrower image than the default grid of three columns.
    many = plot_metrics(jsonl_path, tmp_path / "many.png")
    assert _png_width(one) < _png_width(many)


def _png_width(path):
    return int.from_bytes(path.read_bytes()[16:20], "big")  # IHDR width field


def test_no_requested_key_present_is_an_error(jsonl_path, tmp_path):
    with pytest.raises(ValueError, match="none of the requested metrics"):
        plot_metrics(jsonl_path, tmp_path / "x.png", keys=["missing/key"])


def test_a_line_cut_by_a_kill_and_a_resumes_validation_record_are_not_plotted(jsonl_path):
    text = jsonl_path.read_text().strip() + "\n"
    resumed = json.dumps({"step": 2, "data": {"val-core/acc": 0.9}})  # a resume from step 2 validated again
    jsonl_path.write_text(text + resumed + "\n" + '{"step": 4, "data": {"critic/sc')
    series = read_metrics(jsonl_path)
    assert series["val-core/acc"] == [(3, 0.5)] and series["critic/score/mean"][-1] == (3, -0.25)


def test_a_file_without_records_is_reported(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl: no metrics record"):
        read_metrics(path)


def test_summary_table(jsonl_path):
    lines = summarize_metrics(jsonl_path).splitlines()
    assert lines[0].split() == ["step", "score", "mean", "step", "time", "(s)"]
    assert [line.split() for line in lines[1:]] == [
        ["1", "-0.9000", "2.5000"],
        ["2", "-0.7000", "2.0000"],
        ["3", "-0.2500", "-"],
    ]


def test_reads_what_verl_file_logger_writes(tmp_path, monkeypatch):
    import numpy as np
    from verl.utils.tracking import FileLogger

    path = tmp_path / "verl.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    logger = FileLogger(project_name="p", experiment_name="e")
    logger.log({"critic/score/mean": np.float32(-0.5), "timing_s/step": 1.25, "training/global_step": 1}, step=1)
    logger.log({"critic/score/mean": np.float64(0.5), "training/global_step": np.int64(2)}, step=2)
    logger.finish()
    assert read_metrics(path)["critic/score/mean"] == [(1, -0.5), (2, 0.5)]
