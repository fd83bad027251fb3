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
"""The GPU launch scripts stay runnable: valid bash, every Hydra override composes, missing inputs are named."""

import os
import subprocess
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

RECIPE_DIR = Path(__file__).resolve().parents[3] / "treetune_recipe" / "cpo"
SCRIPTS = ("run_cpo_qwen3-8b.sh", "run_cpo_qwen3-8b_sglang.sh", "run_cpo_sweep.sh", "ray_cluster.sh")


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_is_valid_bash(script):
    subprocess.run(["bash", "-n", str(RECIPE_DIR / script)], check=True)


def fake_inputs(tmp_path: Path) -> dict[str, str]:
    """Environment with an (empty) model folder and data files where the scripts look for them."""
    (tmp_path / "model").mkdir()
    for name in ("math_train", "math500", "aime2024", "aime2025", "amc23", "gpqa"):
        (tmp_path / f"{name}.parquet").touch()
    return {**os.environ, "MODEL_PATH": str(tmp_path / "model"), "DATA_DIR": str(tmp_path), "CKPT_DIR": "/ckpt"}


def dry_run(script: str, env: dict[str, str], *args: str) -> list[str]:
    """The entry point's arguments as the script would pass them (``DRY_RUN=1``)."""
    proc = subprocess.run(
        ["bash", str(RECIPE_DIR / script), *args],
        env={**env, "DRY_RUN": "1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = proc.stdout.splitlines()
    assert lines[:3] == ["python3", "-m", "treetune_recipe.cpo.main_cpo"]
    return lines[3:]


def test_every_override_of_the_8b_script_composes(tmp_path, monkeypatch):
    env = fake_inputs(tmp_path)
    overrides = dry_run("run_cpo_qwen3-8b.sh", env, "cpo.neg_alpha=0.5")
    assert len(overrides) > 40 and overrides[-1] == "cpo.neg_alpha=0.5"  # "$@" is passed through, last
    monkeypatch.setenv("CKPT_DIR", "/ckpt")
    with initialize_config_dir(config_dir=str(RECIPE_DIR / "config"), version_base=None):
        config = compose("cpo_trainer", overrides=overrides)  # an unknown key would raise here
    assert config.algorithm.adv_estimator == "cpo" and config.cpo.method == "seq_kl"
    assert config.cpo.neg_alpha == 0.5
    assert config.actor_rollout_ref.rollout.name == "vllm" and config.actor_rollout_ref.rollout.n == 8
    assert config.actor_rollout_ref.model.path == str(tmp_path / "model")
    assert list(config.data.val_files)[0] == str(tmp_path / "math500.parquet")
    assert config.trainer.default_local_dir == f"/ckpt/{config.trainer.experiment_name}"


def test_sglang_script_switches_the_rollout(tmp_path):
    overrides = dry_run("run_cpo_qwen3-8b_sglang.sh", fake_inputs(tmp_path))
    assert "actor_rollout_ref.rollout.name=sglang" in overrides


def test_sweep_script_is_a_hydra_multirun_over_the_knobs(tmp_path):
    arguments = dry_run("run_cpo_sweep.sh", {**fake_inputs(tmp_path), "WRAPS": "seq_kl,mi3", "NEG_ALPHAS": "0.5,1.0"})
    assert arguments[0] == "--multirun"  # must precede the overrides
    assert "cpo.method=seq_kl,mi3" in arguments and "cpo.neg_alpha=0.5,1.0" in arguments
    assert "trainer.experiment_name=qwen3_8b_cpo_${cpo.method}_neg${cpo.neg_alpha}" in arguments


def test_missing_model_and_data_are_named_before_anything_starts(tmp_path):
    env = {**os.environ, "MODEL_PATH": str(tmp_path / "no_model"), "DATA_DIR": str(tmp_path), "CKPT_DIR": str(tmp_path)}
    proc = subprocess.run(
        ["bash", str(RECIPE_DIR / "run_cpo_qwen3-8b.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    assert f"missing: model directory MODEL_PATH={tmp_path / 'no_model'}" in proc.stderr
    assert f"missing: data file {tmp_path / 'math_train.parquet'}" in proc.stderr
    assert "main_cpo" not in proc.stderr.split("missing:")[-1]  # stopped before the entry point ran


def test_multi_node_launch_without_a_ray_cluster_stops_naming_ray_address(tmp_path):
    env = {key: value for key, value in fake_inputs(tmp_path).items() if key != "RAY_ADDRESS"}
    proc = subprocess.run(
        ["bash", str(RECIPE_DIR / "run_cpo_qwen3-8b.sh")],
        env={**env, "NNODES": "2", "DRY_RUN": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "RAY_ADDRESS of a running Ray cluster for NNODES=2" in proc.stderr
    assert "main_cpo" not in proc.stdout


def test_multi_node_launch_attached_to_a_cluster_sets_nnodes(tmp_path):
    env = {**fake_inputs(tmp_path), "NNODES": "2", "NGPUS": "4", "RAY_ADDRESS": "10.0.0.1:6379"}
    overrides = dry_run("run_cpo_qwen3-8b.sh", env)
    assert "trainer.nnodes=2" in overrides and "trainer.n_gpus_per_node=4" in overrides


def ray_cluster(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(RECIPE_DIR / "ray_cluster.sh"), *args],
        env={**os.environ, "DRY_RUN": "1", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_ray_cluster_script_starts_a_head_and_attaches_workers():
    head = ray_cluster("head", NUM_GPUS="8", RAY_PORT="6380", RAY_TEMP_DIR="/scratch/ray")
    assert head.returncode == 0 and head.stdout.split() == [
        "ray",
        "start",
        "--head",
        "--port=6380",
        "--num-gpus=8",
        "--temp-dir=/scratch/ray",
    ]
    worker = ray_cluster("worker", RAY_HEAD="10.0.0.1:6380")
    assert worker.returncode == 0 and worker.stdout.split() == ["ray", "start", "--address=10.0.0.1:6380"]
    no_head = ray_cluster("worker", RAY_HEAD="")
    assert no_head.returncode == 1 and "set RAY_HEAD=" in no_head.stderr
    assert ray_cluster("stop").returncode == 1  # only head and worker are roles
