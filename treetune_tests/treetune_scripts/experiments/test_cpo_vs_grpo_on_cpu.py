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
"""The CPO-vs-GRPO experiment's command line (``python -m treetune_scripts.experiments.cpo_vs_grpo``): argument and
folder checks, the warm-start gates that stop before RL, the hard regime's plan, and one ``--quick`` run of the whole
pipeline (real Ray runs) whose artifacts are checked against each other. The test asserts the pipeline, never the
experiment's outcome; the library's arithmetic is tested in ``treetune_tests/treetune_recipe/cpo/experiments/``."""

import csv
import html
import json
import re
import statistics
import subprocess

import pytest

from treetune_recipe.cpo.experiments import cpo_vs_grpo as experiment  # the library; cpo_vs_grpo: the command line
from treetune_recipe.cpo.experiments import hard_prompts, long_chain, task
from treetune_recipe.cpo.experiments.task import val_acc_key
from treetune_recipe.cpo.experiments.warm_start import warm_start_hash
from treetune_scripts.experiments import cpo_vs_grpo
from treetune_verl.metrics_history import read_metrics
from treetune_verl.tiny_run import METRICS_FILE


def no_training(*args, **kwargs):
    raise AssertionError("no training may start")


@pytest.fixture
def no_expensive_work(monkeypatch):
    monkeypatch.setattr(experiment, "launch_cpo_on_cpu", no_training)
    monkeypatch.setattr(experiment, "build_warm_start", no_training)


# ----------------------------------------------------------------------------------------------------------------------
# Bad input, before anything expensive
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--methods", "grpo,ppo"], "unknown method 'ppo'"),
        (["--seeds", "0"], "--seeds must be >= 1, got 0"),
        (["--resume", "--overwrite"], "exclude each other"),
        (["--quick", "--full"], "--quick and --full exclude each other"),
    ],
)
def test_bad_arguments_stop_before_any_work(tmp_path, capsys, no_expensive_work, argv, message):
    assert cpo_vs_grpo.main([*argv, "--output-dir", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err


def test_a_folder_with_other_results_is_refused_unless_overwrite(tmp_path, capsys, no_expensive_work):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.csv").write_text("method,seed\n")
    assert cpo_vs_grpo.main(["--quick", "--output-dir", str(out)]) == 2
    assert "already holds results" in capsys.readouterr().err
    assert (out / "results.csv").is_file()
    # --resume needs the same experiment.
    (out / "experiment.json").write_text(json.dumps({"methods": ["grpo"], "seeds": 5}))
    assert cpo_vs_grpo.main(["--quick", "--resume", "--output-dir", str(out)]) == 2
    assert "holds another experiment" in capsys.readouterr().err
    # --overwrite clears the folder (then reaches the warm start, stubbed here).
    with pytest.raises(AssertionError, match="no training may start"):
        cpo_vs_grpo.main(["--quick", "--overwrite", "--output-dir", str(out)])
    assert not (out / "results.csv").exists() and (out / "experiment.json").is_file()


def test_a_warm_start_outside_the_gate_stops_before_rl(tmp_path, capsys, monkeypatch):
    warm = tmp_path / "warm"
    warm.mkdir()
    info = {"val_acc_plain": 0.04, "val_acc_hint": 0.5, "parameters": 10}
    (warm / "build_info.json").write_text(json.dumps(info))
    monkeypatch.setattr(experiment, "build_warm_start", lambda config: warm)
    monkeypatch.setattr(experiment, "launch_cpo_on_cpu", no_training)
    assert cpo_vs_grpo.main(["--output-dir", str(tmp_path / "out")]) == 3
    err = capsys.readouterr().err
    assert "stopping before RL" in err and "accuracy on plain prompts is 0.040" in err


def _hard_info(all_wrong_frac, val_acc_plain, val_acc_hint):
    return {"all_wrong_frac": all_wrong_frac, "val_acc_plain": val_acc_plain, "val_acc_hint": val_acc_hint}


def test_the_hard_regime_trains_on_the_hard_prompts_of_the_default_warm_start(tmp_path, capsys, monkeypatch):
    warm = tmp_path / "warm"
    warm.mkdir()
    (warm / "build_info.json").write_text(json.dumps({"val_acc_plain": 0.2, "val_acc_hint": 0.6, "parameters": 10}))
    built = []
    info = {
        **_hard_info(0.3, 0.0, 0.5),
        **dict(train_pool=8, train_prompts=4, val_pool=4, val_prompts=2, gate_prompts=4, correct_frac=0.1),
    }
    selected = task.RegimePrompts(train=tmp_path / "train.parquet", val=tmp_path / "val.parquet", info=info)
    monkeypatch.setattr(experiment, "build_warm_start", lambda config: built.append(config) or warm)
    monkeypatch.setattr(hard_prompts, "select_hard_prompts", lambda path: selected if path == warm else None)
    monkeypatch.setattr(experiment, "launch_cpo_on_cpu", no_training)
    assert cpo_vs_grpo.main(["--regime", "hard", "--output-dir", str(tmp_path / "out")]) == 3
    assert built == [experiment.REGIMES["hard"].warm_start] == [experiment.REGIMES["default"].warm_start]
    captured = capsys.readouterr()
    assert "Hard prompts: 4 of 8 training and 2 of 4 held-out prompts" in captured.out
    assert "not in the hard regime: only 0.300 of the freshly sampled groups" in captured.err
    plan = json.loads((tmp_path / "out" / "experiment.json").read_text())
    assert plan["regime"] == "hard" and plan["methods"] == experiment.parse_methods(experiment.DEFAULT_METHODS)
    assert plan["warm_start"] == warm_start_hash(experiment.REGIMES["hard"].warm_start)


def test_the_long_regime_trains_and_validates_on_the_long_chains_and_gates_on_them(tmp_path, capsys, monkeypatch):
    warm = tmp_path / "warm"
    warm.mkdir()
    (warm / "build_info.json").write_text(json.dumps({"val_acc_plain": 0.2, "val_acc_hint": 0.6, "parameters": 10}))
    info = {
        **_hard_info(0.5, 0.35, 0.8),
        "gate_prompts": 4,
        "gate_samples": 8,
        "correct_frac": 0.2,
        "solution_tokens": {"min": 80, "mean": 110.0, "max": 150},
    }
    selected = task.RegimePrompts(train=tmp_path / "long_train.parquet", val=tmp_path / "long_val.parquet", info=info)
    monkeypatch.setattr(experiment, "build_warm_start", lambda config: warm)
    monkeypatch.setattr(long_chain, "long_chain_prompts", lambda path: selected if path == warm else None)
    launched = []
    monkeypatch.setattr(experiment, "launch_cpo_on_cpu", lambda overrides, *a, **k: launched.append(overrides))
    assert cpo_vs_grpo.main(["--regime", "long", "--full", "--output-dir", str(tmp_path / "out")]) == 3
    captured = capsys.readouterr()
    assert "Long-chain prompts: gold solutions of 80-150 tokens" in captured.out
    assert "not in the long regime: plain greedy accuracy 0.350 is outside [0.05, 0.3]" in captured.err
    assert not launched
    plan = json.loads((tmp_path / "out" / "experiment.json").read_text())
    assert plan["seeds"] == experiment.REGIMES["long"].full_seeds
    assert plan["schedule"]["test_freq"] == 10
    assert plan["methods"] == experiment.parse_methods(experiment.DEFAULT_METHODS)
    assert "data.max_response_length=160" in plan["overrides"]
    # In the regime, the runs train and validate on the long chains with the long lengths, after the task's.
    info["val_acc_plain"] = 0.2
    monkeypatch.setattr(experiment, "launch_cpo_on_cpu", lambda overrides, *a, **k: launched.append(overrides) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        cpo_vs_grpo.main(["--regime", "long", "--output-dir", str(tmp_path / "out2")])
    overrides = launched[0]
    assert f"data.train_files={selected.train}" in overrides and f"data.val_files={selected.val}" in overrides
    lengths = [item for item in overrides if item.startswith("data.max_response_length=")]
    assert lengths[-1] == "data.max_response_length=160"


# ----------------------------------------------------------------------------------------------------------------------
# The whole pipeline, --quick
# ----------------------------------------------------------------------------------------------------------------------


#: The pipeline check validates with 2 samples a prompt instead of the experiment's 8 (a quarter of the validation
#: time); it also runs a user's override through every run to the results. ``--quick`` runs one seed: the summary's
#: arithmetic over seeds is checked by hand in ``test_summary_numbers_by_hand``
#: (``treetune_tests/treetune_recipe/cpo/experiments/test_summary_on_cpu.py``).
QUICK_VAL_SAMPLES = 2
QUICK_ARGS = ["--quick", f"actor_rollout_ref.rollout.val_kwargs.n={QUICK_VAL_SAMPLES}"]


@pytest.fixture(scope="module")
def quick_experiment(tmp_path_factory):
    out = tmp_path_factory.mktemp("experiment") / "cpo_vs_grpo"
    assert cpo_vs_grpo.main([*QUICK_ARGS, "--output-dir", str(out)]) == 0
    return out


def _csv_rows(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _numbers(cell: str) -> list[float]:
    return [float(x) for x in re.findall(r"-?\d+\.\d+", cell)]


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_quick_experiment_writes_every_artifact_and_covers_every_run_and_step(quick_experiment):
    for name in ("results.csv", "summary.md", "curves.png", "credit_report.html", "experiment.json"):
        assert (quick_experiment / name).is_file(), name
    assert (quick_experiment / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = _csv_rows(quick_experiment / "results.csv")
    steps = experiment.QUICK_SCHEDULE.steps
    expected = {(m, "0", str(t)) for m in ("grpo", "cpo:seq_kl") for t in range(steps + 1)}
    assert {(r["method"], r["seed"], r["step"]) for r in rows} == expected
    assert len(rows) == len(expected)
    for row in rows:
        if row["val_acc"] != "":
            assert 0.0 <= float(row["val_acc"]) <= 1.0
        if row["step"] != "0":
            assert float(row["step_time_s"]) > 0 and -1.0 <= float(row["train_reward"]) <= 1.0
    # verl validates before training, every test_freq steps and at the last step; val_acc is the sampled mean@n of
    # the n the override set.
    test_freq = experiment.QUICK_SCHEDULE.test_freq
    validated_steps = {"0", *(str(t) for t in range(test_freq, steps + 1, test_freq)), str(steps)}
    validated = {(r["method"], r["seed"], r["step"]) for r in rows if r["val_acc"] != ""}
    assert validated == {(m, s, t) for m, s, t in expected if t in validated_steps}
    logged = read_metrics(quick_experiment / "runs" / "grpo__seed0" / METRICS_FILE)
    val_key = val_acc_key(QUICK_VAL_SAMPLES)
    for row in rows:
        if (row["method"], row["seed"]) == ("grpo", "0") and row["val_acc"] != "":
            assert float(row["val_acc"]) == pytest.approx(logged[int(row["step"])][val_key], abs=1e-9), row


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_summary_numbers_equal_those_recomputed_from_results_csv(quick_experiment):
    rows = _csv_rows(quick_experiment / "results.csv")
    table = [line for line in (quick_experiment / "summary.md").read_text().splitlines() if line.startswith("| ")]
    by_method = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]] for line in table[1:]}

    def of(method, key):
        return [float(r[key]) for r in rows if r["method"] == method and r[key] != ""]

    curves = {m: sorted((int(r["step"]), float(r["val_acc"])) for r in rows if r["method"] == m and r["val_acc"])
              for m in ("grpo", "cpo:seq_kl")}  # fmt: skip
    times = {m: [float(r["step_time_s"]) for r in rows if r["method"] == m and int(r["step"]) >= 2] for m in curves}
    for method, curve in curves.items():
        xs, ys = [s for s, _ in curve], [a for _, a in curve]
        auc = sum((xs[i + 1] - xs[i]) * (ys[i] + ys[i + 1]) / 2 for i in range(len(xs) - 1)) / (xs[-1] - xs[0])
        seeds, first, final, final_vs_grpo, auc_cell, auc_vs_grpo, _, all_wrong_cell, drift, _, *_, time_cell, ratio = (
            by_method[method]
        )
        assert seeds == "1"
        # One seed: each mean is that seed's value, each standard deviation 0.
        assert _numbers(first) == pytest.approx([curve[0][1], 0.0], abs=1e-4)
        assert _numbers(final) == pytest.approx([curve[-1][1], 0.0], abs=1e-4)
        assert _numbers(auc_cell) == pytest.approx([auc, 0.0], abs=1e-4)
        assert _numbers(drift) == pytest.approx([of(method, "drift")[-1], 0.0], abs=1e-4)
        shares = of(method, "all_wrong_frac")
        assert _numbers(all_wrong_cell) == pytest.approx([shares[0], statistics.fmean(shares)], abs=1e-3)
        assert float(time_cell) == pytest.approx(statistics.fmean(times[method]), abs=1e-3)
        assert float(ratio) == pytest.approx(statistics.fmean(times[method]) / statistics.fmean(times["grpo"]), 1e-3)
        if method == "grpo":
            assert final_vs_grpo == auc_vs_grpo == "baseline"
        else:  # the seed's difference from GRPO's same seed; one pair gives no interval
            difference = curve[-1][1] - curves["grpo"][-1][1]
            assert final_vs_grpo == f"{difference:+.4f} [-inf, +inf] (n=1)"


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_credit_report_shows_the_dumped_token_values(quick_experiment):
    dump_dir = quick_experiment / "runs" / "cpo_seq_kl__seed0" / "credit_dump"
    dumps = [
        json.loads((dump_dir / f"step_{step}.json").read_text()) for step in experiment.QUICK_SCHEDULE.credit_steps
    ]
    with open(quick_experiment / "credit_report.html", newline="") as handle:  # keep "\r" tokens as written
        page = handle.read()
    assert "http://" not in page and "https://" not in page  # self-contained
    spans = re.findall(
        r'<span class="tok" data-delta="([^"]+)" data-adv="([^"]+)" title="[^"]*"[^>]*>([^<]*)</span>', page
    )
    shown = [(float(d), float(a), html.unescape(t)) for d, a, t in spans]
    expected = []
    for dump in dumps:
        assert dump["method"] == "seq_kl" and dump["rows"]
        kinds = {row["kind"] for row in dump["rows"]}
        for kind in ("mixed_correct", "mixed_wrong", "all_wrong", "all_correct"):
            rows = [row for row in dump["rows"] if row["kind"] == kind][:2]
            for row in rows:
                for i, token in enumerate(row["tokens"]):
                    expected.append((row["delta"][i], row["advantage_shaped"][i] - row["advantage"][i], token))
        for row in dump["rows"]:
            assert row["delta"] == pytest.approx(
                [g - o for g, o in zip(row["teacher_log_probs"], row["old_log_probs"])], abs=2e-6
            )
            if row["kind"] == "all_wrong":  # seq_kl, all-wrong group: A += neg_alpha * mean(delta)
                shift = dump["neg_alpha"] * statistics.fmean(row["delta"])
                changes = [s - a for s, a in zip(row["advantage_shaped"], row["advantage"])]
                assert changes == pytest.approx([shift] * len(changes), abs=1e-4)
        assert kinds <= {"mixed_correct", "mixed_wrong", "all_wrong", "all_correct"}
    assert [(d, t) for d, _, t in shown] == [(d, t) for d, _, t in expected]
    assert [a for _, a, _ in shown] == pytest.approx([a for _, a, _ in expected], abs=1e-9)


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_resume_keeps_finished_runs_and_reruns_only_the_unfinished(quick_experiment, monkeypatch, tmp_path, capsys):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(quick_experiment, out)
    unfinished = out / "runs" / "grpo__seed0"
    (unfinished / "run.json").unlink()
    saved_metrics = (unfinished / "metrics.jsonl").read_text()
    calls = []

    def fake_training(overrides, log_path, **kwargs):
        calls.append(log_path.parent.name)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        (log_path.parent / "metrics.jsonl").write_text(saved_metrics)
        log_path.write_text("")
        return type("Run", (), {"returncode": 0, "wall_s": 1.0, "log_path": log_path})()

    monkeypatch.setattr(experiment, "launch_cpo_on_cpu", fake_training)
    assert cpo_vs_grpo.main([*QUICK_ARGS, "--resume", "--output-dir", str(out)]) == 0
    assert calls == ["grpo__seed0"]
    assert _csv_rows(out / "results.csv") == _csv_rows(quick_experiment / "results.csv")
    assert capsys.readouterr().out.count("finished earlier, kept") == 1
    # Each run names the code it trained with: the checkout's commit (with "-dirty" when it has uncommitted changes).
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    for name in ("grpo__seed0", "cpo_seq_kl__seed0"):
        assert json.loads((out / "runs" / name / "run.json").read_text())["commit"].removesuffix("-dirty") == head
