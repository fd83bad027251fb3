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

Expected values come from the installed distributions' own metadata (verl's Requires-Dist), ``pyproject.toml``'s
extras, the release constraints and hand-written resolutions. Checks that need a release's verl metadata cover the
stacks of the verl release installed in the running environment (run the file in each release's environment); the
resolver check against the real index is ``make check-gpu-install``.
"""

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from treetune_scripts import gpu_install
from treetune_scripts.gpu_install import STACKS, installed_torch_constraint, pin_problems
from treetune_verl.version import DEFAULT_VERL_VERSION, SUPPORTED_VERL_VERSIONS, installed_verl_version

tomllib = pytest.importorskip("tomllib")

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The stacks of the verl release installed here (their checks read that release's metadata).
INSTALLED = sorted(key for key in STACKS if key[0] == installed_verl_version())
OTHER = sorted(key for key in STACKS if key[0] != installed_verl_version())


def verl_requirements(extra: str) -> list[Requirement]:
    """The installed verl's requirements that only ``extra`` adds."""
    requirements = [Requirement(line) for line in importlib.metadata.requires("verl")]
    return [r for r in requirements if r.marker and r.marker.evaluate({"extra": extra})]


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


def test_one_stack_per_release_and_engine_each_with_its_release_constraints():
    assert gpu_install.VERL_RELEASES == SUPPORTED_VERL_VERSIONS
    assert gpu_install.DEFAULT_VERL == DEFAULT_VERL_VERSION
    assert sorted(STACKS) == sorted(
        (verl, rollout) for verl in SUPPORTED_VERL_VERSIONS for rollout in ("vllm", "sglang")
    )
    for (verl, rollout), stack in STACKS.items():
        assert (stack.verl, stack.rollout) == (verl, rollout)
        assert stack.constraints.is_file()
        assert f"verl=={verl}" in gpu_install.release_constraints(verl)
    assert STACKS[(DEFAULT_VERL_VERSION, "vllm")].extra == "vllm"
    assert STACKS[("0.7.1", "sglang")].extra == "sglang-verl071"
    assert gpu_install.venv_dir(DEFAULT_VERL_VERSION) == REPO_ROOT / ".venv"
    assert gpu_install.venv_dir("0.7.1") == REPO_ROOT / ".venv-verl0.7.1"


def test_release_constraints_drop_comments_and_blank_lines():
    for verl in SUPPORTED_VERL_VERSIONS:
        lines = gpu_install.release_constraints(verl)
        assert lines and all(line and "#" not in line and line == line.strip() for line in lines)
        assert {Requirement(line).name for line in lines} >= {"verl", "numpy", "transformers", "tensordict"}


def test_project_extras_name_the_engine_and_the_release_of_each_stack():
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    engine_extras = {name: sorted(pins) for name, pins in extras.items() if name not in gpu_install.PROJECT_EXTRAS}
    assert engine_extras == {stack.extra: sorted(stack.extra_requirements) for stack in STACKS.values()}
    for stack in STACKS.values():  # the engine pin itself, unless pip must take the engine without its requirements
        assert (stack.engine in stack.extra_requirements) != stack.overrides_engine
        assert f"verl=={stack.verl}" in stack.extra_requirements


def test_only_sglang_on_verl_091_overrides_its_engine_as_verls_uv_overrides_do():
    assert [key for key, stack in STACKS.items() if stack.overrides_engine] == [("0.9.1", "sglang")]
    stack = STACKS[("0.9.1", "sglang")]
    assert stack.engine_override == ("transformers==5.9.0", "kernels>=0.12.0,<0.13")
    assert stack.engine_drop == ("flash-attn-4",)
    transformers = Requirement(stack.engine_override[0])
    for line in gpu_install.release_constraints("0.9.1"):  # the override stays inside the release's constraints
        if Requirement(line).name == "transformers":
            assert Requirement(line).specifier.contains(next(iter(transformers.specifier)).version)


def test_engine_dependencies_drop_extras_dropped_and_overridden_names_exactly():
    stack = STACKS[("0.9.1", "sglang")]
    requires = [
        "transformers==5.6.0",
        "torch==2.11.0",
        "flash-attn-4>=4.0.0b9",
        "Flash_Attn_4",
        "kernels",
        "quack-kernels>=0.4.1",
        'decord2; sys_platform == "linux" and platform_machine == "aarch64"',
        'pytest; extra == "test"',
        "sglang-kernel==0.4.2.post2",
    ]
    assert gpu_install.engine_dependencies(stack, requires) == [
        "torch==2.11.0",
        "quack-kernels>=0.4.1",
        'decord2; sys_platform == "linux" and platform_machine == "aarch64"',
        "sglang-kernel==0.4.2.post2",
    ]
    plain = STACKS[("0.7.1", "sglang")]  # nothing overridden: only the extras' requirements go
    assert gpu_install.engine_dependencies(plain, requires) == [line for line in requires if "extra" not in line]


@pytest.mark.parametrize("key", INSTALLED, ids="-".join)
def test_the_installed_verl_accepts_the_stacks_torch_engine_and_flash_attn(key):
    stack = STACKS[key]
    engine_extra = verl_requirements(stack.rollout)
    assert stack.engine_name in {r.name for r in engine_extra}, "verl's engine extra names the engine"
    for requirement in engine_extra:
        pinned = {"torch": stack.torch, stack.engine_name: stack.engine}.get(requirement.name)
        if pinned:
            assert requirement.specifier.contains(pinned.split("==")[1]), requirement
    for override in stack.engine_override:  # verl pins what the override pins, where it pins it at all
        name, version = override.split("==") if "==" in override else (None, None)
        for requirement in engine_extra:
            if requirement.name == name:
                assert requirement.specifier.contains(version), (requirement, override)
    flash_attn = Version(stack.flash_attn.split("==")[1])
    for line in importlib.metadata.requires("verl"):
        requirement = Requirement(line)
        if requirement.name == "flash-attn":
            assert requirement.specifier.contains(flash_attn), line


def fake_resolution(stack, **overrides) -> dict[str, dict]:
    """A resolution that satisfies verl's requirements for ``stack``, as ``pip --report`` metadata: the distributions
    installed here, every ``==`` pin of verl's engine extra (and its unpinned requirements not installed here), the
    stack's own pins, then ``overrides``."""
    verl = importlib.metadata.metadata("verl")
    versions = {
        gpu_install._canonical(dist.metadata["Name"]): dist.version for dist in importlib.metadata.distributions()
    }
    for requirement in verl_requirements(stack.rollout):
        name = gpu_install._canonical(requirement.name)
        pins = [spec.version for spec in requirement.specifier if spec.operator == "=="]
        if name in ("verl", *stack.left_out):
            continue
        if pins:
            versions[name] = pins[0]
        elif name not in versions and not requirement.specifier:  # e.g. sglang-kernel for sglang on verl 0.9.1
            versions[name] = "1.0"
    versions.update({"torch": stack.torch.split("==")[1], stack.rollout: stack.engine.split("==")[1]})
    versions.update({"tensordict": "0.10.0", "nvidia-cuda-runtime": f"{stack.cuda}.96"})
    versions.update(overrides)
    resolution = {name: {"name": name, "version": version} for name, version in versions.items()}
    resolution["verl"].update(
        requires_dist=verl.get_all("Requires-Dist"), provides_extra=verl.get_all("Provides-Extra")
    )
    return resolution


@pytest.mark.parametrize("key", INSTALLED, ids="-".join)
def test_a_resolution_within_the_pins_and_verls_requirements_passes(key):
    assert pin_problems(STACKS[key], fake_resolution(STACKS[key])) == []


@pytest.mark.parametrize("key", INSTALLED, ids="-".join)
def test_wrong_torch_for_the_engine_fails(key):
    stack = STACKS[key]
    problems = pin_problems(stack, fake_resolution(stack, torch="2.8.0"))
    assert f"{stack.torch} expected, resolved torch==2.8.0" in problems
    if any(r.name == "torch" for r in verl_requirements(stack.rollout)):  # sglang on 0.7.1, both engines on 0.9.1
        assert any(problem.startswith(f"verl requires '{stack.torch}") for problem in problems)


def test_tensordict_outside_verls_range_fails():
    stack = STACKS[INSTALLED[0]]
    problems = pin_problems(stack, fake_resolution(stack, tensordict="0.9.0"))
    verl = [problem for problem in problems if problem.startswith("verl requires")]
    assert verl and all(problem.startswith("verl requires 'tensordict!=0.9.0") for problem in verl)
    assert all(problem.endswith("resolved tensordict==0.9.0") for problem in problems)
    assert f"constraint 'tensordict==0.10.0' of verl {stack.verl}: resolved tensordict==0.9.0" in problems


@pytest.mark.parametrize("key", INSTALLED, ids="-".join)
def test_another_engine_release_fails(key):
    stack = STACKS[key]
    problems = pin_problems(stack, fake_resolution(stack, **{stack.engine_name: "0.0.1"}))
    assert problems[0] == f"{stack.engine} expected, resolved {stack.engine_name}==0.0.1"
    assert all(problem.endswith(f"resolved {stack.engine_name}==0.0.1") for problem in problems)


@pytest.mark.parametrize("name", ["numpy", "transformers"])
def test_numpy_or_transformers_outside_the_release_constraints_fails(name):
    stack = STACKS[INSTALLED[0]]
    constraint = next(line for line in gpu_install.release_constraints(stack.verl) if Requirement(line).name == name)
    outside = next(
        v for v in ("1.26.4", "2.1.0", "4.56.2", "5.5.0") if not Requirement(constraint).specifier.contains(v)
    )
    problems = pin_problems(stack, fake_resolution(stack, **{name: outside}))
    assert f"constraint {constraint!r} of verl {stack.verl}: resolved {name}=={outside}" in problems


def test_a_torch_for_another_cuda_fails():
    stack = STACKS[INSTALLED[0]]
    problems = pin_problems(stack, fake_resolution(stack, **{"nvidia-cuda-runtime": "11.8.89"}))
    assert problems == [f"torch for CUDA {stack.cuda} expected, resolved a CUDA runtime 11.8"]


@pytest.mark.parametrize("key", INSTALLED, ids="-".join)
def test_left_out_requirements_are_exactly_the_unresolved_ones(key):
    stack = STACKS[key]
    stale = gpu_install.Stack(**{**stack.__dict__, "left_out": (*stack.left_out, "no-such-dist")})
    assert pin_problems(stale, fake_resolution(stack)) == [
        f"left out 'no-such-dist' is no requirement of verl[{stack.rollout}]: drop it"
    ]
    if not stack.left_out:
        return
    # Without left_out, each one is a failure: mbridge, and every requirement of verl[verl-core] not installed here.
    everything = gpu_install.Stack(**{**stack.__dict__, "left_out": ()})
    resolution = fake_resolution(stack)
    resolution.pop("mbridge", None)
    missing = [problem for problem in pin_problems(everything, resolution) if problem.endswith("not in the resolution")]
    assert any(problem.startswith("verl requires 'mbridge") for problem in missing)
    core = [r for r in verl_requirements("verl-core") if gpu_install._canonical(r.name) not in resolution]
    assert core and all(any(problem.startswith(f"verl requires '{r.name}") for problem in missing) for r in core)


def test_a_dropped_engine_requirement_brought_back_by_another_fails():
    stack = STACKS[("0.9.1", "sglang")]
    dropped = gpu_install.Stack(**{**STACKS[INSTALLED[0]].__dict__, "engine_drop": stack.engine_drop})
    problems = pin_problems(dropped, fake_resolution(dropped, **{"flash-attn-4": "4.0.0b9"}))
    assert problems == [
        f"flash-attn-4 is dropped from {dropped.engine_name}'s requirements, resolved flash-attn-4==4.0.0b9"
    ]


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
    for verl in SUPPORTED_VERL_VERSIONS:  # --rollout vllm: the vllm stack of every release, and no sglang stack
        assert f"verl{verl}-vllm: resolving" in proc.stdout
    assert "sglang" not in proc.stdout


def test_check_prints_the_table_and_fails_when_one_stack_does_not_resolve(monkeypatch, capsys):
    def resolve(stack, python, workdir):
        if stack.verl != installed_verl_version():
            raise RuntimeError(f"pip could not resolve the {stack.name} stack:\nResolutionImpossible")
        return fake_resolution(stack)

    monkeypatch.setattr(gpu_install, "resolve", resolve)
    monkeypatch.setattr(gpu_install, "flash_attn_on_index", lambda python, pins: {pin: f"{pin}: on" for pin in pins})
    assert gpu_install.check(sorted(STACKS), sys.executable) == (1 if OTHER else 0)
    out = capsys.readouterr().out
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["verl", "rollout"])
    header, *rows = lines[start : start + len(STACKS) + 1]
    assert header.split() == list(gpu_install.TABLE_COLUMNS)
    table = {tuple(row.split()[:2]): row.split() for row in rows}
    for key in INSTALLED:
        stack = STACKS[key]
        resolved = {name: meta["version"] for name, meta in fake_resolution(stack).items()}
        expected = [stack.verl, stack.rollout, stack.torch.split("==")[1], stack.cuda, resolved["transformers"]]
        expected += [resolved["numpy"], stack.engine, stack.flash_attn.split("==")[1], "on"]
        assert table[key] == [*expected, "index", "passed"]
    for key in OTHER:
        assert table[key][2:] == ["-"] * 5 + [STACKS[key].flash_attn.split("==")[1], "on", "index", "failed"]
        assert f"FAIL pip could not resolve the {STACKS[key].name} stack" in out
    assert (
        out.rstrip()
        .splitlines()[-1]
        .startswith("[check-gpu-install] FAILED" if OTHER else "[check-gpu-install] passed")
    )


def test_readme_names_each_stack_with_its_exact_pins():
    readme = (REPO_ROOT / "README.md").read_text()
    for stack in STACKS.values():
        command = f"make install-gpu ROLLOUT={stack.rollout}"
        if stack.verl != DEFAULT_VERL_VERSION:
            command += f" VERL={stack.verl}"
        line = next(line for line in readme.splitlines() if line.split("#")[0].strip() == command)
        for pin in (f"verl {stack.verl}", stack.torch, stack.engine, stack.flash_attn):
            assert pin in line, (stack.name, pin)


ENGINE_REQUIRES = ["torch==2.11.0", "transformers==5.6.0", "flash-attn-4>=4.0.0b9", 'av; sys_platform == "darwin"']


def fake_python(tmp_path: Path, *, fail_on: str, torch_info: str = "2.9.0+cu128 12.8 (3, 12)") -> str:
    """An executable standing in for the venv's python: logs its arguments (one call a line) to ``calls.log``, pip
    fails on the argument ``fail_on``, ``-m treetune_scripts.gpu_install torch-constraint`` prints the constraint of
    torch 2.9.0, the probe of an installed engine's requirements prints :data:`ENGINE_REQUIRES`, any other ``-c``
    prints ``torch_info``."""
    script = tmp_path / "python"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {tmp_path / "calls.log"}\n'
        f'case "$*" in *{fail_on}*) echo "pip failed on $*" >&2; exit 1;; esac\n'
        'case "$*" in *torch-constraint*) echo "torch==2.9.0"; exit 0;; esac\n'
        f"case \"$*\" in *m.requires*) printf '%s\\n' '{json.dumps(ENGINE_REQUIRES)}'; exit 0;; esac\n"
        f'case "$1" in -c) echo "{torch_info}"; exit 0;; esac\n'
        "exit 0\n"
    )
    script.chmod(0o755)
    return str(script)


def test_install_stops_at_the_failing_step_naming_what_to_do(tmp_path):
    python = fake_python(tmp_path, fail_on="torch==2.9.0")
    with pytest.raises(gpu_install.InstallError, match="pip could not install torch==2.9.0") as error:
        gpu_install.install("vllm", python, tmp_path / "constraint.txt", verl="0.7.1")
    assert "CUDA 12.8" in str(error.value) and "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cu128" in str(
        error.value
    )
    assert not (tmp_path / "constraint.txt").exists()  # nothing after the failed step ran


def test_install_writes_the_constraint_then_installs_the_engine_under_it(tmp_path):
    stack = STACKS[(DEFAULT_VERL_VERSION, "vllm")]
    python = fake_python(tmp_path, fail_on=stack.engine)
    with pytest.raises(gpu_install.InstallError, match=f"{stack.engine} with {stack.torch}") as error:
        gpu_install.install("vllm", python, tmp_path / "constraint.txt")
    assert (tmp_path / "constraint.txt").read_text() == "torch==2.9.0\n"
    assert f"verl=={DEFAULT_VERL_VERSION}" in str(error.value) and "make check-gpu-install" in str(error.value)


@pytest.mark.parametrize("key", sorted(STACKS), ids="-".join)
def test_install_runs_every_step_with_the_releases_constraints(tmp_path, key):
    stack = STACKS[key]
    python = fake_python(tmp_path, fail_on="never-matches")
    constraint = tmp_path / "constraint.txt"
    gpu_install.install(stack.rollout, python, constraint, verl=stack.verl)
    calls = (tmp_path / "calls.log").read_text().splitlines()
    constraints = f"-c {constraint} -c {stack.constraints}"
    project = f"{REPO_ROOT}[{stack.extra},math,test]"
    if stack.overrides_engine:  # the engine alone, its requirements read back, the rest of them without the overridden
        engine = [
            f"-m pip install {constraints} --no-deps {stack.engine}",
            f"-c import importlib.metadata as m, json; print(json.dumps(m.requires({stack.engine_name!r}) or []))",
            f'-m pip install {constraints} torch==2.11.0 av; sys_platform == "darwin" verl=={stack.verl} -e {project}',
        ]
    else:
        engine = [f"-m pip install {constraints} {stack.engine} verl=={stack.verl} -e {project}"]
    assert calls == [
        f"-m pip install {stack.torch}",
        "-m treetune_scripts.gpu_install torch-constraint",
        f"-m pip install {constraints} wheel packaging ninja psutil",
        *engine,
        f"-m pip install {constraints} --no-build-isolation {stack.flash_attn}",
    ]


def test_install_cli_defaults_to_the_first_release(tmp_path):
    python = fake_python(tmp_path, fail_on="never-matches")
    constraint = tmp_path / "constraint.txt"
    assert (
        gpu_install.main(["install", "--rollout", "sglang", "--python", python, "--constraint-file", str(constraint)])
        == 0
    )
    calls = (tmp_path / "calls.log").read_text()
    assert f"verl=={DEFAULT_VERL_VERSION} -e {REPO_ROOT}[sglang,math,test]" in calls
    assert f"-c {STACKS[(DEFAULT_VERL_VERSION, 'sglang')].constraints}" in calls
    with pytest.raises(SystemExit):  # an unsupported release is refused by the argument parser
        gpu_install.main(["install", "--rollout", "vllm", "--verl", "0.8.0", "--python", python])


@pytest.mark.parametrize("key", sorted(STACKS), ids="-".join)
def test_flash_attn_failure_without_nvcc_says_which_cuda_toolkit_to_install(tmp_path, monkeypatch, key):
    stack = STACKS[key]
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvcc on PATH (the fake python is called by full path)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    python = fake_python(tmp_path, fail_on=stack.flash_attn, torch_info=f"{stack.torch[7:]}+cu {stack.cuda} (3, 12)")
    with pytest.raises(gpu_install.InstallError) as error:
        gpu_install.install(stack.rollout, python, tmp_path / "constraint.txt", verl=stack.verl)
    message = str(error.value)
    assert f"install {stack.flash_attn}" in message and "nvcc was not found" in message
    assert f"Install the CUDA {stack.cuda} toolkit" in message


def test_flash_attn_failure_with_a_mismatched_nvcc_names_both_cuda_versions(tmp_path, monkeypatch):
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 11.8, V11.8.89'\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("PATH", str(nvcc.parent))
    python = fake_python(tmp_path, fail_on="flash-attn==2.8.1")
    with pytest.raises(gpu_install.InstallError, match="nvcc is CUDA 11.8 but torch was built with CUDA 12.8"):
        gpu_install.install("vllm", python, tmp_path / "constraint.txt", verl="0.7.1")


@pytest.mark.parametrize("key", INSTALLED, ids="-".join)
def test_import_smoke_modules_exist_in_the_installed_verl(key):
    verl_dir = Path(importlib.util.find_spec("verl").origin).parent
    for module in STACKS[key].import_modules:
        root, *rest = module.split(".")
        base = verl_dir.parent if root == "verl" else REPO_ROOT
        assert (base / root / Path(*rest)).with_suffix(".py").is_file(), module


def probing_python(path: Path, verl: str, engine: str) -> str:
    """An interpreter whose metadata probe answers ``verl`` and ``engine`` versions and whose imports all fail."""
    answer = f'*importlib.metadata*) echo "{verl} {engine}";;'
    path.write_text(f'#!/bin/sh\ncase "$2" in {answer} *) echo "imported $2" >&2; exit 3;; esac\n')
    path.chmod(0o755)
    return str(path)


def test_import_smoke_runs_only_for_the_release_and_engine_installed_in_the_environment(tmp_path):
    vllm_071, vllm_091 = STACKS[("0.7.1", "vllm")], STACKS[("0.9.1", "vllm")]
    python = probing_python(tmp_path / "python071", "0.9.1", vllm_071.engine.split("==")[1])
    other = gpu_install.import_smoke(vllm_071, python)
    assert other == f"import smoke skipped: {python} has verl 0.9.1, this stack is verl 0.7.1"
    python = probing_python(tmp_path / "python091", "0.9.1", vllm_091.engine.split("==")[1])
    with pytest.raises(RuntimeError, match="import smoke of verl.workers.rollout.vllm_rollout"):
        gpu_install.import_smoke(vllm_091, python)  # same release and engine: the imports run (and fail)
    python = probing_python(tmp_path / "python_other_vllm", "0.9.1", "0.1.0")
    assert gpu_install.import_smoke(vllm_091, python).endswith(f"vllm is 0.1.0, not the stack's 0.24.0 in {python}")
    missing = gpu_install.import_smoke(STACKS[("0.9.1", "sglang")], sys.executable)
    if importlib.util.find_spec("sglang") is None:
        assert missing == f"import smoke skipped: sglang is not installed in {sys.executable}"
