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

    python -m treetune_scripts.gpu_install install --rollout vllm [--verl 0.7.1]  # make install-gpu ROLLOUT=vllm
    python -m treetune_scripts.gpu_install check                                  # make check-gpu-install
    python -m treetune_scripts.gpu_install torch-constraint                       # make install

:data:`STACKS` names the versions, keyed by ``(verl release, rollout)``: the torch the engine's wheel is built
against, the engine release that verl release pins (0.9.1's ``vllm`` and ``sglang`` extras) or tests (0.7.1's CI
images), and flash-attn (0.9.1: the release verl pins for torch 2.11; 0.7.1: what its vLLM image installs). Each
stack installs under its release's constraints, ``treetune_verl/constraints/verl-<release>.txt``, with this
project's extra for the stack. The stacks leave out what only Megatron or verl's full runtime set needs (``mbridge``,
``verl[verl-core]``): the FSDP recipe imports neither.

uv resolves and installs (the ``uv`` of the running interpreter, installed there with pip when missing). sglang
0.5.12 pins transformers==5.6.0, which verl 0.9.1 excludes; as verl's own images do, that stack installs with uv
overrides (:attr:`Stack.overrides`): transformers==5.9.0 replaces every transformers requirement, and sglang's
flash-attn-4 is dropped (flash-attn 2.8.3 ships the same ``flash_attn/cute`` files).

``install``: the stack (torch, engine, verl, verl-cpu and this project with its extras, flash-attn's build tools) in
one resolution; then the torch constraint file (the installed torch, so later installs keep it); then flash-attn with
``--no-build-isolation`` against that torch (a prebuilt wheel when one matches torch/CUDA/Python, else a compile that
needs nvcc). A failed step stops with what to do.

``check``: the same resolution as ``install``, as ``--dry-run`` for a throwaway virtualenv (package metadata only, no
wheel is downloaded) with a fresh uv cache, so the index itself answers; all stacks at once. flash-attn joins it with
its requirements stated, because its sdist's own metadata step needs torch and CUDA. A stack fails when it does not
resolve (an unreachable index included) or the resolution leaves its pins, its release's constraints, its overrides
or the CUDA of its torch wheel. Exit status 0 when every stack passed, else 1.

Only the standard library is imported at module level, so ``install`` runs in a fresh virtualenv.
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
from concurrent.futures import ThreadPoolExecutor
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
#: verl-cpu, a dependency of this project that no index serves: installed from its folder, as ``make install`` does.
#: A GPU stack keeps it: the Ray processes of a run apply its device-independent FSDP-engine fixes (the trainer's
#: log-probs over the tokenizer's ids, as vLLM's rollout samples them; verl 0.7.1's padded-path mask) with its release
#: guard and post-import hooks, on every device. Importing the library and the recipe, and their start-up checks, need
#: no verl-cpu (the preflight names it when it is missing).
VERL_CPU_DIR = REPO_ROOT / "treetune_verl" / "verl-cpu"
UV = [sys.executable, "-m", "uv"]
UV_REQUIREMENT = "uv>=0.9"
#: What flash-attn's setup.py needs in the environment it builds in (``--no-build-isolation``).
BUILD_TOOLS = ("setuptools", "wheel", "packaging", "ninja", "psutil")
#: The requirements flash-attn's sdists declare, stated to the check's resolver (building them needs torch and CUDA).
FLASH_ATTN_REQUIRES = ("torch", "einops")


def constraints_file(verl: str) -> Path:
    """The release's constraints (verl, numpy, transformers, ...), as ``make install`` uses them."""
    return REPO_ROOT / "treetune_verl" / "constraints" / f"verl-{verl}.txt"


@dataclass(frozen=True)
class Stack:
    """One serving engine with the torch it needs, for one verl release; versions are ``name==version``.

    Attributes:
        cuda: the CUDA (``major.minor``) of the torch wheel the index serves for ``torch``.
        overrides: uv overrides: each replaces every requirement on its distribution; a marker that never holds
            drops the distribution.
    """

    verl: str
    rollout: str
    torch: str
    cuda: str
    engine: str
    flash_attn: str
    overrides: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"verl{self.verl}-{self.rollout}"

    @property
    def extra(self) -> str:
        """This project's extra for the stack: the rollout for the default release, else ``<rollout>-verl071``."""
        return self.rollout if self.verl == DEFAULT_VERL else f"{self.rollout}-verl{self.verl.replace('.', '')}"

    @property
    def constraints(self) -> Path:
        return constraints_file(self.verl)

    @property
    def pins(self) -> tuple[str, ...]:
        return (self.torch, self.engine, f"verl=={self.verl}", self.flash_attn)


STACKS: dict[tuple[str, str], Stack] = {
    ("0.9.1", "vllm"): Stack("0.9.1", "vllm", "torch==2.11.0", "13.0", "vllm==0.24.0", "flash-attn==2.8.3"),
    ("0.9.1", "sglang"): Stack(
        "0.9.1",
        "sglang",
        "torch==2.11.0",
        "13.0",
        "sglang==0.5.12",
        "flash-attn==2.8.3",
        # verl 0.9.1's own [tool.uv] override-dependencies.
        overrides=("transformers==5.9.0", "kernels>=0.12.0,<0.13", "flash-attn-4; sys_platform == 'never'"),
    ),
    ("0.7.1", "vllm"): Stack("0.7.1", "vllm", "torch==2.9.0", "12.8", "vllm==0.12.0", "flash-attn==2.8.1"),
    ("0.7.1", "sglang"): Stack("0.7.1", "sglang", "torch==2.9.1", "12.8", "sglang==0.5.6", "flash-attn==2.8.1"),
}


class InstallError(RuntimeError):
    """A step of ``install`` failed; the message says what to do."""


class ResolutionError(RuntimeError):
    """uv could not resolve a stack; the message ends with uv's own explanation."""


def installed_torch_constraint() -> str:
    """``torch==<version>`` of the installed torch distribution without its local tag (``+cpu``, ``+cu128``): the
    installed build satisfies it, and so would the same release from an index that serves no tagged builds."""
    return f"torch=={importlib.metadata.version('torch').split('+')[0]}"


def release_constraints(verl: str) -> list[str]:
    """The requirement lines of the release's constraints file (comments and blank lines dropped)."""
    lines = (line.split("#", 1)[0].strip() for line in constraints_file(verl).read_text().splitlines())
    return [line for line in lines if line]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def ensure_uv() -> None:
    """Install uv into the running interpreter's environment when it has none."""
    if subprocess.run([*UV, "--version"], capture_output=True).returncode != 0:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", UV_REQUIREMENT], check=True)


def stack_install_command(stack: Stack, python: str, workdir: Path, *options: str) -> list[str]:
    """uv's command, with ``options``, that installs everything of ``stack`` but flash-attn into the environment of
    ``python`` (writes the stack's override file into ``workdir``)."""
    command = [*UV, "pip", "install", *options, "--python", python, "-c", str(stack.constraints)]
    if stack.overrides:
        overrides = workdir / "overrides.txt"
        overrides.write_text("\n".join(stack.overrides) + "\n")
        command += ["--override", str(overrides)]
    project = f"{REPO_ROOT}[{stack.extra},math,test]"
    requirements = [stack.torch, stack.engine, f"verl=={stack.verl}", "-e", str(VERL_CPU_DIR), "-e", project]
    return [*command, *requirements, *BUILD_TOOLS]


def flash_attn_hint(python: str) -> str:
    """What to do when flash-attn did not install, from the installed torch's CUDA and the local nvcc."""
    probe = [python, "-c", "import torch; print(torch.version.cuda)"]
    cuda = subprocess.run(probe, capture_output=True, text=True).stdout.strip() or "?"
    nvcc = shutil.which("nvcc") or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout if os.path.exists(nvcc) else ""
    found = re.search(r"release (\d+\.\d+)", version)
    if found is None:
        return (
            f"No prebuilt flash-attn wheel matched and no nvcc was found (PATH, CUDA_HOME): install the CUDA {cuda} "
            f"toolkit, put its nvcc on PATH or set CUDA_HOME, and rerun."
        )
    if found[1].split(".")[0] != cuda.split(".")[0]:
        return f"nvcc is CUDA {found[1]} but torch was built with CUDA {cuda}: put a CUDA {cuda} toolkit first."
    return f"nvcc {found[1]} matches torch's CUDA {cuda}: read the compile log above (memory: rerun with MAX_JOBS=4)."


def install(stack: Stack, python: str, constraint_file: Path) -> None:
    """Install ``stack`` into the environment of ``python``; write the installed torch to ``constraint_file``.

    Raises:
        InstallError: naming the step that failed and what to do.
    """
    ensure_uv()
    print(f"[install-gpu] {stack.name}: {', '.join(stack.pins[:3])}, this project [{stack.extra},math,test]")
    with tempfile.TemporaryDirectory(prefix="treetune-gpu-install-") as tmp:
        if subprocess.run(stack_install_command(stack, python, Path(tmp))).returncode != 0:
            raise InstallError(
                f"the {stack.name} stack did not install: `make check-gpu-install` shows whether it resolves. The "
                f"index's {stack.torch} is built for CUDA {stack.cuda}; for another build set e.g. "
                f"UV_TORCH_BACKEND=cu128."
            )
    probe = [python, "-m", "treetune_scripts.gpu_install", "torch-constraint"]
    constraint = subprocess.run(probe, capture_output=True, text=True, check=True, cwd=REPO_ROOT).stdout.strip()
    constraint_file.write_text(constraint + "\n")
    print(f"[install-gpu] torch constraint: {constraint} ({constraint_file})", flush=True)
    print(f"[install-gpu] {stack.flash_attn}, built against the installed torch", flush=True)
    command = [*UV, "pip", "install", "--python", python, "--no-build-isolation", "-c", str(constraint_file)]
    if subprocess.run([*command, "-c", str(stack.constraints), stack.flash_attn]).returncode != 0:
        raise InstallError(f"{stack.flash_attn} did not install. {flash_attn_hint(python)}")
    print(f"[install-gpu] done: {stack.name} ({', '.join(stack.pins)})")


def resolve(stack: Stack, workdir: Path) -> dict[str, str]:
    """What ``install`` would put into an empty virtualenv, flash-attn included: canonical name -> version.

    Works in a folder of its own under ``workdir`` and shares the uv cache there. Raises:
        ResolutionError: the stack does not resolve, or the index could not be reached.
    """
    scratch = Path(tempfile.mkdtemp(prefix=f"{stack.name}-", dir=workdir))
    venv = scratch / "venv"
    subprocess.run([*UV, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    name, version = stack.flash_attn.split("==")
    config = scratch / "uv.toml"
    requires = json.dumps(list(FLASH_ATTN_REQUIRES))  # a TOML array too
    config.write_text(f'[[dependency-metadata]]\nname = "{name}"\nversion = "{version}"\nrequires-dist = {requires}\n')
    options = ("--dry-run", "--cache-dir", str(workdir / "uv-cache"), "--config-file", str(config))
    command = [*stack_install_command(stack, str(venv / "bin" / "python"), scratch, *options), stack.flash_attn]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ResolutionError("\n".join(proc.stderr.strip().splitlines()[-12:]))
    return {canonical(m[1]): m[2] for m in re.finditer(r"^ \+ (\S+)==(\S+)", proc.stderr, re.MULTILINE)}


def resolved_cuda(resolved: dict[str, str]) -> str | None:
    """``major.minor`` of the CUDA runtime the resolved torch pulls in, if any."""
    for name in ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12"):
        if name in resolved:
            return ".".join(resolved[name].split(".")[:2])
    return None


def broken_promises(stack: Stack, resolved: dict[str, str]) -> list[str]:
    """Every way ``resolved`` leaves the stack's pins, its release's constraints, its overrides or its CUDA."""
    from packaging.requirements import Requirement

    problems = []
    for line in (*stack.pins, *release_constraints(stack.verl), *stack.overrides):
        requirement = Requirement(line)
        got = resolved.get(canonical(requirement.name))
        if requirement.marker is not None and not requirement.marker.evaluate():  # dropped by an override
            if got is not None:
                problems.append(f"{requirement.name} is dropped by an override, resolved {requirement.name}=={got}")
        elif got is None and line in stack.pins:
            problems.append(f"{line} expected, not in the resolution")
        elif got is not None and not requirement.specifier.contains(got, prereleases=True):
            problems.append(f"{line} expected, resolved {requirement.name}=={got}")
    if resolved_cuda(resolved) != stack.cuda:
        problems.append(f"torch for CUDA {stack.cuda} expected, resolved a CUDA runtime {resolved_cuda(resolved)}")
    return problems


#: The distributions named in each stack's report line, after the engine.
KEY_DISTRIBUTIONS = ("torch", "torchvision", "torchaudio", "verl", "transformers", "tensordict", "ray", "numpy")
KEY_DISTRIBUTIONS += ("triton", "flashinfer-python", "sgl-kernel", "sglang-kernel", "xgrammar", "flash-attn")


def check_stack(stack: Stack, workdir: Path) -> tuple[bool, str]:
    """Resolve ``stack`` and compare it with its promises; returns ``(passed, report)``."""
    start = time.monotonic()
    try:
        resolved = resolve(stack, workdir)
    except ResolutionError as error:
        return False, f"[check-gpu-install] {stack.name}: FAIL, uv could not resolve it:\n{error}"
    problems = broken_promises(stack, resolved)
    names = (canonical(stack.engine.split("==")[0]), *KEY_DISTRIBUTIONS)
    versions = ", ".join(f"{name}=={resolved[name]}" for name in names if name in resolved)
    lines = [
        f"[check-gpu-install] {stack.name}: {'FAIL' if problems else 'passed'}, {len(resolved)} distributions in "
        f"{time.monotonic() - start:.0f} s (CUDA {resolved_cuda(resolved)}): {versions}",
        *(f"  uv override: {override}" for override in stack.overrides),
        *(f"  FAIL {problem}" for problem in problems),
    ]
    return not problems, "\n".join(lines)


def check(stacks: list[Stack]) -> int:
    """Resolve ``stacks`` concurrently, print a report per stack; returns the exit status (0: all passed)."""
    ensure_uv()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="treetune-gpu-check-") as tmp:
        with ThreadPoolExecutor(max_workers=len(stacks)) as pool:
            results = list(pool.map(lambda stack: check_stack(stack, Path(tmp)), stacks))
    print("\n".join(report for _, report in results))
    passed = all(ok for ok, _ in results)
    names = ", ".join(stack.name for stack in stacks)
    print(f"[check-gpu-install] {'passed' if passed else 'FAILED'}: {names} ({time.monotonic() - start:.0f} s)")
    return 0 if passed else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    inst = sub.add_parser("install", help="install one GPU stack into the environment of --python")
    inst.add_argument("--rollout", required=True, choices=ROLLOUTS)
    inst.add_argument("--verl", default=DEFAULT_VERL, choices=VERL_RELEASES, help="default: %(default)s")
    inst.add_argument("--python", default=sys.executable)
    inst.add_argument("--constraint-file", type=Path, help="default: torch-constraint.txt in --python's venv")
    sub.add_parser("torch-constraint", help="print torch==<installed torch release>")
    chk = sub.add_parser("check", help="resolve every GPU stack for a throwaway virtualenv")
    chk.add_argument("--rollout", action="append", choices=ROLLOUTS, help="default: every engine")
    chk.add_argument("--verl", action="append", choices=VERL_RELEASES, help="default: every release")
    args = parser.parse_args(argv)
    if args.command == "torch-constraint":
        print(installed_torch_constraint())
        return 0
    if args.command == "check":
        return check([STACKS[(v, r)] for v in args.verl or VERL_RELEASES for r in args.rollout or ROLLOUTS])
    python = os.path.abspath(args.python) if os.sep in args.python else args.python
    constraint_file = args.constraint_file or Path(python).parent.parent / "torch-constraint.txt"
    try:
        install(STACKS[(args.verl, args.rollout)], python, constraint_file)
    except InstallError as error:
        print(f"[install-gpu] {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
