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
"""The hard regime's prompts (``treetune_recipe/cpo/experiments/hard_prompts.py``): the selection keeps the prompts
without a right sample, the gate samples the hard prompts afresh and asks for mostly all-wrong groups and a hint that
helps."""

import json

import pytest

from treetune_recipe.cpo.experiments import hard_prompts
from treetune_recipe.cpo.experiments.hard_prompts import check_hard_regime
from treetune_recipe.cpo.experiments.warm_start import WarmStartGateError


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

    from treetune_recipe.cpo.experiments import warm_start
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
