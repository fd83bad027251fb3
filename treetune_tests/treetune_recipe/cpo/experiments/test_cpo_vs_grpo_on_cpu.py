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
"""The CPO-vs-GRPO experiment's library (``treetune_recipe/cpo/experiments/cpo_vs_grpo.py``): method names and the
overrides they differ in, each run's overrides, and the ``results.csv`` rows read from verl's metrics. The command line
is tested in ``treetune_tests/treetune_scripts/experiments/test_cpo_vs_grpo_on_cpu.py``."""

import json

import pytest

from treetune_recipe.cpo.experiments import cpo_vs_grpo
from treetune_recipe.cpo.experiments.task import val_acc_key


def test_methods_are_grpo_or_cpo_with_a_known_wrapper():
    assert cpo_vs_grpo.parse_methods("grpo, cpo ,cpo:mi3") == ["grpo", "cpo:seq_kl", "cpo:mi3"]
    with pytest.raises(cpo_vs_grpo.ExperimentError, match="unknown method 'cpo:nope'.*seq_kl"):
        cpo_vs_grpo.parse_methods("grpo,cpo:nope")
    with pytest.raises(cpo_vs_grpo.ExperimentError, match="listed twice"):
        cpo_vs_grpo.parse_methods("grpo,grpo")


def test_a_cpo_method_can_set_its_alphas_and_names_its_run_folder_after_them(tmp_path):
    assert cpo_vs_grpo.parse_methods("cpo:seq_kl@neg_alpha=0.5") == ["cpo:seq_kl@neg_alpha=0.5"]
    overrides = cpo_vs_grpo.method_overrides("cpo:mi3@pos_alpha=0.3@neg_alpha=0.5")
    assert overrides == ["algorithm.adv_estimator=cpo", "cpo.method=mi3", "cpo.pos_alpha=0.3", "cpo.neg_alpha=0.5"]
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
        assert cpo_vs_grpo.method_overrides(method) == ["algorithm.adv_estimator=cpo", f"cpo.method={method[4:]}"]
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
        "cpo.method=mi3",
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
