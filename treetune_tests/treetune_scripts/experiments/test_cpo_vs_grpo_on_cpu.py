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
"""The CPO-vs-GRPO experiment: argument and folder checks, the warm-start gate, the summary's arithmetic, and one
``--quick`` run of the whole pipeline (real Ray runs) whose artifacts are checked against each other. The test
asserts the pipeline, never the experiment's outcome."""

import csv
import html
import json
import re
import statistics
import subprocess

import pytest

from treetune_scripts.experiments import cpo_vs_grpo, hard_prompts, summary
from treetune_scripts.experiments.hard_prompts import check_hard_regime
from treetune_scripts.experiments.warm_start import (
    WarmStartGateError,
    check_mixed_groups,
    val_acc_key,
    warm_start_hash,
)
from treetune_verl.metrics_history import read_metrics
from treetune_verl.tiny_run import METRICS_FILE


def no_training(*args, **kwargs):
    raise AssertionError("no training may start")


@pytest.fixture
def no_expensive_work(monkeypatch):
    monkeypatch.setattr(cpo_vs_grpo, "launch_cpo_on_cpu", no_training)
    monkeypatch.setattr(cpo_vs_grpo, "build_warm_start", no_training)


# ----------------------------------------------------------------------------------------------------------------------
# Bad input, before anything expensive
# ----------------------------------------------------------------------------------------------------------------------


def test_methods_are_grpo_or_cpo_with_a_known_wrapper():
    assert cpo_vs_grpo.parse_methods("grpo, cpo ,cpo:mi3") == ["grpo", "cpo:seq_kl", "cpo:mi3"]
    with pytest.raises(cpo_vs_grpo.ExperimentError, match="unknown method 'cpo:nope'.*seq_kl"):
        cpo_vs_grpo.parse_methods("grpo,cpo:nope")
    with pytest.raises(cpo_vs_grpo.ExperimentError, match="listed twice"):
        cpo_vs_grpo.parse_methods("grpo,grpo")


def test_a_cpo_method_can_set_its_alphas_and_names_its_run_folder_after_them(tmp_path):
    assert cpo_vs_grpo.parse_methods("cpo:seq_kl@neg_alpha=0.5") == ["cpo:seq_kl@neg_alpha=0.5"]
    overrides = cpo_vs_grpo.method_overrides("cpo:mi3@pos_alpha=0.3@neg_alpha=0.5")
    assert overrides == ["algorithm.adv_estimator=cpo", "cpo.wrap_method=mi3", "cpo.pos_alpha=0.3", "cpo.neg_alpha=0.5"]
    assert cpo_vs_grpo.run_name("cpo:seq_kl@neg_alpha=0.5", 2) == "cpo_seq_kl_neg_alpha0.5__seed2"
    # Any cpo key the recipe takes, a method's own block included; the recipe's own check names what is wrong.
    assert cpo_vs_grpo.method_overrides("cpo:rlsd@rlsd.clip=0.1")[-1] == "cpo.rlsd.clip=0.1"
    for bad, why in (
        ("cpo:seq_kl@neg_alpha=half", "must be a number"),
        ("cpo:seq_kl@neg_alph=0.5", "has no key 'neg_alph'"),
        ("cpo:rlsd@rlsd.clip=2", r"cpo.rlsd.clip must lie in \[0, 1\)"),
        ("cpo:seq_kl@teacher=frozen", "Unknown cpo.teacher 'frozen'"),
        ("cpo:sdpoo", "unknown method 'cpo:sdpoo'"),
    ):
        with pytest.raises(cpo_vs_grpo.ExperimentError, match=why):
            cpo_vs_grpo.parse_methods(bad)
    assert cpo_vs_grpo.parse_methods(cpo_vs_grpo.DEFAULT_METHODS)[2] == "cpo:seq_kl@teacher=initial"


def test_the_experiment_names_no_method_setting_of_its_own():
    """A peer's published settings (teacher, sampling, updates per rollout) are the recipe's, applied when the
    method is selected (treetune_recipe/cpo/config.py:apply_method_run_settings): a method's row differs from another
    only in its cpo keys."""
    assert cpo_vs_grpo.method_overrides("cpo:seq_kl@teacher=initial")[-1] == "cpo.teacher=initial"
    assert cpo_vs_grpo.run_name("cpo:seq_kl@teacher=initial", 0) == "cpo_seq_kl_teacherinitial__seed0"
    for method in ("cpo:rlsd", "cpo:opsd", "cpo:opsd_token", "cpo:sdpo"):
        assert cpo_vs_grpo.method_overrides(method) == ["algorithm.adv_estimator=cpo", f"cpo.wrap_method={method[4:]}"]
    assert {"cpo:opsd", "cpo:sdpo", "cpo:rlsd"} <= set(cpo_vs_grpo.parse_methods(cpo_vs_grpo.DEFAULT_METHODS))


def test_a_peers_published_settings_win_over_the_tasks_shared_ones(tmp_path):
    # The task runs two updates per step (mini-batch 8 of 16 prompts); a peer published with one update per rollout
    # batch runs one: the task's key is left out, so the recipe applies the method's (mini-batch = batch).
    schedule = cpo_vs_grpo.QUICK_SCHEDULE
    mini_batch = "actor_rollout_ref.actor.ppo_mini_batch_size=8"
    assert mini_batch in cpo_vs_grpo.run_overrides(tmp_path, "grpo", 0, schedule, dump_credit=False)
    assert mini_batch in cpo_vs_grpo.run_overrides(tmp_path, "cpo:seq_kl", 0, schedule, dump_credit=False)
    for peer in ("cpo:rlsd", "cpo:opsd", "cpo:opsd_token", "cpo:sdpo"):
        overrides = cpo_vs_grpo.run_overrides(tmp_path, peer, 0, schedule, dump_credit=False)
        assert mini_batch not in overrides, peer
        assert not any(o.startswith("actor_rollout_ref.actor.ppo_mini_batch_size") for o in overrides), peer


def test_only_the_cpo_keys_differ_between_methods(tmp_path):
    schedule = cpo_vs_grpo.QUICK_SCHEDULE
    grpo = cpo_vs_grpo.run_overrides(tmp_path / "run", "grpo", 1, schedule, dump_credit=False)
    cpo = cpo_vs_grpo.run_overrides(tmp_path / "run", "cpo:mi3", 1, schedule, dump_credit=False)
    assert set(grpo) ^ set(cpo) == {
        "algorithm.adv_estimator=grpo",
        "algorithm.adv_estimator=cpo",
        "cpo.wrap_method=mi3",
    }
    assert "data.seed=1" in grpo and "++actor_rollout_ref.rollout.engine_kwargs.hf.seed=1" in grpo


def test_val_acc_follows_the_validation_sample_count_an_override_sets(tmp_path):
    """``val_acc`` is verl's ``acc/mean@n`` for the ``n`` the runs validate with, the experiment's or a user's."""
    metrics = tmp_path / "metrics.jsonl"
    logged = {"val-core/tiny_arith/acc/mean@1": 0.25, "val-core/tiny_arith/acc/mean@8": 0.125}
    metrics.write_text(json.dumps({"step": 0, "data": logged}) + "\n")

    def val_acc_under(user_overrides):
        key = val_acc_key(cpo_vs_grpo.validation_samples(user_overrides))
        return cpo_vs_grpo.result_rows("grpo", 0, metrics, key)[0]["val_acc"]

    assert val_acc_under([]) == 0.125
    greedy = ["actor_rollout_ref.rollout.val_kwargs.temperature=0", "actor_rollout_ref.rollout.val_kwargs.n=1"]
    assert val_acc_under(greedy) == 0.25


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--methods", "grpo,ppo"], "unknown method 'ppo'"),
        (["--seeds", "0"], "--seeds must be >= 1, got 0"),
        (["--resume", "--overwrite"], "exclude each other"),
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


def test_warm_start_gate_refuses_all_wrong_or_all_right_with_the_measured_accuracy():
    check_mixed_groups({"val_acc_plain": 0.3})
    for accuracy in (0.02, 0.9):
        with pytest.raises(WarmStartGateError, match=f"accuracy on plain prompts is {accuracy:.3f}"):
            check_mixed_groups({"val_acc_plain": accuracy, "path": "x"})


def test_a_warm_start_outside_the_gate_stops_before_rl(tmp_path, capsys, monkeypatch):
    warm = tmp_path / "warm"
    warm.mkdir()
    info = {"val_acc_plain": 0.04, "val_acc_hint": 0.5, "parameters": 10}
    (warm / "build_info.json").write_text(json.dumps(info))
    monkeypatch.setattr(cpo_vs_grpo, "build_warm_start", lambda config: warm)
    monkeypatch.setattr(cpo_vs_grpo, "launch_cpo_on_cpu", no_training)
    assert cpo_vs_grpo.main(["--output-dir", str(tmp_path / "out")]) == 3
    err = capsys.readouterr().err
    assert "stopping before RL" in err and "accuracy on plain prompts is 0.040" in err


def _hard_info(all_wrong_frac, val_acc_plain, val_acc_hint):
    return {"all_wrong_frac": all_wrong_frac, "val_acc_plain": val_acc_plain, "val_acc_hint": val_acc_hint}


def test_hard_regime_gate_needs_most_fresh_groups_all_wrong_and_a_hint_that_helps():
    check_hard_regime(_hard_info(0.6, 0.05, 0.4))
    with pytest.raises(WarmStartGateError, match="only 0.550 of the freshly sampled groups .* are all wrong"):
        check_hard_regime(_hard_info(0.55, 0.05, 0.4))
    with pytest.raises(WarmStartGateError, match=r"the hint raises greedy accuracy .* by 0.100 \(0.050 -> 0.150\)"):
        check_hard_regime(_hard_info(0.9, 0.05, 0.15))


def test_hard_prompts_are_those_without_a_right_sample_and_the_gate_samples_them_afresh(tmp_path, monkeypatch):
    import pandas as pd

    from treetune_scripts.experiments import warm_start
    from treetune_verl.tiny_assets import build_tiny_assets

    assets = build_tiny_assets()
    warm = tmp_path / "warm"
    warm.mkdir()
    (warm / "model").symlink_to(assets / "model")
    (warm / "data").symlink_to(assets / "data")
    (warm / "build_info.json").write_text(json.dumps({"config": {"eval_max_new_tokens": 8}}))
    calls = []
    real = warm_start.completion_correctness  # the real model samples; the grading is replaced by a known pattern

    def graded(model_dir, conversations, answers, max_new_tokens, samples=0, *, seed=0):
        groups = real(model_dir, conversations, answers, max_new_tokens, samples, seed=seed)
        calls.append((len(conversations), samples, seed, [len(group) for group in groups]))
        if not samples:  # greedy: right with the hint only
            return [["Worked solution" in conversation[-1]["content"]] for conversation in conversations]
        every = 2 if seed == hard_prompts.SELECTION_SEED else 4  # a right response in every 2nd / 4th group
        return [[k == 0 and i % every == 0 for k in range(len(group))] for i, group in enumerate(groups)]

    monkeypatch.setattr(hard_prompts, "completion_correctness", graded)
    monkeypatch.setattr(warm_start, "completion_correctness", graded)  # the greedy measurements
    selected = hard_prompts.select_hard_prompts(warm)

    train_pool = pd.read_parquet(assets / "data" / "train.parquet")
    val_pool = pd.read_parquet(assets / "data" / "val.parquet")  # the tiny assets have no test split
    samples = hard_prompts.SELECTION_SAMPLES
    gate = min(hard_prompts.GATE_PROMPTS, len(train_pool) // 2)
    assert [call[:3] for call in calls] == [
        (len(train_pool), samples, hard_prompts.SELECTION_SEED),
        (len(val_pool), samples, hard_prompts.SELECTION_SEED),
        (gate, samples, hard_prompts.GATE_SEED),
        (len(val_pool) // 2, 0, 0),
        (len(val_pool) // 2, 0, 0),
    ]
    assert all(lengths == [max(call[1], 1)] * call[0] for *call, lengths in calls)
    train, val = pd.read_parquet(selected.train), pd.read_parquet(selected.val)
    assert list(train["extra_info"].map(lambda e: e["index"])) == list(range(1, len(train_pool), 2))
    assert list(val["extra_info"].map(lambda e: e["index"])) == list(range(1, len(val_pool), 2))
    assert list(train.columns) == list(train_pool.columns)
    fresh_right = len(range(0, gate, 4))
    assert selected.info == {
        "selection": f"no right response in {samples} samples at temperature 1 (seed 0)",
        "train_pool": len(train_pool),
        "train_prompts": len(train_pool) // 2,
        "val_pool": len(val_pool),
        "val_prompts": len(val_pool) // 2,
        "gate_prompts": gate,
        "all_wrong_frac": (gate - fresh_right) / gate,
        "correct_frac": fresh_right / (gate * samples),
        "val_acc_plain": 0.0,
        "val_acc_hint": 1.0,
    }
    assert hard_prompts.select_hard_prompts(warm) == selected and len(calls) == 5  # cached


def test_the_hard_regime_trains_on_the_hard_prompts_of_the_default_warm_start(tmp_path, capsys, monkeypatch):
    warm = tmp_path / "warm"
    warm.mkdir()
    (warm / "build_info.json").write_text(json.dumps({"val_acc_plain": 0.2, "val_acc_hint": 0.6, "parameters": 10}))
    built = []
    info = {
        **_hard_info(0.3, 0.0, 0.5),
        **dict(train_pool=8, train_prompts=4, val_pool=4, val_prompts=2, gate_prompts=4, correct_frac=0.1),
    }
    selected = hard_prompts.HardPrompts(train=tmp_path / "train.parquet", val=tmp_path / "val.parquet", info=info)
    monkeypatch.setattr(cpo_vs_grpo, "build_warm_start", lambda config: built.append(config) or warm)
    monkeypatch.setattr(hard_prompts, "select_hard_prompts", lambda path: selected if path == warm else None)
    monkeypatch.setattr(cpo_vs_grpo, "launch_cpo_on_cpu", no_training)
    assert cpo_vs_grpo.main(["--regime", "hard", "--output-dir", str(tmp_path / "out")]) == 3
    assert built == [cpo_vs_grpo.REGIMES["hard"].warm_start] == [cpo_vs_grpo.REGIMES["default"].warm_start]
    captured = capsys.readouterr()
    assert "Hard prompts: 4 of 8 training and 2 of 4 held-out prompts" in captured.out
    assert "not in the hard regime: only 0.300 of the freshly sampled groups" in captured.err
    plan = json.loads((tmp_path / "out" / "experiment.json").read_text())
    assert plan["regime"] == "hard" and plan["methods"] == cpo_vs_grpo.parse_methods(cpo_vs_grpo.HARD_METHODS)
    assert plan["warm_start"] == warm_start_hash(cpo_vs_grpo.REGIMES["hard"].warm_start)


# ----------------------------------------------------------------------------------------------------------------------
# Summary arithmetic on a hand-made results.csv
# ----------------------------------------------------------------------------------------------------------------------


def _write_csv(path, rows):
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=cpo_vs_grpo.RESULT_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({column: row.get(column, "") for column in cpo_vs_grpo.RESULT_COLUMNS})


def test_summary_numbers_by_hand(tmp_path):
    rows = []
    # grpo: val 0.2 -> 0.4 (seed 0), 0.2 -> 0.2 (seed 1); cpo: 0.2 -> 0.6 (both seeds). Steps 0 and 2.
    for method, finals, times in (("grpo", (0.4, 0.2), (2.0, 4.0)), ("cpo:seq_kl", (0.6, 0.6), (3.0, 3.0))):
        for seed, (final, time_s) in enumerate(zip(finals, times)):
            rows += [
                {"method": method, "seed": seed, "step": 0, "val_acc": 0.2},
                {"method": method, "seed": seed, "step": 1, "train_reward": -0.5, "step_time_s": 100.0},
                {"method": method, "seed": seed, "step": 2, "val_acc": final, "train_reward": 0, "step_time_s": time_s},
            ]
    # all-wrong shares of grpo at steps 1, 2: seed 0 0.5, 0.25; seed 1 0.75, 0.75; KL at step 2: 0.1, 0.3
    for row, (all_wrong, kl) in zip(rows[1:6:1], [(0.5, None), (0.25, 0.1), (None, None), (0.75, None), (0.75, 0.3)]):
        row.update({"all_wrong_frac": all_wrong, "kl": kl} if all_wrong is not None else {})
    _write_csv(tmp_path / "results.csv", rows)
    stats = summary.summarize(summary.read_results(tmp_path / "results.csv"))
    assert stats["threshold"] == pytest.approx(0.3)
    grpo, cpo = stats["methods"]["grpo"], stats["methods"]["cpo:seq_kl"]
    assert grpo["final"] == pytest.approx((0.3, statistics.stdev([0.4, 0.2])))
    assert grpo["auc"] == pytest.approx((0.25, statistics.stdev([0.3, 0.2])))  # (0.2+0.4)/2, (0.2+0.2)/2
    assert (grpo["steps_to_threshold"], grpo["reached"]) == (2, 1)
    assert grpo["step_time_s"] == pytest.approx(3.0)  # step 1 (warm-up) left out
    assert cpo["final"] == pytest.approx((0.6, 0.0)) and cpo["step_time_ratio"] == pytest.approx(1.0)
    assert grpo["first"] == pytest.approx((0.2, 0.0))
    assert grpo["all_wrong_first"] == pytest.approx((0.5 + 0.75) / 2)  # step 1 of each seed
    assert grpo["all_wrong_mean"] == pytest.approx((0.375 + 0.75) / 2)  # each seed's mean over its steps
    assert grpo["final_kl"] == pytest.approx((0.1, 0.3))
    assert cpo["all_wrong_first"] is None and cpo["final_kl"] is None  # not logged: "-" in the table
    # Paired by seed: cpo - grpo final = 0.2 (seed 0), 0.4 (seed 1): mean 0.3, sd √0.02, 95 % half-width
    # t(0.975, 1) · sd / √2 = 12.706 · 0.1.
    assert cpo["final_vs_grpo"] == pytest.approx((0.3, 1.2706, 2))
    assert cpo["auc_vs_grpo"] == pytest.approx((0.15, 12.706 * 0.05, 2))  # AUCs 0.4 vs 0.3 and 0.4 vs 0.2
    assert grpo["final_vs_grpo"] == pytest.approx((0.0, 0.0, 2))
    # Drift: each seed's last logged value (step 2 for seed 0, step 1 for seed 1), mean ± sd.
    rows[2]["drift"], rows[4]["drift"] = 0.5, 0.25
    _write_csv(tmp_path / "results.csv", rows)
    stats = summary.summarize(summary.read_results(tmp_path / "results.csv"))
    assert stats["methods"]["grpo"]["last_drift"] == pytest.approx((0.375, statistics.stdev([0.5, 0.25])))
    table = summary.summary_table(stats)
    assert "| 0.625 / 0.562 | 0.3750 ± 0.1768 | 0.100-0.300 |" in table
    assert "| +0.3000 [-0.9706, +1.5706] (n=2) |" in table and "| baseline |" in table


def _experiment_folder(path, warm_start, rows):
    path.mkdir(parents=True)
    (path / "experiment.json").write_text(json.dumps({"warm_start": warm_start}))
    _write_csv(path / "results.csv", rows)
    return path


def test_summary_of_two_folders_pairs_a_method_added_later_with_the_first_folders_grpo(tmp_path):
    def run(method, seed, final):
        return [
            {"method": method, "seed": seed, "step": 0, "val_acc": 0.2},
            {"method": method, "seed": seed, "step": 2, "val_acc": final, "step_time_s": 1.0},
        ]

    grpo = run("grpo", 0, 0.3) + run("grpo", 1, 0.1)
    first = _experiment_folder(tmp_path / "a", "w1", grpo + run("cpo:rlsd", 0, 0.9))
    added = _experiment_folder(tmp_path / "b", "w1", run("cpo:opsd_token", 0, 0.5) + run("cpo:opsd_token", 1, 0.2))
    out = tmp_path / "both"
    summary.main([str(first), str(added), "--output-dir", str(out), "--methods", "grpo,cpo:opsd_token"])
    stats = summary.summarize(summary.read_results(out / "results.csv"))
    assert sorted(stats["methods"]) == ["cpo:opsd_token", "grpo"]  # cpo:rlsd left out
    # Paired with grpo of the same seed: +0.2 and +0.1.
    assert stats["methods"]["cpo:opsd_token"]["final_vs_grpo"][0] == pytest.approx(0.15)
    assert (out / "summary.md").is_file() and (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
    # Controls: another warm start, or the same run in both folders, is refused.
    other = _experiment_folder(tmp_path / "c", "w2", run("cpo:opsd_token", 2, 0.5))
    with pytest.raises(ValueError, match="different warm starts"):
        summary.combine_results([first, other], tmp_path / "x.csv")
    with pytest.raises(ValueError, match="in an earlier folder too"):
        summary.combine_results([first, _experiment_folder(tmp_path / "d", "w1", run("grpo", 1, 0.1))], tmp_path / "x")


# ----------------------------------------------------------------------------------------------------------------------
# The whole pipeline, --quick
# ----------------------------------------------------------------------------------------------------------------------


#: The pipeline check validates with 2 samples a prompt instead of the experiment's 8 (a quarter of the validation
#: time); it also runs a user's override through every run to the results. ``--quick`` runs one seed: the summary's
#: arithmetic over seeds is checked by hand in ``test_summary_numbers_by_hand``.
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
    steps = cpo_vs_grpo.QUICK_SCHEDULE.steps
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
    test_freq = cpo_vs_grpo.QUICK_SCHEDULE.test_freq
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
        json.loads((dump_dir / f"step_{step}.json").read_text()) for step in cpo_vs_grpo.QUICK_SCHEDULE.credit_steps
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
        assert dump["wrap_method"] == "seq_kl" and dump["rows"]
        kinds = {row["kind"] for row in dump["rows"]}
        for kind in ("mixed_correct", "mixed_wrong", "all_wrong", "all_correct"):
            rows = [row for row in dump["rows"] if row["kind"] == kind][:2]
            for row in rows:
                for i, token in enumerate(row["tokens"]):
                    expected.append((row["delta"][i], row["advantage_shaped"][i] - row["advantage"][i], token))
        for row in dump["rows"]:
            assert row["delta"] == pytest.approx(
                [g - o for g, o in zip(row["gw_log_probs"], row["old_log_probs"])], abs=2e-6
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

    monkeypatch.setattr(cpo_vs_grpo, "launch_cpo_on_cpu", fake_training)
    assert cpo_vs_grpo.main([*QUICK_ARGS, "--resume", "--output-dir", str(out)]) == 0
    assert calls == ["grpo__seed0"]
    assert _csv_rows(out / "results.csv") == _csv_rows(quick_experiment / "results.csv")
    assert capsys.readouterr().out.count("finished earlier, kept") == 1
    # Each run names the code it trained with: the checkout's commit (with "-dirty" when it has uncommitted changes).
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    for name in ("grpo__seed0", "cpo_seq_kl__seed0"):
        assert json.loads((out / "runs" / name / "run.json").read_text())["commit"].removesuffix("-dirty") == head
