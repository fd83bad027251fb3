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
"""The library and the recipe without verl-cpu: every module imports, and the recipe's entry point builds its config
and runs its preflight as on a GPU node where verl-cpu is not installed.

``helpers/without_verl_cpu`` on ``PYTHONPATH`` makes every ``verl_cpu`` import fail in the test's processes (the
mirror of ``treetune_tests/verl_cpu/test_verl_cpu_alone_on_cpu.py``, which hides the overlay from verl-cpu). Each
check runs once with verl-cpu hidden and once, as the control, with it importable. The Ray processes of a run need
verl-cpu on every device (its post-import hooks, release guard and FSDP-engine fixes: ``treetune_verl.patches``), so
the modules verl loads inside them are expected to fail, and the preflight names the missing package before Ray.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from treetune_verl.tiny_assets import build_tiny_assets

ROOT = Path(__file__).resolve().parents[2]
WITHOUT_VERL_CPU = Path(__file__).resolve().parent / "helpers" / "without_verl_cpu"
#: Modules verl imports inside every Ray process of a run (a ``verl.plugins`` entry point, an external module): they
#: arm verl-cpu's post-import hooks, on every device.
RAY_PROCESS_MODULES = {"treetune_verl.plugin", "treetune_verl.verl_runtime"}

_IMPORT_EVERY_MODULE = """
import importlib, json, pkgutil, sys
import treetune_recipe, treetune_verl
failed = {}
names = []
for package in (treetune_verl, treetune_recipe):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        names.append(info.name)
        try:
            importlib.import_module(info.name)
        except Exception as error:
            failed[info.name] = f"{type(error).__name__}: {error}"
from treetune_verl.preflight import collect_problems
last_cpu_problem = collect_problems({"data": {}}, accelerator=False)[-1]  # what a host without accelerator is told
print(json.dumps({"names": names, "failed": failed, "verl_cpu_loaded": "verl_cpu" in sys.modules,
                  "last_cpu_problem": last_cpu_problem}))
"""


def _python(*args: str, hide_verl_cpu: bool, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "VERL_USE_EXTERNAL_MODULES"}
    if hide_verl_cpu:
        env["PYTHONPATH"] = os.pathsep.join([str(WITHOUT_VERL_CPU), str(ROOT)])
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout, check=False
    )


@pytest.mark.parametrize("hide_verl_cpu", [True, False], ids=["verl_cpu_hidden", "control"])
def test_every_library_and_recipe_module_imports_and_names_a_missing_verl_cpu(hide_verl_cpu):
    run = _python("-c", _IMPORT_EVERY_MODULE, hide_verl_cpu=hide_verl_cpu)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert {
        "treetune_verl.preflight",
        "treetune_recipe.cpo.main_cpo",
        "treetune_recipe.cpo.trainer.ray_trainer",
    } <= set(report["names"])
    needs_verl_cpu = "verl-cpu is not installed; this run needs the CPU platform (this host has no accelerator)"
    assert (needs_verl_cpu in report["last_cpu_problem"]) == hide_verl_cpu  # the control gets verl-cpu's own checks
    if hide_verl_cpu:
        assert set(report["failed"]) == RAY_PROCESS_MODULES, report["failed"]
        assert all("verl-cpu is hidden" in error for error in report["failed"].values())
    else:
        assert report["failed"] == {}
        assert report["verl_cpu_loaded"]  # the control sees verl-cpu (the Ray-process modules load it)


#: The entry point with the host reported as having an accelerator (the GPU-side checks run) and one problem of its
#: own, a validation file that does not exist, so that it stops in its preflight before Ray in both runs.
_MAIN_ON_AN_ACCELERATOR_HOST = """
import runpy, sys
import treetune_verl.preflight
treetune_verl.preflight.accelerator_available = lambda: True
sys.argv = ["main_cpo", *sys.argv[1:]]
runpy.run_module("treetune_recipe.cpo.main_cpo", run_name="__main__")
"""


@pytest.mark.parametrize("hide_verl_cpu", [True, False], ids=["verl_cpu_hidden", "control"])
def test_the_recipe_entry_point_builds_its_config_and_runs_its_gpu_preflight_without_verl_cpu(hide_verl_cpu, tmp_path):
    assets = build_tiny_assets()
    overrides = [
        f"actor_rollout_ref.model.path={assets / 'model'}",
        f"data.train_files={assets / 'data' / 'train.parquet'}",
        f"data.val_files={tmp_path / 'missing.parquet'}",
        "trainer.n_gpus_per_node=1",
        "++ray_kwargs.ray_init.num_gpus=1",
        "++ray_kwargs.ray_init.num_cpus=8",
        f"trainer.default_local_dir={tmp_path / 'checkpoints'}",
        "cpo.method=rlsd",  # a method with published run settings: the config is built as for a real run
    ]
    run = _python("-c", _MAIN_ON_AN_ACCELERATOR_HOST, *overrides, hide_verl_cpu=hide_verl_cpu)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert "[cpo] rlsd: published run settings applied" in run.stdout
    problems = [line for line in run.stderr.splitlines() if line.startswith("  - ")]
    missing_val = [p for p in problems if f"{tmp_path / 'missing.parquet'} does not exist" in p]
    missing_verl_cpu = [p for p in problems if "verl-cpu is not installed" in p]
    assert len(missing_val) == 1, run.stderr
    if hide_verl_cpu:
        assert problems == missing_val + missing_verl_cpu and "FSDP-engine fixes" in missing_verl_cpu[0]
    else:
        assert problems == missing_val
