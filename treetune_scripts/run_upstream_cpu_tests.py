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
"""Run upstream verl's own CPU tests with and without this overlay loaded, and list the tests whose outcome differs.

The tests come from the release sdist (``pip download --no-deps --no-binary :all: verl==<release>``), unpacked under
``.cache/upstream_tests/verl-<release>/``; they are the ``tests/**/test_*_on_cpu.py`` files. Pytest runs them twice, in
subprocesses of this interpreter, from the sdist root but against the *installed* verl (``PYTHONSAFEPATH=1`` keeps the
sdist's ``verl/`` folder off ``sys.path`` in the test processes and their children; ``--import-mode=importlib``; the
script checks where ``verl`` is imported from before each run). Each run gets its own ``RAY_TMPDIR``, so the tests'
``ray.init(num_cpus=...)`` start their own cluster instead of attaching to another job's Ray cluster on the host:

1. ``alone``: ``VERL_USE_EXTERNAL_PLUGINS=none`` and no ``VERL_USE_EXTERNAL_MODULES`` (upstream verl only);
2. ``overlay``: ``VERL_USE_EXTERNAL_MODULES=treetune_verl.cpu_backend``, plugins on (the CPU platform is selected).

Each run writes a JUnit XML file; the outcomes (passed / failed / error / skipped) are compared per test id. Prints
per-file counts of both runs, every test whose outcome differs, a summary line, and writes a JSON report. Exit status:
0 when no test differs, 1 when some do, 2 when the comparison could not be set up.

    python -m treetune_scripts.run_upstream_cpu_tests [--verl 0.9.1] [--files 'tests/trainer/*'] \\
        [--timeout 300] [--run-timeout 1200] [--output outputs/upstream_cpu_tests/report.json]
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from importlib import metadata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CACHE = REPO_ROOT / ".cache" / "upstream_tests"
DEFAULT_OUTPUT = REPO_ROOT / "outputs" / "upstream_cpu_tests" / "report.json"
TEST_GLOB = "tests/**/test_*_on_cpu.py"
BACKEND_MODULE = "treetune_verl.cpu_backend"

#: The two runs, in order: name -> environment changes (``None`` removes the variable).
RUNS: dict[str, dict[str, str | None]] = {
    "alone": {"VERL_USE_EXTERNAL_PLUGINS": "none", "VERL_USE_EXTERNAL_MODULES": None},
    "overlay": {"VERL_USE_EXTERNAL_PLUGINS": None, "VERL_USE_EXTERNAL_MODULES": BACKEND_MODULE},
}
OUTCOMES = ("passed", "failed", "error", "skipped")
#: Outcome of a test absent from a run's JUnit file (not collected, or the run was cut off).
MISSING = "missing"
#: When a test has several JUnit entries (a failed call and a teardown error), the first outcome here wins.
_PRIORITY = ("failed", "error", "skipped", "passed")

_PROBE = (
    "import json, verl; from verl.utils.device import get_device_name; "
    "print(json.dumps({'verl_file': verl.__file__, 'verl_version': verl.__version__, 'device': get_device_name()}))"
)


# ----------------------------------------------------------------------------------------------------------- sdist
def fetch_sdist(release: str, cache_dir: Path) -> Path:
    """Download (once) and unpack (once) the verl ``release`` sdist under ``cache_dir``; returns the unpacked root."""
    root = cache_dir / f"verl-{release}"
    if (root / ".unpacked").is_file():
        return root
    cache_dir.mkdir(parents=True, exist_ok=True)
    archive = cache_dir / f"verl-{release}.tar.gz"
    if not archive.is_file():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        cmd += [f"verl=={release}", "-d", str(cache_dir)]
        subprocess.run(cmd, check=True)
    if not archive.is_file():
        raise FileNotFoundError(f"pip download did not leave {archive}")
    staging = cache_dir / f".unpack-{release}-{os.getpid()}"
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(staging, filter="data")
        else:  # pragma: no cover - Python without PEP 706
            tar.extractall(staging)
    unpacked = staging / f"verl-{release}"
    if not unpacked.is_dir():
        raise FileNotFoundError(f"{archive} has no top folder verl-{release}/")
    if root.exists():  # a half-unpacked leftover
        shutil.rmtree(root)
    unpacked.rename(root)
    staging.rmdir()
    (root / ".unpacked").write_text(f"{archive.name}\n")
    return root


def collect_test_files(root: Path, patterns: list[str] | None = None) -> list[str]:
    """The ``tests/**/test_*_on_cpu.py`` files under ``root`` as POSIX paths; with patterns, the matching ones."""
    files = sorted(p.relative_to(root).as_posix() for p in root.glob(TEST_GLOB) if p.is_file())
    if patterns:
        files = [
            f for f in files if any(fnmatch.fnmatch(f, pat) or fnmatch.fnmatch(Path(f).name, pat) for pat in patterns)
        ]
    return files


# ------------------------------------------------------------------------------------------------------------ runs
def run_env(name: str, base: dict[str, str] | None = None, ray_tmpdir: str | None = None) -> dict[str, str]:
    """Environment of run ``name``: ``base`` (default ``os.environ``), the run's changes and ``PYTHONSAFEPATH=1``.

    ``ray_tmpdir`` becomes ``RAY_TMPDIR``: a plain ``ray.init(num_cpus=...)`` attaches to (and then fails on) any Ray
    cluster whose address file sits in the shared ``/tmp/ray``, such as one another job on the host started with
    ``ray start`` or ``ray.cluster_utils.Cluster``; a private temp dir keeps each run on its own cluster.
    """
    env = dict(os.environ if base is None else base)
    env.pop("VERL_PLATFORM", None)  # let verl's auto-detection choose, as a user would get it
    env.pop("PYTHONPATH", None)
    env.pop("RAY_ADDRESS", None)
    env["PYTHONSAFEPATH"] = "1"  # the cwd (the sdist root, which holds verl/) stays off sys.path, also in children
    if ray_tmpdir is not None:
        env["RAY_TMPDIR"] = ray_tmpdir
    for key, value in RUNS[name].items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def probe_verl(root: Path, env: dict[str, str]) -> dict[str, str]:
    """Where ``import verl`` resolves from ``root`` in ``env``, its version and verl's device there."""
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"probe failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def pytest_command(root: Path, files: list[str], junit: Path, timeout: int) -> list[str]:
    """The pytest command line of one run (cwd: ``root``)."""
    return [
        sys.executable,
        "-m",
        "pytest",
        *files,
        f"--rootdir={root}",
        f"--confcutdir={root}",
        "-c",
        str(root / "pyproject.toml"),  # no [tool.pytest] there: keeps this repo's pytest settings out
        "--import-mode=importlib",
        "--continue-on-collection-errors",  # a file that cannot be imported is reported, the others still run
        "-p",
        "no:cacheprovider",
        "-o",
        "junit_family=xunit1",  # adds the file attribute to each testcase
        f"--junitxml={junit}",
        f"--timeout={timeout}",
        "--durations=20",
        "-rfE",
        "-v",
    ]


def run_pytest(cmd: list[str], cwd: Path, env: dict[str, str], log: Path, wall_limit: float) -> dict:
    """Run ``cmd`` with its output in ``log``; past ``wall_limit`` seconds, interrupt it (pytest still writes JUnit)."""
    start = time.monotonic()
    timed_out = False
    with open(log, "w", encoding="utf-8") as fh:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=wall_limit)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return {"returncode": proc.returncode, "wall_s": round(time.monotonic() - start, 1), "timed_out": timed_out}


# ----------------------------------------------------------------------------------------------------------- junit
def case_id(classname: str, name: str, file: str | None = None) -> tuple[str, str]:
    """``(test id, test file)`` of a JUnit testcase; the id reads like a pytest node id when ``file`` is known."""
    if file and file.endswith(".py"):
        module = file[: -len(".py")].replace("/", ".")
        if classname == module:
            return f"{file}::{name}", file
        if classname.startswith(module + "."):
            return f"{file}::{classname[len(module) + 1 :].replace('.', '::')}::{name}", file
        if not classname and name == module:  # a collection error of the whole file
            return file, file
        return f"{file}::{classname}::{name}" if classname else f"{file}::{name}", file
    dotted = f"{classname}.{name}" if classname else name
    return dotted, (classname or name)


def _first_lines(text: str, n: int = 6, width: int = 300) -> str:
    lines = [line[:width] for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[:n])


def parse_junit(path: Path) -> dict[str, dict]:
    """Outcome of every testcase of a pytest JUnit XML file: ``{test id: {outcome, file, time, message}}``."""
    results: dict[str, dict] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        tid, file = case_id(case.get("classname", ""), case.get("name", ""), case.get("file"))
        outcome, message = "passed", ""
        for tag, label in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            node = case.find(tag)
            if node is not None:
                outcome = label
                message = node.get("message") or ""
                body = (node.text or "").strip()
                if body and label != "skipped":
                    message = f"{message}\n{body}" if message else body
                break
        entry = {"outcome": outcome, "file": file, "time": float(case.get("time") or 0.0), "message": message}
        previous = results.get(tid)
        if previous is not None:  # a second entry for the same test (e.g. call failed, then teardown errored)
            entry["time"] += previous["time"]
            if _PRIORITY.index(previous["outcome"]) <= _PRIORITY.index(outcome):
                entry.update(outcome=previous["outcome"], message=previous["message"])
        results[tid] = entry
    return results


def count_by_file(results: dict[str, dict]) -> dict[str, dict]:
    """Per test file: the number of tests of each outcome and their summed time."""
    by_file: dict[str, dict] = {}
    for entry in results.values():
        row = by_file.setdefault(entry["file"], {**dict.fromkeys(OUTCOMES, 0), "time_s": 0.0})
        row[entry["outcome"]] += 1
        row["time_s"] = round(row["time_s"] + entry["time"], 2)
    return by_file


def totals(results: dict[str, dict]) -> dict[str, int]:
    counts = Counter(entry["outcome"] for entry in results.values())
    return {outcome: counts.get(outcome, 0) for outcome in OUTCOMES}


def diff_outcomes(alone: dict[str, dict], overlay: dict[str, dict]) -> list[dict]:
    """The tests whose outcome differs between the two runs (absent from one run: ``missing``), sorted by id."""
    diffs = []
    for tid in sorted(set(alone) | set(overlay)):
        a, o = alone.get(tid), overlay.get(tid)
        out_a, out_o = (a or {}).get("outcome", MISSING), (o or {}).get("outcome", MISSING)
        if out_a != out_o:
            diffs.append(
                {
                    "test": tid,
                    "file": (a or o)["file"],
                    "alone": out_a,
                    "overlay": out_o,
                    "alone_message": (a or {}).get("message", ""),
                    "overlay_message": (o or {}).get("message", ""),
                }
            )
    return diffs


# ----------------------------------------------------------------------------------------------------------- table
def format_report(files: list[str], counts: dict[str, dict[str, dict]], diffs: list[dict]) -> str:
    """Per-file counts of both runs (p/f/e/s and seconds), then every differing test with its message's first lines."""
    names = list(RUNS)
    width = max([len(f) for f in files] + [len("file")])
    head = f"{'file':<{width}}  " + "  ".join(f"{n + ' p/f/e/s (s)':>26}" for n in names)
    lines = [head, "-" * len(head)]
    for f in sorted(set(files) | {k for run in counts.values() for k in run}):
        cells = []
        for n in names:
            row = counts.get(n, {}).get(f)
            if row is None:
                cells.append(f"{'-':>26}")
            else:
                cell = "/".join(str(row[o]) for o in OUTCOMES) + " ({:.1f})".format(row["time_s"])
                cells.append(f"{cell:>26}")
        lines.append(f"{f:<{width}}  " + "  ".join(cells))
    lines.append("")
    if diffs:
        lines.append(f"{len(diffs)} test(s) whose outcome differs (test, alone, overlay):")
        for d in diffs:
            lines.append(f"  {d['test']}  alone={d['alone']}  overlay={d['overlay']}")
            for n in names:
                if d[n] in ("failed", "error") and d[f"{n}_message"]:
                    lines.extend(f"      [{n}] {line}" for line in _first_lines(d[f"{n}_message"]).splitlines())
    else:
        lines.append("No test differs between the two runs.")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verl", default=None, help="verl release whose sdist tests to run (default: installed verl)")
    parser.add_argument("--files", nargs="*", default=None, help="globs on tests/... paths or file names (subset)")
    parser.add_argument("--timeout", type=int, default=300, help="per-test timeout in seconds (pytest-timeout)")
    parser.add_argument("--run-timeout", type=float, default=1200, help="wall-clock limit of each pytest run, seconds")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON report (logs and JUnit files beside)")
    return parser.parse_args(argv)


def _one_run(
    name: str,
    root: Path,
    files: list[str],
    out_dir: Path,
    ray_tmpdir: str,
    args: argparse.Namespace,
    report: dict,
    results: dict[str, dict[str, dict]],
) -> int:
    """Probe, then run pytest for run ``name``; fills ``report`` and ``results``. Returns 0, or 2 on setup failure."""
    env = run_env(name, ray_tmpdir=ray_tmpdir)
    try:
        probe = probe_verl(root, env)
    except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
        print(f"setup failure: probing verl for run {name!r}: {exc}", file=sys.stderr)
        return 2
    if Path(probe["verl_file"]).resolve().is_relative_to(root):
        print(f"setup failure: run {name!r} would import the sdist's verl ({probe['verl_file']})", file=sys.stderr)
        return 2
    if report["verl_release"] != probe["verl_version"]:
        print(
            f"note: installed verl is {probe['verl_version']}, the tests are from {report['verl_release']}", flush=True
        )
    junit, log = out_dir / f"{name}.junit.xml", out_dir / f"{name}.log"
    junit.unlink(missing_ok=True)
    cmd = pytest_command(root, files, junit, args.timeout)
    print(f"[{name}] verl={probe['verl_file']} device={probe['device']}; pytest log: {log}", flush=True)
    run = run_pytest(cmd, root, env, log, args.run_timeout)
    print(
        f"[{name}] pytest exit {run['returncode']} in {run['wall_s']:.0f}s"
        + (" (wall-clock limit hit)" if run["timed_out"] else ""),
        flush=True,
    )
    report["runs"][name] = {"env": dict(RUNS[name]), "probe": probe, "command": cmd, "log": str(log), **run}
    if not junit.is_file():
        print(f"setup failure: run {name!r} wrote no JUnit file (see {log})", file=sys.stderr)
        return 2
    results[name] = parse_junit(junit)
    report["runs"][name].update(junit=str(junit), totals=totals(results[name]))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    release = args.verl or metadata.version("verl")
    out_dir = args.output.resolve().parent
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        root = fetch_sdist(release, args.cache_dir.resolve())
    except (subprocess.CalledProcessError, OSError, tarfile.TarError) as exc:
        print(f"setup failure: cannot get the verl {release} sdist: {exc}", file=sys.stderr)
        return 2
    files = collect_test_files(root, args.files)
    if not files:
        print(f"setup failure: no {TEST_GLOB} file under {root} matches {args.files}", file=sys.stderr)
        return 2
    print(f"verl {release} sdist: {root}\n{len(files)} test file(s)", flush=True)

    report: dict = {"verl_release": release, "sdist_root": str(root), "files": files, "runs": {}}
    results: dict[str, dict[str, dict]] = {}
    for name in RUNS:
        ray_tmpdir = tempfile.mkdtemp(prefix=f"rut-{name}-")  # short: Ray puts unix sockets under it
        try:
            code = _one_run(name, root, files, out_dir, ray_tmpdir, args, report, results)
        finally:
            shutil.rmtree(ray_tmpdir, ignore_errors=True)
        if code:
            if report["runs"]:
                args.output.write_text(json.dumps(report, indent=2) + "\n")
            return code

    counts = {name: count_by_file(res) for name, res in results.items()}
    diffs = diff_outcomes(results["alone"], results["overlay"])
    print()
    print(format_report(files, counts, diffs))
    summary = "; ".join(
        f"{name}: "
        + ", ".join(f"{v} {k}" for k, v in report["runs"][name]["totals"].items())
        + f" in {report['runs'][name]['wall_s']:.0f}s"
        for name in RUNS
    )
    print(f"\nsummary: {len(diffs)} differing test(s) | {summary}")
    report.update(
        per_file=counts,
        differences=diffs,
        outcomes={
            tid: {name: results[name].get(tid, {}).get("outcome", MISSING) for name in RUNS}
            for tid in sorted(set(results["alone"]) | set(results["overlay"]))
        },
    )
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"report: {args.output}")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
