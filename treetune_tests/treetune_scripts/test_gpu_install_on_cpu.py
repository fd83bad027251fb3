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
"""The GPU install's behaviour, on CPU.

The resolution tests ask the real package index (through uv, as ``make check-gpu-install`` does; metadata only, no
wheel is downloaded): they resolve the stacks of the verl release installed here and every stack with uv overrides,
and fail, never skip, when the index cannot be reached. Expected versions come from the README's install lines, the
release's constraints file and the installed verl's own requirements, never from ``STACKS``.
"""

import dataclasses
import importlib.metadata
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from treetune_scripts import gpu_install
from treetune_scripts.gpu_install import STACKS

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALLED_VERL = importlib.metadata.version("verl")
#: Resolved here: the installed release's stacks (their checks read its metadata) and every stack with overrides.
RESOLVED = sorted(key for key, stack in STACKS.items() if key[0] == INSTALLED_VERL or stack.overrides)
#: Nothing listens on the discard port; no retries, to fail fast.
UNREACHABLE_INDEX = {"UV_DEFAULT_INDEX": "http://127.0.0.1:9/simple", "UV_HTTP_RETRIES": "0"}
#: Requirements of verl's engine extras the stacks leave out: Megatron's bridge, and verl itself (its verl-core set).
LEFT_OUT = {"mbridge", "verl"}


def unreachable_env(monkeypatch, tmp_path) -> None:
    for name in ("UV_INDEX", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS", "UV_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    for name, value in UNREACHABLE_INDEX.items():
        monkeypatch.setenv(name, value)


def readme_pins(stack) -> dict[str, str]:
    """Name -> version of the README's ``make install-gpu`` line for the stack (``verl X.Y.Z`` included)."""
    command = f"make install-gpu ROLLOUT={stack.rollout}"
    if stack.verl != gpu_install.DEFAULT_VERL:
        command += f" VERL={stack.verl}"
    readme = (REPO_ROOT / "README.md").read_text().splitlines()
    comment = next(line.split("#", 1)[1] for line in readme if line.split("#")[0].strip() == command)
    pins = dict(re.findall(r"([A-Za-z0-9_.-]+)==([^,\s]+)", comment))
    pins["verl"] = re.search(r"verl (\S+):", comment)[1]
    return pins


def constraint_lines(verl: str) -> list[Requirement]:
    path = REPO_ROOT / "treetune_verl" / "constraints" / f"verl-{verl}.txt"
    return [Requirement(line.split("#")[0]) for line in path.read_text().splitlines() if line.split("#")[0].strip()]


@pytest.fixture(scope="module")
def resolutions(tmp_path_factory) -> dict:
    """The real resolution of each stack of :data:`RESOLVED`, and each overriding stack's without its overrides
    (key ``(verl, rollout, "no overrides")``): a dict, or the :class:`ResolutionError` uv ended with."""
    workdir = tmp_path_factory.mktemp("resolve")
    jobs = {key: (STACKS[key], workdir) for key in RESOLVED}
    for key in RESOLVED:
        if STACKS[key].overrides:
            jobs[(*key, "no overrides")] = (dataclasses.replace(STACKS[key], overrides=()), workdir)

    def resolve(job):
        try:
            return gpu_install.resolve(*job)
        except gpu_install.ResolutionError as error:
            return error

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        return dict(zip(jobs, pool.map(resolve, jobs.values())))


def resolved(resolutions, key) -> dict[str, str]:
    result = resolutions[key]
    assert isinstance(result, dict), f"{key} did not resolve (is the package index reachable?):\n{result}"
    return result


def test_one_stack_per_supported_release_and_engine():
    releases = [line.strip() for line in (REPO_ROOT / "treetune_verl" / "VERL_VERSION").read_text().splitlines()]
    assert sorted(STACKS) == sorted((verl, rollout) for verl in releases if verl for rollout in ("sglang", "vllm"))


@pytest.mark.parametrize("key", [key for key in RESOLVED if key[0] == INSTALLED_VERL], ids="-".join)
def test_each_stack_resolves_to_what_the_readme_and_its_release_constraints_promise(resolutions, key):
    stack, versions = STACKS[key], resolved(resolutions, key)
    promised = readme_pins(stack)
    assert {name: versions.get(name) for name in promised} == promised
    assert promised["verl"] == stack.verl and stack.rollout in promised  # the line names the stack's engine
    assert {"verl", "transformers", "numpy"} <= set(versions)
    for requirement in constraint_lines(stack.verl):  # a constraint binds what is installed
        got = versions.get(requirement.name)
        assert got is None or requirement.specifier.contains(got), (requirement, got)


@pytest.mark.parametrize("key", [key for key in RESOLVED if key[0] == INSTALLED_VERL], ids="-".join)
def test_each_stack_satisfies_the_installed_verls_engine_extra_and_flash_attn_pins(resolutions, key):
    stack, versions = STACKS[key], resolved(resolutions, key)
    requirements = [Requirement(line) for line in importlib.metadata.requires("verl")]
    engine_extra = [r for r in requirements if r.marker and r.marker.evaluate({"extra": stack.rollout})]
    assert stack.rollout in {r.name for r in engine_extra}
    for requirement in engine_extra:
        name = gpu_install.canonical(requirement.name)
        if name not in LEFT_OUT:
            assert name in versions and requirement.specifier.contains(versions[name]), requirement
    for requirement in requirements:  # in whichever extra verl pins flash-attn, the stack's release matches
        if requirement.name == "flash-attn":
            assert requirement.specifier.contains(versions["flash-attn"]), requirement


@pytest.mark.parametrize("key", [key for key in RESOLVED if STACKS[key].overrides], ids="-".join)
def test_an_engine_that_conflicts_with_verl_resolves_only_through_the_overrides(resolutions, key):
    versions = resolved(resolutions, key)
    assert versions[STACKS[key].rollout]  # the engine is installed, at the release the check pins
    transformers = next(r for r in constraint_lines(key[0]) if r.name == "transformers")
    assert transformers.specifier.contains(versions["transformers"])
    assert "flash-attn-4" not in versions  # dropped: flash-attn ships its files
    without = resolutions[(*key, "no overrides")]
    assert isinstance(without, gpu_install.ResolutionError) and "transformers" in str(without)


def test_the_promise_check_flags_a_resolution_that_leaves_the_stack(resolutions):
    key = next(key for key in RESOLVED if STACKS[key].overrides)
    stack, versions = STACKS[key], resolved(resolutions, key)
    assert gpu_install.broken_promises(stack, versions) == []
    for change, named in [
        ({"transformers": "5.6.0"}, "transformers"),  # what sglang 0.5.12 itself pins; verl 0.9.1 excludes it
        ({"flash-attn-4": "4.0.0b9"}, "flash-attn-4"),
        ({stack.rollout: "0.0.1"}, stack.rollout),
        ({"nvidia-cuda-runtime": "12.8.90"}, "CUDA"),
    ]:
        problems = gpu_install.broken_promises(stack, {**versions, **change})
        assert problems and all(named in problem for problem in problems), (change, problems)


@pytest.mark.parametrize("local", ["2.9.0+cu128", "2.13.0+cpu", "2.11.0"])
def test_the_torch_constraint_names_the_installed_release_without_its_local_tag(tmp_path, local):
    dist_info = tmp_path / f"torch-{local}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {local}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "treetune_scripts.gpu_install", "torch-constraint"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={"PYTHONPATH": f"{tmp_path}:{REPO_ROOT}", "PATH": ""},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"torch=={local.split('+')[0]}"
    assert Requirement(proc.stdout).specifier.contains(local)  # the installed build satisfies it


@pytest.mark.parametrize(
    "argv, refused", [(["--rollout", "vllm", "--verl", "0.8.0"], "0.8.0"), (["--rollout", "trtllm"], "trtllm")]
)
def test_an_unknown_release_or_engine_is_refused_before_anything_runs(tmp_path, argv, refused):
    calls = tmp_path / "calls.log"
    python = tmp_path / "python"  # stands in for the target interpreter and logs any use of it
    python.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexit 1\n')
    python.chmod(0o755)
    constraint = tmp_path / "torch-constraint.txt"
    proc = subprocess.run(
        [sys.executable, "-m", "treetune_scripts.gpu_install", "install", *argv, "--python", str(python)]
        + ["--constraint-file", str(constraint)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 2 and f"invalid choice: '{refused}'" in proc.stderr
    choices = gpu_install.VERL_RELEASES if "--verl" in argv else gpu_install.ROLLOUTS
    assert all(choice in proc.stderr.splitlines()[-1] for choice in choices)  # the message names what is supported
    assert not calls.exists() and not constraint.exists()


def test_install_stops_at_a_stack_that_does_not_resolve_and_writes_no_torch_constraint(tmp_path, monkeypatch, capsys):
    unreachable_env(monkeypatch, tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([*gpu_install.UV, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    constraint = tmp_path / "torch-constraint.txt"
    argv = ["install", "--rollout", "vllm", "--verl", INSTALLED_VERL, "--python", str(venv / "bin" / "python")]
    assert gpu_install.main([*argv, "--constraint-file", str(constraint)]) == 1
    assert "make check-gpu-install" in capsys.readouterr().err
    assert not constraint.exists()
    assert not list((venv / "lib").glob("python*/site-packages/torch"))


def test_check_fails_when_the_index_cannot_be_reached(tmp_path, monkeypatch):
    unreachable_env(monkeypatch, tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "treetune_scripts.gpu_install", "check", "--verl", INSTALLED_VERL, "--rollout", "vllm"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL" in proc.stdout and "passed" not in proc.stdout


def fake_torch_python(tmp_path: Path, cuda: str) -> str:
    python = tmp_path / "python"  # answers the probe of torch's CUDA
    python.write_text(f"#!/bin/sh\necho {cuda}\n")
    python.chmod(0o755)
    return str(python)


def test_a_failed_flash_attn_without_nvcc_names_the_cuda_toolkit_of_torch(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    hint = gpu_install.flash_attn_hint(fake_torch_python(tmp_path, "12.8"))
    assert "no nvcc was found" in hint and "CUDA 12.8 toolkit" in hint


def test_a_failed_flash_attn_with_another_cudas_nvcc_names_both(tmp_path, monkeypatch):
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 11.8, V11.8.89'\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("PATH", str(nvcc.parent))
    hint = gpu_install.flash_attn_hint(fake_torch_python(tmp_path, "13.0"))
    assert "nvcc is CUDA 11.8" in hint and "CUDA 13.0" in hint
