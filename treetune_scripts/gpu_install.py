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
"""The GPU-node install, one stack per serving engine, and the resolver check of every stack.

    python -m treetune_scripts.gpu_install install --rollout vllm     # what `make install-gpu ROLLOUT=vllm` runs
    python -m treetune_scripts.gpu_install check                      # what `make check-gpu-install` runs

:data:`STACKS` is the one place that names the versions: the torch each serving engine needs and the engine release
verl 0.7.1 tests (its CI images). ``pyproject.toml``'s ``vllm``/``sglang`` extras carry the same engine pins (a CPU
test compares them). flash-attn is installed the way verl's images do it, ``pip install --no-build-isolation
flash-attn==<pin>``, after torch: its ``setup.py`` imports torch and either downloads a prebuilt wheel matching
torch/CUDA/Python or compiles with ``nvcc``.

``check`` resolves each stack with ``pip install --dry-run --report`` for a throwaway, empty virtualenv (nothing is
installed) and fails when a stack does not resolve or resolves outside verl 0.7.1's declared requirements. It cannot
resolve flash-attn (an sdist whose metadata step needs torch and CUDA): it only checks that the pinned release is on
the index, and says so. When a serving engine is importable in the running environment it also imports verl's
rollout modules for it (vLLM's import on a CPU-only host, SGLang's only with a CUDA driver: sgl-kernel loads
libcuda). Exit status: 0 every stack passed; 1 a stack failed; 2 the package index could not be reached (never a
pass).

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
VERL_VERSION = (REPO_ROOT / "treetune_verl" / "VERL_VERSION").read_text().strip()
FLASH_ATTN = "flash-attn==2.8.1"  # what verl's vLLM image installs (--no-build-isolation)
#: Extras of this project installed on a GPU node next to the engine's own extra.
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


@dataclass(frozen=True)
class Stack:
    """One serving engine with the torch it needs.

    Attributes:
        rollout: ``actor_rollout_ref.rollout.name`` and the name of this project's extra.
        torch: the torch release the engine's wheel is built against.
        engine: the engine requirement, as in the extra.
        import_modules: verl's rollout modules for this engine (imported by the smoke check), then the recipe entry.
    """

    rollout: str
    torch: str
    engine: str
    import_modules: tuple[str, ...]

    @property
    def engine_name(self) -> str:
        return self.engine.split("==")[0]

    @property
    def project(self) -> str:
        """This project (its folder) with the engine's extra and :data:`PROJECT_EXTRAS`."""
        return f"{REPO_ROOT}[{','.join((self.rollout, *PROJECT_EXTRAS))}]"

    @property
    def requirements(self) -> list[str]:
        """What ``install`` asks pip for after torch: the engine pin and this project with its extras."""
        return [self.engine, self.project]


STACKS = {
    "vllm": Stack(
        rollout="vllm",
        torch="torch==2.9.0",
        engine="vllm==0.12.0",
        import_modules=(
            "verl.workers.rollout.vllm_rollout.vllm_async_server",
            "verl.workers.rollout.vllm_rollout.vllm_rollout",
            "treetune_recipe.cpo.main_cpo",
        ),
    ),
    "sglang": Stack(
        rollout="sglang",
        torch="torch==2.9.1",
        engine="sglang==0.5.6",
        import_modules=(
            "verl.workers.rollout.sglang_rollout.async_sglang_server",
            "verl.workers.rollout.sglang_rollout.sglang_rollout",
            "treetune_recipe.cpo.main_cpo",
        ),
    ),
}


def installed_torch_constraint() -> str:
    """``torch==<version>`` of the installed distribution (e.g. ``2.9.0``; ``torch.__version__`` would add ``+cu128``,
    a version no index serves, so pip could never satisfy the constraint). CLI: ``torch-constraint``."""
    return f"torch=={importlib.metadata.version('torch')}"


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


def flash_attn_hint(python: str) -> str:
    """What to do when flash-attn could not be installed, from the installed torch's CUDA and the local nvcc."""
    probe = "import sys, torch; print(torch.__version__, torch.version.cuda, sys.version_info[:2])"
    torch_info = _run([python, "-c", probe], capture_output=True).stdout.strip()
    nvcc = _nvcc_version()
    cuda = torch_info.split()[1] if len(torch_info.split()) > 1 else "?"
    if nvcc is None:
        return (
            f"No prebuilt {FLASH_ATTN} wheel matched this torch/CUDA/Python ({torch_info}) and nvcc was not found "
            f"(PATH, CUDA_HOME). Install the CUDA {cuda} toolkit (nvcc) and put it on PATH or set CUDA_HOME, then "
            f"rerun the same make install-gpu; or install a flash-attn wheel built for this torch with "
            f"`.venv/bin/pip install <wheel>` and rerun."
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


def install(rollout: str, python: str, constraint_file: Path) -> None:
    """Install ``rollout``'s stack into the environment of ``python`` (see :data:`STACKS`), step by step.

    Raises:
        InstallError: naming the step that failed and what to do.
    """
    stack = STACKS[rollout]
    steps = [
        (
            f"install {stack.torch}",
            _pip(python, "install", stack.torch),
            f"pip could not install {stack.torch}, the torch {stack.engine} is built against. On a CUDA node the "
            f"PyPI wheel works; for another CUDA build add its index, e.g. PIP_EXTRA_INDEX_URL=https://download."
            f"pytorch.org/whl/cu128.",
        ),
        None,  # write the constraint from the distribution just installed
        (
            "install build tools for flash-attn (wheel, packaging, ninja, psutil)",
            _pip(python, "install", "-c", str(constraint_file), "wheel", "packaging", "ninja", "psutil"),
            "pip could not install flash-attn's build tools; check the index is reachable.",
        ),
        (
            f"install {stack.engine} and this project [{rollout},{','.join(PROJECT_EXTRAS)}]",
            _pip(python, "install", "-c", str(constraint_file), stack.engine, "-e", stack.project),
            f"{stack.engine} with {stack.torch} and verl=={VERL_VERSION} did not install: run "
            f"`make check-gpu-install` to see whether the stack resolves from the index at all.",
        ),
        (
            f"install {FLASH_ATTN} (--no-build-isolation, against the installed torch)",
            _pip(python, "install", "-c", str(constraint_file), "--no-build-isolation", FLASH_ATTN),
            None,  # flash_attn_hint
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
        if _run(command).returncode != 0:
            raise InstallError(f"step '{title}' failed. {fix or flash_attn_hint(python)}")
    print(f"[install-gpu] done: {rollout} stack ({stack.torch}, {stack.engine}, {FLASH_ATTN}, verl=={VERL_VERSION})")


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
    """Resolve ``stack`` for an empty virtualenv with ``pip install --dry-run --report``.

    Returns:
        canonical name -> the report's ``metadata`` of each distribution pip would install.

    Raises:
        IndexUnreachable: the index could not be reached.
        RuntimeError: pip could not resolve the stack (its output's tail is in the message).
    """
    target = workdir / f"venv-{stack.rollout}"
    _run([python, "-m", "venv", "--without-pip", str(target)], check=True)
    constraint = workdir / f"constraint-{stack.rollout}.txt"
    constraint.write_text(stack.torch + "\n")
    report = workdir / f"report-{stack.rollout}.json"
    command = _pip(python, "--python", str(target / "bin" / "python"), "install", "--dry-run", "--ignore-installed")
    command += ["--retries", "2", "--timeout", "30", "--report", str(report), "-c", str(constraint)]
    command += [stack.torch, *stack.requirements]
    proc = _run(command, capture_output=True, env={**os.environ, "PIP_NO_INPUT": "1"})
    output = proc.stdout + proc.stderr
    _raise_if_unreachable(output)
    if proc.returncode != 0:
        tail = "\n".join(output.strip().splitlines()[-15:])
        raise RuntimeError(f"pip could not resolve the {stack.rollout} stack:\n{tail}")
    return {
        _canonical(item["metadata"]["name"]): item["metadata"] for item in json.loads(report.read_text())["install"]
    }


def pin_problems(stack: Stack, resolved: dict[str, dict]) -> list[str]:
    """Every way ``resolved`` leaves the stack's pins or verl's declared requirements (with the engine's extra)."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    problems = []
    versions = {name: Version(meta["version"]) for name, meta in resolved.items()}
    for pin in (stack.torch, stack.engine, f"verl=={VERL_VERSION}"):
        requirement = Requirement(pin)
        got = versions.get(_canonical(requirement.name))
        if got is None or not requirement.specifier.contains(got, prereleases=True):
            problems.append(f"{pin} expected, resolved {requirement.name}=={got}")
    verl_meta = resolved.get("verl")
    if verl_meta is None:
        return problems
    extras = {stack.rollout, ""}
    verl_extras = set(verl_meta.get("provides_extra", []))
    if stack.rollout not in verl_extras:
        problems.append(f"verl=={VERL_VERSION} declares no '{stack.rollout}' extra (has {sorted(verl_extras)})")
    for line in verl_meta.get("requires_dist", []):
        requirement = Requirement(line)
        if requirement.marker and not any(requirement.marker.evaluate({"extra": extra}) for extra in extras):
            continue
        got = versions.get(_canonical(requirement.name))
        if got is None:
            problems.append(f"verl requires {line!r}: not in the resolution")
        elif not requirement.specifier.contains(got, prereleases=True):
            problems.append(f"verl requires {line!r}: resolved {requirement.name}=={got}")
    return problems


def flash_attn_on_index(python: str) -> str:
    """Check that the pinned flash-attn release is served; returns the line to report."""
    name, version = FLASH_ATTN.split("==")
    proc = _run(_pip(python, "index", "versions", name, "--retries", "2", "--timeout", "30"), capture_output=True)
    output = proc.stdout + proc.stderr
    _raise_if_unreachable(output)
    match = re.search(r"Available versions: (.*)", output)
    available = [v.strip() for v in match.group(1).split(",")] if match else []
    if version not in available:
        raise RuntimeError(f"{FLASH_ATTN} is not on the index (available: {', '.join(available[:8]) or 'none'})")
    return (
        f"{FLASH_ATTN}: on the index (sdist). Not resolved here: its build needs torch and CUDA (prebuilt wheel or "
        f"nvcc), so only `make install-gpu` on a GPU node verifies it."
    )


def import_smoke(stack: Stack, python: str) -> str:
    """Import verl's rollout modules for the stack's engine when that engine is installed; returns the report line."""
    find = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({stack.engine_name!r}) is None)"
    if _run([python, "-c", find]).returncode != 0:
        return f"import smoke skipped: {stack.engine_name} is not installed in {python}"
    code = f"import importlib\nfor name in {stack.import_modules!r}:\n    importlib.import_module(name)\n"
    proc = _run([python, "-c", code], capture_output=True, cwd=REPO_ROOT)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-10:])
        raise RuntimeError(f"import smoke of {', '.join(stack.import_modules)} failed:\n{tail}")
    return f"import smoke passed: {', '.join(stack.import_modules)}"


def check_stack(stack: Stack, python: str, workdir: Path) -> tuple[str, list[str]]:
    """Resolve one stack, check its pins, run the import smoke; returns ``(status, report lines)``.

    ``status`` is ``"passed"``, ``"failed"`` or ``"unreachable"``.
    """
    start = time.monotonic()
    lines = [f"[check-gpu-install] {stack.rollout}: resolving {stack.torch} {' '.join(stack.requirements)}"]
    try:
        resolved = resolve(stack, python, workdir)
        problems = pin_problems(stack, resolved)
        key = ("torch", "torchvision", "torchaudio", stack.engine_name, "verl", "transformers", "tensordict", "ray")
        key += ("numpy", "triton", "flashinfer-python", "sgl-kernel", "xgrammar")
        versions = ", ".join(f"{n}=={resolved[n]['version']}" for n in key if n in resolved)
        lines.append(f"  resolved {len(resolved)} distributions in {time.monotonic() - start:.0f} s: {versions}")
        lines += [f"  FAIL {problem}" for problem in problems]
        lines.append(f"  {import_smoke(stack, python)}")
        return ("failed" if problems else "passed"), lines
    except IndexUnreachable as error:
        return "unreachable", [*lines, f"  INDEX UNREACHABLE (not a pass): {error}"]
    except RuntimeError as error:
        return "failed", [*lines, f"  FAIL {error}"]


def check(rollouts: list[str], python: str) -> int:
    """Resolve every stack in ``rollouts`` (concurrently); print one block per stack; return the exit status."""
    from concurrent.futures import ThreadPoolExecutor

    with tempfile.TemporaryDirectory(prefix="treetune-gpu-check-") as tmp:
        with ThreadPoolExecutor(max_workers=len(rollouts)) as pool:
            results = list(pool.map(lambda rollout: check_stack(STACKS[rollout], python, Path(tmp)), rollouts))
    try:
        results.append(("passed", [f"[check-gpu-install] {flash_attn_on_index(python)}"]))
    except IndexUnreachable as error:
        results.append(("unreachable", [f"[check-gpu-install] INDEX UNREACHABLE (not a pass): {error}"]))
    except RuntimeError as error:
        results.append(("failed", [f"[check-gpu-install] FAIL {error}"]))
    for _, lines in results:
        print("\n".join(lines))
    statuses = {status for status, _ in results}
    if "unreachable" in statuses:
        print("[check-gpu-install] the package index could not be reached: not every stack was verified (exit 2)")
        return 2
    failed = "failed" in statuses
    print(f"[check-gpu-install] {'FAILED' if failed else 'passed'}: {', '.join(rollouts)}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    inst = sub.add_parser("install", help="install one GPU stack into the environment of --python")
    inst.add_argument("--rollout", required=True, choices=sorted(STACKS))
    inst.add_argument("--python", default=sys.executable)
    inst.add_argument("--constraint-file", type=Path, default=REPO_ROOT / ".venv" / "torch-constraint.txt")
    sub.add_parser("torch-constraint", help="print torch==<installed distribution version>")
    chk = sub.add_parser("check", help="resolve every GPU stack in a throwaway environment")
    chk.add_argument("--rollout", action="append", choices=sorted(STACKS), help="default: every stack")
    chk.add_argument("--python", default=sys.executable)
    args = parser.parse_args(argv)
    if getattr(args, "python", None) and os.sep in args.python:
        args.python = os.path.abspath(args.python)  # steps run with the repository as working directory
    if args.command == "torch-constraint":
        print(installed_torch_constraint())
        return 0
    if args.command == "install":
        try:
            install(args.rollout, args.python, args.constraint_file)
        except InstallError as error:
            print(f"[install-gpu] {error}", file=sys.stderr)
            return 1
        return 0
    return check(args.rollout or sorted(STACKS), args.python)


if __name__ == "__main__":
    sys.exit(main())
