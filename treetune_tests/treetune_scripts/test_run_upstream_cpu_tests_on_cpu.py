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
"""The pure parts of ``treetune_scripts.run_upstream_cpu_tests``: JUnit parsing, the outcome diff and the table.

python -m pytest -q treetune_tests/treetune_scripts/test_run_upstream_cpu_tests_on_cpu.py
"""

from treetune_scripts import run_upstream_cpu_tests as rut

A = "tests/test_a_on_cpu.py"
B = "tests/sub/test_b_on_cpu.py"

JUNIT = f"""<?xml version="1.0" encoding="utf-8"?>
<testsuites name="pytest tests"><testsuite name="pytest" errors="2" failures="2" skipped="1" tests="7">
<testcase classname="tests.test_a_on_cpu" name="test_ok" file="{A}" line="3" time="0.5" />
<testcase classname="tests.test_a_on_cpu" name="test_param[1-x]" file="{A}" line="9" time="0.25">
  <failure message="AssertionError: assert 1 == 2">def test_param():
&gt;       assert 1 == 2
E       AssertionError</failure>
</testcase>
<testcase classname="tests.test_a_on_cpu.TestGroup" name="test_skip" file="{A}" line="20" time="0.0">
  <skipped type="pytest.skip" message="needs a GPU">tests/test_a_on_cpu.py:20: needs a GPU</skipped>
</testcase>
<testcase classname="tests.test_a_on_cpu.TestGroup" name="test_teardown" file="{A}" line="30" time="1.0">
  <failure message="ValueError: call">call failed</failure>
</testcase>
<testcase classname="tests.test_a_on_cpu.TestGroup" name="test_teardown" file="{A}" line="30" time="0.5">
  <error message="failed on teardown with &quot;RuntimeError: td&quot;">teardown</error>
</testcase>
<testcase classname="tests.sub.test_b_on_cpu" name="test_fixture_error" file="{B}" line="5" time="0.1">
  <error message="failed on setup with &quot;KeyError: 'k'&quot;">fixture trace</error>
</testcase>
<testcase classname="" name="tests.sub.test_c_on_cpu" file="tests/sub/test_c_on_cpu.py" time="0.0">
  <error message="collection failure">ModuleNotFoundError: No module named 'nope'</error>
</testcase>
</testsuite></testsuites>
"""


def _parse(tmp_path, text=JUNIT):
    path = tmp_path / "run.junit.xml"
    path.write_text(text, encoding="utf-8")
    return rut.parse_junit(path)


def test_parse_junit_outcomes_and_ids(tmp_path):
    results = _parse(tmp_path)
    assert {tid: r["outcome"] for tid, r in results.items()} == {
        f"{A}::test_ok": "passed",
        f"{A}::test_param[1-x]": "failed",
        f"{A}::TestGroup::test_skip": "skipped",
        f"{A}::TestGroup::test_teardown": "failed",  # the call failure wins over the teardown error
        f"{B}::test_fixture_error": "error",
        "tests/sub/test_c_on_cpu.py": "error",  # collection error of the whole file
    }
    failed = results[f"{A}::test_param[1-x]"]
    assert failed["message"].splitlines()[0] == "AssertionError: assert 1 == 2"
    assert "E       AssertionError" in failed["message"]
    assert failed["file"] == A and failed["time"] == 0.25
    assert results[f"{A}::TestGroup::test_teardown"]["time"] == 1.5
    assert results[f"{A}::TestGroup::test_skip"]["message"] == "needs a GPU"
    assert results[f"{B}::test_fixture_error"]["message"].startswith("failed on setup with \"KeyError: 'k'\"")


def test_case_id_without_file_attribute():
    cls = "tests.test_a_on_cpu.TestGroup"
    assert rut.case_id(cls, "test_x") == (f"{cls}.test_x", cls)
    assert rut.case_id("", "tests.sub.test_c_on_cpu") == ("tests.sub.test_c_on_cpu", "tests.sub.test_c_on_cpu")


def test_totals_and_counts_by_file(tmp_path):
    results = _parse(tmp_path)
    assert rut.totals(results) == {"passed": 1, "failed": 2, "error": 2, "skipped": 1}
    counts = rut.count_by_file(results)
    assert counts[A] == {"passed": 1, "failed": 2, "error": 0, "skipped": 1, "time_s": 2.25}
    assert counts[B]["error"] == 1 and counts["tests/sub/test_c_on_cpu.py"]["error"] == 1


def test_diff_outcomes_lists_only_changed_tests(tmp_path):
    alone = _parse(tmp_path)
    overlay = {tid: dict(r) for tid, r in alone.items()}
    overlay[f"{A}::test_ok"] = {"outcome": "failed", "file": A, "time": 0.1, "message": "RuntimeError: cpu\nmore"}
    overlay[f"{B}::test_fixture_error"]["outcome"] = "passed"
    overlay[f"{B}::test_fixture_error"]["message"] = ""
    del overlay["tests/sub/test_c_on_cpu.py"]
    overlay[f"{B}::test_new"] = {"outcome": "passed", "file": B, "time": 0.0, "message": ""}
    diffs = rut.diff_outcomes(alone, overlay)
    assert [(d["test"], d["alone"], d["overlay"]) for d in diffs] == [
        (f"{B}::test_fixture_error", "error", "passed"),
        (f"{B}::test_new", "missing", "passed"),
        ("tests/sub/test_c_on_cpu.py", "error", "missing"),
        (f"{A}::test_ok", "passed", "failed"),
    ]
    assert diffs[3]["overlay_message"] == "RuntimeError: cpu\nmore" and diffs[3]["alone_message"] == ""
    assert rut.diff_outcomes(alone, alone) == []

    counts = {"alone": rut.count_by_file(alone), "overlay": rut.count_by_file(overlay)}
    table = rut.format_report([A, B], counts, diffs)
    assert f"{A}::test_ok  alone=passed  overlay=failed" in table
    assert "[overlay] RuntimeError: cpu" in table
    assert "[alone] failed on setup with" in table
    assert "4 test(s) whose outcome differs" in table
    assert "No test differs" in rut.format_report([A], {"alone": {}, "overlay": {}}, [])


def test_collect_test_files_and_patterns(tmp_path):
    for rel in (A, B, "tests/sub/test_gpu.py", "tests/helper_on_cpu.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    assert rut.collect_test_files(tmp_path) == [B, A]
    assert rut.collect_test_files(tmp_path, ["tests/sub/*"]) == [B]
    assert rut.collect_test_files(tmp_path, ["test_a_on_cpu.py"]) == [A]


def test_run_envs():
    base = {"VERL_PLATFORM": "cpu", "VERL_USE_EXTERNAL_MODULES": "x", "PYTHONPATH": "/src", "HOME": "/h"}
    base["RAY_ADDRESS"] = "10.0.0.1:6379"
    alone, overlay = rut.run_env("alone", base, ray_tmpdir="/tmp/r"), rut.run_env("overlay", base)
    assert alone == {"HOME": "/h", "PYTHONSAFEPATH": "1", "VERL_USE_EXTERNAL_PLUGINS": "none", "RAY_TMPDIR": "/tmp/r"}
    assert overlay == {"HOME": "/h", "PYTHONSAFEPATH": "1", "VERL_USE_EXTERNAL_MODULES": "treetune_verl.cpu_backend"}
