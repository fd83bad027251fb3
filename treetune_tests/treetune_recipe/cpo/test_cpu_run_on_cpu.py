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
"""``launch_cpo_on_cpu``: the recipe's entry point and config, the CPU tiny-run overrides first, the caller's last."""

from pathlib import Path

from treetune_recipe.cpo import cpu_run
from treetune_verl.tiny_run import tiny_run_overrides


def test_launch_passes_the_recipe_entry_and_config_and_puts_caller_overrides_last(monkeypatch, tmp_path):
    calls = []

    def record(overrides, log_path, **kwargs):
        calls.append((overrides, log_path, kwargs))
        return "run"

    monkeypatch.setattr(cpu_run, "launch_training", record)
    echo = print
    run = cpu_run.launch_cpo_on_cpu(
        ["trainer.total_training_steps=7", "x=1"],
        tmp_path / "train.log",
        assets_dir=tmp_path / "assets",
        run_dir=tmp_path / "run",
        total_training_steps=3,
        experiment_name="unit",
        timeout_s=60,
        env={"TREETUNE_EXAMPLE": "1"},
        echo=echo,
        cwd=tmp_path,
        append_log=True,
    )

    assert run == "run" and len(calls) == 1
    overrides, log_path, kwargs = calls[0]
    common = tiny_run_overrides(tmp_path / "assets", tmp_path / "run", total_training_steps=3, experiment_name="unit")
    hydra_dir = f"hydra.run.dir={tmp_path / 'run' / 'hydra'}"
    assert overrides == ["platform=cpu", *common, hydra_dir, "trainer.total_training_steps=7", "x=1"]
    assert log_path == tmp_path / "train.log"
    assert kwargs == {
        "entry_module": "treetune_recipe.cpo.main_cpo",
        "config_dir": cpu_run.CONFIG_DIR,
        "config_name": "cpo_trainer",
        "timeout_s": 60,
        "env": {"TREETUNE_EXAMPLE": "1"},
        "echo": echo,
        "cwd": tmp_path,
        "append_log": True,
    }


def test_the_run_folder_is_the_working_directory_unless_cwd_is_given(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(cpu_run, "launch_training", lambda overrides, log_path, **kwargs: calls.append(kwargs))
    cpu_run.launch_cpo_on_cpu(
        [], tmp_path / "log", assets_dir=tmp_path, run_dir=tmp_path / "run", total_training_steps=1, experiment_name="u"
    )
    assert calls[0]["cwd"] == tmp_path / "run"


def test_config_dir_is_the_recipe_config_folder():
    recipe_dir = Path(__file__).resolve().parents[3] / "treetune_recipe" / "cpo"
    assert cpu_run.CONFIG_DIR == recipe_dir / "config"
    assert (cpu_run.CONFIG_DIR / f"{cpu_run.CONFIG_NAME}.yaml").is_file()
