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
"""The metrics plotter's command line (``python -m treetune_scripts.plot_metrics``): the summary table on stdout, then
the PNG it wrote. The plotter itself is tested in ``treetune_tests/treetune_verl/test_metrics_plot_on_cpu.py``."""

import pytest

from treetune_scripts import plot_metrics as plot_module
from treetune_tests.support.sample_metrics import write_sample_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def jsonl_path(tmp_path):
    return write_sample_metrics(tmp_path / "run.jsonl")


def test_cli(jsonl_path, tmp_path, capsys):
    plot_module.main([str(jsonl_path), str(tmp_path / "cli.png"), "--keys", "actor/pg_loss"])
    out = capsys.readouterr().out
    assert "-0.2500" in out and out.strip().endswith("cli.png")
    assert (tmp_path / "cli.png").read_bytes()[:8] == PNG_MAGIC
