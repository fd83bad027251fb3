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
"""The GPU install's pins and checks, without network and without a GPU.

Expected values come from the installed distributions' own metadata (verl's Requires-Dist, this project's extras)
and from hand-written resolutions; the resolver check against the real index is ``make check-gpu-install``.
"""

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from treetune_scripts import gpu_install
from treetune_scripts.gpu_install import STACKS, installed_torch_constraint, pin_problems

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_constraint_uses_the_distribution_version_not_torch_version(monkeypatch):
    import torch

    # A PyPI CUDA wheel: the distribution is 2.9.0, torch.__version__ says 2.9.0+cu128 (no index serves that).
    monkeypatch.setattr(torch, "__version__", "2.9.0+cu128")
    monkeypatch.setattr(gpu_install.importlib.metadata, "version", lambda name: {"torch": "2.9.0"}[name])
    assert installed_torch_constraint() == "torch==2.9.0"


def test_constraint_file_is_satisfied_by_the_installed_torch(tmp_path):
    constraint = tmp_path / "constraint.txt"
    constraint.write_text(installed_torch_constraint() + "\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-index",
            "--no-deps",
            "-c",
            str(constraint),
            "torch",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "already satisfied" in proc.stdout


def test_project_extras_pin_the_engines_of_the_stacks():
    extras = {}
    for line in importlib.metadata.requires("treetune-verl"):
        requirement = Requirement(line)
        for name in STACKS:
            if requirement.marker and requirement.marker.evaluate({"extra": name}) and requirement.name == name:
                extras[name] = f"{requirement.name}{requirement.specifier}"
    assert extras == {name: stack.engine for name, stack in STACKS.items()}
    # verl 0.7.1 accepts both engine pins, and its sglang extra wants exactly the stack's torch.
    verl_requires = [Requirement(line) for line in importlib.metadata.requires("verl")]
    for name, stack in STACKS.items():
        for requirement in verl_requires:
            if requirement.marker and requirement.marker.evaluate({"extra": name}):
                pinned = Requirement(stack.engine if requirement.name == name else stack.torch)
                if requirement.name in (name, "torch"):
                    assert requirement.specifier.contains(str(pinned.specifier).lstrip("="))


def fake_resolution(stack, **overrides) -> dict[str, dict]:
    """A resolution that satisfies verl's requirements for ``stack``, as ``pip --report`` metadata."""
    verl = importlib.metadata.metadata("verl")
    # Everything else at the versions installed here, which satisfy verl's base requirements.
    versions = {
        gpu_install._canonical(dist.metadata["Name"]): dist.version for dist in importlib.metadata.distributions()
    }
    versions.update(
        {"torch": stack.torch.split("==")[1], stack.rollout: stack.engine.split("==")[1], "tensordict": "0.10.0"}
    )
    versions.update(overrides)
    resolution = {name: {"name": name, "version": version} for name, version in versions.items()}
    resolution["verl"].update(
        requires_dist=verl.get_all("Requires-Dist"), provides_extra=verl.get_all("Provides-Extra")
    )
    return resolution


@pytest.mark.parametrize("rollout", sorted(STACKS))
def test_a_resolution_within_verls_pins_passes(rollout):
    assert pin_problems(STACKS[rollout], fake_resolution(STACKS[rollout])) == []


def test_wrong_torch_for_the_engine_fails():
    problems = pin_problems(STACKS["sglang"], fake_resolution(STACKS["sglang"], torch="2.9.0"))
    assert "torch==2.9.1 expected, resolved torch==2.9.0" in problems
    assert any("verl requires 'torch==2.9.1" in problem for problem in problems)  # verl's own sglang pin


def test_tensordict_outside_verls_range_fails():
    problems = pin_problems(STACKS["vllm"], fake_resolution(STACKS["vllm"], tensordict="0.9.0"))
    assert problems and all(problem.startswith("verl requires 'tensordict!=0.9.0") for problem in problems)
    assert all(problem.endswith("resolved tensordict==0.9.0") for problem in problems)


def test_another_engine_release_fails():
    problems = pin_problems(STACKS["vllm"], fake_resolution(STACKS["vllm"], vllm="0.11.0"))
    assert problems == ["vllm==0.12.0 expected, resolved vllm==0.11.0"]


def test_unreachable_index_is_reported_and_never_a_pass():
    env = {
        **os.environ,
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",  # nothing listens on the discard port
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_FIND_LINKS": "",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "treetune_scripts.gpu_install", "check", "--rollout", "vllm"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "INDEX UNREACHABLE (not a pass)" in proc.stdout and "passed" not in proc.stdout


def test_readme_names_each_stack_with_its_exact_pins():
    readme = (REPO_ROOT / "README.md").read_text()
    for name, stack in STACKS.items():
        line = next(line for line in readme.splitlines() if line.startswith(f"make install-gpu ROLLOUT={name} "))
        for pin in (stack.torch, stack.engine, gpu_install.FLASH_ATTN):
            assert pin in line, (name, pin)


def fake_python(tmp_path: Path, *, fail_on: str, torch_info: str = "2.9.0+cu128 12.8 (3, 12)") -> str:
    """An executable standing in for the venv's python: pip fails on the argument ``fail_on``, ``-c`` prints
    ``torch_info``, ``-m treetune_scripts.gpu_install torch-constraint`` prints the constraint of torch 2.9.0."""
    script = tmp_path / "python"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *{fail_on}*) echo "pip failed on $*" >&2; exit 1;; esac\n'
        'case "$*" in *torch-constraint*) echo "torch==2.9.0"; exit 0;; esac\n'
        f'case "$1" in -c) echo "{torch_info}"; exit 0;; esac\n'
        "exit 0\n"
    )
    script.chmod(0o755)
    return str(script)


def test_install_stops_at_the_failing_step_naming_what_to_do(tmp_path):
    python = fake_python(tmp_path, fail_on="torch==2.9.0")
    with pytest.raises(gpu_install.InstallError, match="pip could not install torch==2.9.0") as error:
        gpu_install.install("vllm", python, tmp_path / "constraint.txt")
    assert "PIP_EXTRA_INDEX_URL" in str(error.value)
    assert not (tmp_path / "constraint.txt").exists()  # nothing after the failed step ran


def test_install_writes_the_constraint_then_installs_the_engine_under_it(tmp_path):
    python = fake_python(tmp_path, fail_on="vllm==0.12.0")
    with pytest.raises(gpu_install.InstallError, match="vllm==0.12.0 with torch==2.9.0") as error:
        gpu_install.install("vllm", python, tmp_path / "constraint.txt")
    assert (tmp_path / "constraint.txt").read_text() == "torch==2.9.0\n"
    assert "make check-gpu-install" in str(error.value)


def test_flash_attn_failure_without_nvcc_says_which_cuda_toolkit_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvcc on PATH (the fake python is called by full path)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    python = fake_python(tmp_path, fail_on="flash-attn==2.8.1")
    with pytest.raises(gpu_install.InstallError) as error:
        gpu_install.install("sglang", python, tmp_path / "constraint.txt")
    message = str(error.value)
    assert "install flash-attn==2.8.1" in message and "nvcc was not found" in message
    assert "Install the CUDA 12.8 toolkit" in message


def test_flash_attn_failure_with_a_mismatched_nvcc_names_both_cuda_versions(tmp_path, monkeypatch):
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 11.8, V11.8.89'\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("PATH", str(nvcc.parent))
    python = fake_python(tmp_path, fail_on="flash-attn==2.8.1")
    with pytest.raises(gpu_install.InstallError, match="nvcc is CUDA 11.8 but torch was built with CUDA 12.8"):
        gpu_install.install("vllm", python, tmp_path / "constraint.txt")


@pytest.mark.parametrize("rollout", sorted(STACKS))
def test_import_smoke_modules_exist_in_the_installed_verl(rollout):
    verl_dir = Path(importlib.util.find_spec("verl").origin).parent
    for module in STACKS[rollout].import_modules:
        root, *rest = module.split(".")
        base = verl_dir.parent if root == "verl" else REPO_ROOT
        assert (base / root / Path(*rest)).with_suffix(".py").is_file(), module
