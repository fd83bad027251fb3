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
"""``treetune_scripts.run_upstream_cpu_tests`` on real pytest runs of a small synthetic test tree.

The tree stands in for the verl sdist: its tests pass, fail, error, skip, and some of them depend on one environment
variable. ``compare_runs`` runs them in real pytest subprocesses (real JUnit XML) for two environments; only the
environment-dependent tests may be reported. About 3 s for the pytest runs, 3 s for the verl import of the probe test.

python -m pytest -q treetune_tests/treetune_scripts/test_run_upstream_cpu_tests_on_cpu.py
"""

import json
import textwrap

import pytest

from treetune_scripts import run_upstream_cpu_tests as rut

FLAG = "RUT_SYNTHETIC_FLAG"
STABLE = "tests/test_stable_on_cpu.py"
FLAGGED = "tests/sub/test_flag_on_cpu.py"
IMPORT = "tests/sub/test_import_on_cpu.py"

TREE = {
    "pyproject.toml": '[project]\nname = "synthetic"\n',
    STABLE: """
        import pytest


        @pytest.fixture
        def broken_fixture():
            raise KeyError("fixture setup fails")


        @pytest.fixture
        def broken_teardown():
            yield
            raise RuntimeError("teardown fails")


        def test_passes():
            assert True


        @pytest.mark.parametrize("n", [1, 2])
        def test_param(n):
            assert n > 0


        class TestGroup:
            def test_skipped(self):
                pytest.skip("not on this host")


        def test_fixture_error(broken_fixture):
            pass


        def test_fails_then_teardown_errors(broken_teardown):
            assert False, "the call fails"
        """,
    FLAGGED: f"""
        import os


        def test_fails_when_flag_set():
            assert os.environ.get("{FLAG}") is None, "the flag is set"


        def test_ignores_flag():
            pass
        """,
    IMPORT: f"""
        import os

        if os.environ.get("{FLAG}"):
            raise ImportError("cannot import with the flag set")


        def test_imported():
            pass
        """,
    # Not CPU test files: never collected.
    "tests/test_on_gpu.py": "def test_never_collected():\n    raise AssertionError\n",
    "tests/helper_on_cpu.py": "raise ImportError\n",
}

#: The tests whose outcome does not depend on the flag: the same in both runs.
STABLE_OUTCOMES = {
    f"{STABLE}::TestGroup::test_skipped": "skipped",
    f"{STABLE}::test_fails_then_teardown_errors": "failed",  # the call failure wins over the teardown error
    f"{STABLE}::test_fixture_error": "error",
    f"{STABLE}::test_param[1]": "passed",
    f"{STABLE}::test_param[2]": "passed",
    f"{STABLE}::test_passes": "passed",
    f"{FLAGGED}::test_ignores_flag": "passed",
}
FLAG_DEPENDENT = {  # test id -> (outcome without the flag, outcome with it)
    f"{FLAGGED}::test_fails_when_flag_set": ("passed", "failed"),
    IMPORT: ("missing", "error"),  # the file's collection error
    f"{IMPORT}::test_imported": ("passed", "missing"),
}


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """The synthetic test tree under ``tmp_path/root``; the flag is unset in this process."""
    monkeypatch.delenv(FLAG, raising=False)
    root = tmp_path / "root"
    for rel, text in TREE.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return root


def test_reports_exactly_the_tests_whose_outcome_depends_on_the_environment(tree, tmp_path, capsys):
    files = rut.collect_test_files(tree)
    assert files == [FLAGGED, IMPORT, STABLE]
    output = tmp_path / "out" / "report.json"
    runs = {"plain": {FLAG: None}, "flagged": {FLAG: "1"}}

    status = rut.compare_runs(tree, files, runs, output, per_test_timeout=60, run_timeout=120)

    report = json.loads(output.read_text())
    assert status == 1 and report["exit_status"] == 1 and report["setup_error"] is None
    expected = {tid: {"plain": o, "flagged": o} for tid, o in STABLE_OUTCOMES.items()}
    expected |= {tid: {"plain": a, "flagged": b} for tid, (a, b) in FLAG_DEPENDENT.items()}
    assert report["outcomes"] == dict(sorted(expected.items()))
    diffs = {d["test"]: d for d in report["differences"]}
    assert {tid: (d["outcome"]["plain"], d["outcome"]["flagged"]) for tid, d in diffs.items()} == FLAG_DEPENDENT
    assert [d["test"] for d in report["differences"]] == sorted(FLAG_DEPENDENT)
    assert diffs[IMPORT]["file"] == IMPORT and diffs[f"{IMPORT}::test_imported"]["file"] == IMPORT
    flagged_failure = diffs[f"{FLAGGED}::test_fails_when_flag_set"]["message"]
    assert flagged_failure["plain"] == "" and "the flag is set" in flagged_failure["flagged"]
    assert "cannot import with the flag set" in diffs[IMPORT]["message"]["flagged"]

    plain, flagged = report["runs"]["plain"], report["runs"]["flagged"]
    assert plain["totals"] == {"passed": 6, "failed": 1, "error": 1, "skipped": 1}
    assert flagged["totals"] == {"passed": 4, "failed": 2, "error": 2, "skipped": 1}
    assert plain["env"] == {FLAG: None} and flagged["env"] == {FLAG: "1"}
    assert plain["returncode"] == 1 and not plain["timed_out"]
    per_file = {
        run: {f: [row[o] for o in rut.OUTCOMES] for f, row in rows.items()} for run, rows in report["per_file"].items()
    }
    assert per_file == {
        "plain": {STABLE: [3, 1, 1, 1], FLAGGED: [2, 0, 0, 0], IMPORT: [1, 0, 0, 0]},
        "flagged": {STABLE: [3, 1, 1, 1], FLAGGED: [1, 1, 0, 0], IMPORT: [0, 0, 1, 0]},
    }
    assert (output.parent / "flagged.junit.xml").is_file() and (output.parent / "plain.log").is_file()

    printed = capsys.readouterr().out
    assert "3 test(s) whose outcome differs (test, plain, flagged):" in printed
    assert f"{FLAGGED}::test_fails_when_flag_set  plain=passed  flagged=failed" in printed
    assert "[flagged] AssertionError: the flag is set" in printed
    assert "summary: 3 differing test(s) | plain: 6 passed, 1 failed, 1 error, 1 skipped" in printed


def test_same_environment_twice_reports_nothing(tree, tmp_path, capsys):
    output = tmp_path / "report.json"
    runs = {"first": {}, "second": {FLAG: None}}
    status = rut.compare_runs(tree, [STABLE, FLAGGED], runs, output, per_test_timeout=60, run_timeout=120)
    report = json.loads(output.read_text())
    assert status == 0 and report["exit_status"] == 0 and report["differences"] == []
    assert report["outcomes"][f"{FLAGGED}::test_fails_when_flag_set"] == {"first": "passed", "second": "passed"}
    assert "No test differs between the runs." in capsys.readouterr().out


def test_unimportable_module_stops_before_any_test_runs(tree, tmp_path):
    """The probe imports verl with the run's ``VERL_USE_EXTERNAL_MODULES``, as verl-cpu's run does."""
    output = tmp_path / "report.json"
    runs = {"broken": {"VERL_USE_EXTERNAL_MODULES": "rut_no_such_module"}, "never_run": {}}
    status = rut.compare_runs(tree, [STABLE], runs, output, verl_release="0.0.0")
    report = json.loads(output.read_text())
    assert status == 2 and report["exit_status"] == 2
    assert "run 'broken'" in report["setup_error"] and "rut_no_such_module" in report["setup_error"]
    assert report["runs"] == {} and not list(tmp_path.glob("*.junit.xml"))


def test_run_envs_compare_verl_alone_with_verl_cpu():
    base = {"VERL_PLATFORM": "cpu", "VERL_USE_EXTERNAL_MODULES": "x", "PYTHONPATH": "/src", "HOME": "/h"}
    base["RAY_ADDRESS"] = "10.0.0.1:6379"
    assert list(rut.RUNS) == ["alone", "verl_cpu"]
    alone = rut.run_env(rut.RUNS["alone"], base, ray_tmpdir="/tmp/r")
    with_cpu = rut.run_env(rut.RUNS["verl_cpu"], base)
    assert alone == {"HOME": "/h", "PYTHONSAFEPATH": "1", "VERL_USE_EXTERNAL_PLUGINS": "none", "RAY_TMPDIR": "/tmp/r"}
    assert with_cpu == {"HOME": "/h", "PYTHONSAFEPATH": "1", "VERL_USE_EXTERNAL_MODULES": "verl_cpu.activate"}


def test_collect_test_files_patterns(tree):
    assert rut.collect_test_files(tree, ["tests/sub/*"]) == [FLAGGED, IMPORT]
    assert rut.collect_test_files(tree, ["test_stable_on_cpu.py"]) == [STABLE]
    assert rut.collect_test_files(tree, ["nothing*"]) == []


def test_case_id_without_file_attribute():
    cls = "tests.test_a_on_cpu.TestGroup"
    assert rut.case_id(cls, "test_x") == (f"{cls}.test_x", cls)
    assert rut.case_id("", "tests.sub.test_c_on_cpu") == ("tests.sub.test_c_on_cpu", "tests.sub.test_c_on_cpu")
