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
"""Run upstream verl's own CPU tests alone and with verl-cpu loaded, and list the tests whose outcome differs.

The tests come from the release sdist (``pip download --no-deps --no-binary :all: verl==<release>``), unpacked under
``.cache/upstream_tests/verl-<release>/``; they are the ``tests/**/test_*_on_cpu.py`` files. Pytest runs them twice, in
subprocesses of this interpreter, from the sdist root but against the *installed* verl (``PYTHONSAFEPATH=1`` keeps the
sdist's ``verl/`` folder off ``sys.path`` in the test processes and their children; ``--import-mode=importlib``).
Before any test runs, a probe per run checks that ``verl`` (and, for the second run, verl-cpu) imports in that run's
environment and not from the sdist, so a missing verl-cpu stops the script at once. Each run gets its own
``RAY_TMPDIR``, so the tests' ``ray.init(num_cpus=...)`` start their own cluster instead of attaching to another job's:

1. ``alone``: upstream verl alone (``VERL_USE_EXTERNAL_PLUGINS=none``, no ``VERL_USE_EXTERNAL_MODULES``);
2. ``verl_cpu``: upstream verl with verl-cpu (``VERL_USE_EXTERNAL_MODULES=verl_cpu.activate`` in every process,
   plugins on, so on verl 0.9.1 the CPU platform is selected).

Each run writes a JUnit XML file; the outcomes (passed / failed / error / skipped, ``missing`` when a run has no entry
for the test) are compared per test id. Prints per-file counts of both runs, every test whose outcome differs and a
summary line, and writes a JSON report (default ``outputs/upstream_cpu_tests/verl-<release>/report.json``, with the
logs and JUnit files beside it). Exit status: 0 when no test differs, 1 when some do, 2 when the comparison could not
be set up. ``make upstream-cpu-tests [VERL=0.7.1] [ARGS="..."]`` runs it in the release's environment.

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
DEFAULT_OUTPUT_DIR = REPO_ROOT / "outputs" / "upstream_cpu_tests"
TEST_GLOB = "tests/**/test_*_on_cpu.py"
BACKEND_MODULE = "verl_cpu.activate"

#: The two runs, in order: name -> environment changes (``None`` removes the variable).
RUNS: dict[str, dict[str, str | None]] = {
    "alone": {"VERL_USE_EXTERNAL_PLUGINS": "none", "VERL_USE_EXTERNAL_MODULES": None},
    "verl_cpu": {"VERL_USE_EXTERNAL_PLUGINS": None, "VERL_USE_EXTERNAL_MODULES": BACKEND_MODULE},
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


class SetupError(RuntimeError):
    """The comparison cannot be set up (exit status 2)."""


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
def run_env(
    changes: dict[str, str | None], base: dict[str, str] | None = None, ray_tmpdir: str | None = None
) -> dict[str, str]:
    """Environment of one run: ``base`` (default ``os.environ``), ``changes`` and ``PYTHONSAFEPATH=1``.

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
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def probe_verl(name: str, root: Path, env: dict[str, str]) -> dict[str, str]:
    """Import verl from ``root`` in ``env`` (which loads ``VERL_USE_EXTERNAL_MODULES``); where from, version, device.

    Raises :class:`SetupError` when the import fails or resolves to the ``verl/`` folder under ``root``.
    """
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE], cwd=root, env=env, capture_output=True, text=True, timeout=300
        )
    except subprocess.TimeoutExpired as exc:
        raise SetupError(f"run {name!r}: importing verl took over {exc.timeout:.0f}s") from exc
    if out.returncode != 0:
        modules = env.get("VERL_USE_EXTERNAL_MODULES")
        hint = f" (VERL_USE_EXTERNAL_MODULES={modules}: is it installed here?)" if modules else ""
        raise SetupError(f"run {name!r}: importing verl failed{hint}:\n{out.stderr[-3000:]}")
    try:
        probe = json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError) as exc:
        raise SetupError(f"run {name!r}: unreadable probe output {out.stdout[-500:]!r}") from exc
    if Path(probe["verl_file"]).resolve().is_relative_to(root.resolve()):
        raise SetupError(f"run {name!r} would import the sdist's verl ({probe['verl_file']})")
    return probe


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


# ------------------------------------------------------------------------------------------------------ comparison
def count_by_file(results: dict[str, dict]) -> dict[str, dict]:
    """Per test file: the number of tests of each outcome and their summed time."""
    by_file: dict[str, dict] = {}
    for entry in results.values():
        row = by_file.setdefault(entry["file"], {**dict.fromkeys(OUTCOMES, 0), "time_s": 0.0})
        row[entry["outcome"]] += 1
        row["time_s"] = round(row["time_s"] + entry["time"], 2)
    return by_file


def totals(results: dict[str, dict]) -> dict[str, int]:
    """The number of tests of each outcome in one run."""
    counts = Counter(entry["outcome"] for entry in results.values())
    return {outcome: counts.get(outcome, 0) for outcome in OUTCOMES}


def outcome_table(results: dict[str, dict[str, dict]]) -> dict[str, dict[str, str]]:
    """``{test id: {run name: outcome}}`` over every test of every run (``missing`` where a run lacks it)."""
    test_ids = sorted(set().union(*results.values()))
    return {tid: {name: res.get(tid, {}).get("outcome", MISSING) for name, res in results.items()} for tid in test_ids}


def diff_outcomes(results: dict[str, dict[str, dict]]) -> list[dict]:
    """The tests whose outcome is not the same in every run, sorted by id: ``{test, file, outcome, message}``."""
    diffs = []
    for tid, outcomes in outcome_table(results).items():
        if len(set(outcomes.values())) > 1:
            file = next(res[tid]["file"] for res in results.values() if tid in res)
            messages = {name: res.get(tid, {}).get("message", "") for name, res in results.items()}
            diffs.append({"test": tid, "file": file, "outcome": outcomes, "message": messages})
    return diffs


def format_report(files: list[str], counts: dict[str, dict[str, dict]], diffs: list[dict]) -> str:
    """Per-file counts of every run (p/f/e/s and seconds), then every differing test with its message's first lines."""
    names = list(counts)
    width = max([len(f) for f in files] + [len("file")])
    head = f"{'file':<{width}}  " + "  ".join(f"{n + ' p/f/e/s (s)':>26}" for n in names)
    lines = [head, "-" * len(head)]
    for f in sorted(set(files) | {k for run in counts.values() for k in run}):
        cells = []
        for n in names:
            row = counts[n].get(f)
            cell = "-" if row is None else "/".join(str(row[o]) for o in OUTCOMES) + f" ({row['time_s']:.1f})"
            cells.append(f"{cell:>26}")
        lines.append(f"{f:<{width}}  " + "  ".join(cells))
    lines.append("")
    if diffs:
        lines.append(f"{len(diffs)} test(s) whose outcome differs (test, {', '.join(names)}):")
        for d in diffs:
            lines.append(f"  {d['test']}  " + "  ".join(f"{n}={d['outcome'][n]}" for n in names))
            for n in names:
                if d["outcome"][n] in ("failed", "error") and d["message"][n]:
                    lines.extend(f"      [{n}] {line}" for line in _first_lines(d["message"][n]).splitlines())
    else:
        lines.append("No test differs between the runs.")
    return "\n".join(lines)


def _run_tests(
    name: str,
    changes: dict[str, str | None],
    root: Path,
    files: list[str],
    out_dir: Path,
    per_test_timeout: int,
    run_timeout: float,
    report: dict,
) -> dict[str, dict]:
    """One pytest run of ``files`` in run ``name``'s environment; records it in ``report``, returns its outcomes."""
    junit, log = out_dir / f"{name}.junit.xml", out_dir / f"{name}.log"
    junit.unlink(missing_ok=True)
    cmd = pytest_command(root, files, junit, per_test_timeout)
    print(f"[{name}] running pytest; log: {log}", flush=True)
    ray_tmpdir = tempfile.mkdtemp(prefix=f"rut-{name}-")  # short: Ray puts unix sockets under it
    try:
        run = run_pytest(cmd, root, run_env(changes, ray_tmpdir=ray_tmpdir), log, run_timeout)
    finally:
        shutil.rmtree(ray_tmpdir, ignore_errors=True)
    cut_off = " (wall-clock limit hit)" if run["timed_out"] else ""
    print(f"[{name}] pytest exit {run['returncode']} in {run['wall_s']:.0f}s{cut_off}", flush=True)
    record = report["runs"].setdefault(name, {"env": dict(changes)})
    record.update(command=cmd, log=str(log), **run)
    try:
        results = parse_junit(junit)
    except (OSError, ET.ParseError) as exc:
        raise SetupError(f"run {name!r} left no readable JUnit file ({exc}; see {log})") from exc
    record.update(junit=str(junit), totals=totals(results))
    return results


def _finish(report: dict, output: Path, status: int, setup_error: str | None = None) -> int:
    """Write ``report`` with its exit status (and setup error) to ``output``; returns ``status``."""
    report.update(exit_status=status, setup_error=setup_error)
    output.write_text(json.dumps(report, indent=2) + "\n")
    if setup_error:
        print(f"setup failure: {setup_error}", file=sys.stderr)
    print(f"report: {output}", flush=True)
    return status


def compare_runs(
    root: Path,
    files: list[str],
    runs: dict[str, dict[str, str | None]],
    output: Path,
    per_test_timeout: int = 300,
    run_timeout: float = 1200,
    verl_release: str | None = None,
) -> int:
    """Run pytest on ``files`` (under ``root``) once per entry of ``runs`` and compare the outcomes per test.

    ``runs`` maps a run name to its environment changes (see :func:`run_env`). With ``verl_release``, every run's
    environment is first probed (:func:`probe_verl`) before any test runs. Prints the table and a summary, writes the
    JSON report ``output`` (logs and JUnit files beside it) and returns the exit status: 0 when no test differs, 1
    when some do, 2 when the comparison could not be set up (the report then holds ``setup_error``).
    """
    out_dir = output.resolve().parent
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict = {"verl_release": verl_release, "test_root": str(root), "files": files, "runs": {}}

    try:
        if verl_release is not None:
            for name, changes in runs.items():
                probe = probe_verl(name, root, run_env(changes))
                report["runs"][name] = {"env": dict(changes), "probe": probe}
                print(f"[{name}] verl {probe['verl_version']} from {probe['verl_file']}, device {probe['device']}")
        results = {}
        for name, changes in runs.items():
            results[name] = _run_tests(name, changes, root, files, out_dir, per_test_timeout, run_timeout, report)
    except SetupError as exc:
        return _finish(report, output, 2, str(exc))

    counts = {name: count_by_file(res) for name, res in results.items()}
    diffs = diff_outcomes(results)
    print()
    print(format_report(files, counts, diffs))
    summary = "; ".join(
        f"{name}: " + ", ".join(f"{v} {k}" for k, v in run["totals"].items()) + f" in {run['wall_s']:.0f}s"
        for name, run in report["runs"].items()
    )
    print(f"\nsummary: {len(diffs)} differing test(s) | {summary}")
    report.update(per_file=counts, differences=diffs, outcomes=outcome_table(results))
    return _finish(report, output, 1 if diffs else 0)


# ------------------------------------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verl", default=None, help="verl release whose sdist tests to run (default: installed verl)")
    parser.add_argument("--files", nargs="*", default=None, help="globs on tests/... paths or file names (subset)")
    parser.add_argument("--timeout", type=int, default=300, help="per-test timeout in seconds (pytest-timeout)")
    parser.add_argument("--run-timeout", type=float, default=1200, help="wall-clock limit of each pytest run, seconds")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help="where the sdists are kept")
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="JSON report, with logs and JUnit files beside it (default: outputs/upstream_cpu_tests/verl-<release>/)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    release = args.verl or metadata.version("verl")
    output = args.output or DEFAULT_OUTPUT_DIR / f"verl-{release}" / "report.json"
    try:
        root = fetch_sdist(release, args.cache_dir.resolve())
    except (subprocess.CalledProcessError, OSError, tarfile.TarError) as exc:
        print(f"setup failure: cannot get the verl {release} sdist: {exc}", file=sys.stderr)
        return 2
    files = collect_test_files(root, args.files)
    if not files:
        print(f"setup failure: no {TEST_GLOB} file under {root} matches {args.files}", file=sys.stderr)
        return 2
    print(f"verl {release} sdist: {root}\n{len(files)} test file(s); runs: {', '.join(RUNS)}", flush=True)
    return compare_runs(root, files, RUNS, output, args.timeout, args.run_timeout, verl_release=release)


if __name__ == "__main__":
    sys.exit(main())
