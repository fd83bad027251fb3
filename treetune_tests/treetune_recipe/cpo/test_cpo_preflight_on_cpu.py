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
"""Start-up checks of the CPO recipe on the composed ``cpo_trainer`` config (no Ray, no model)."""

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from treetune_recipe.cpo import CONFIG_DIR, CONFIG_NAME
from treetune_recipe.cpo.trainer.preflight import check_cpo_config, check_cpo_run, cpo_is_enabled
from treetune_verl.tiny_assets import build_tiny_assets
from treetune_verl.tiny_run import tiny_run_overrides


def cpo_config(*overrides):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(CONFIG_NAME, overrides=["platform=cpu", *overrides])


def test_default_config_passes_and_enables_cpo():
    config = cpo_config()
    assert cpo_is_enabled(config)
    check_cpo_config(config)


def test_grpo_estimator_turns_cpo_off_and_skips_its_checks():
    config = cpo_config("algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.calculate_entropy=false")
    assert not cpo_is_enabled(config)
    check_cpo_config(config)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.use_v1=true", "Set trainer.use_v1=false"),
        ("actor_rollout_ref.actor.calculate_entropy=false", "calculate_entropy=true"),
        ("cpo.method=seqkl", "Unknown cpo.method 'seqkl'"),
        ("cpo.cpo_lambda=1.0", "cpo_lambda"),
        ("cpo.neg_alpha=nan", "cpo.neg_alpha"),
        ("cpo.hint.on_missing=ignore", "cpo.hint.on_missing must be 'error' or 'skip'"),
        ("cpo.hint.user_template='no fields'", "{question}"),
    ],
)
def test_bad_cpo_settings_are_rejected_naming_the_fix(override, message):
    with pytest.raises(ValueError) as error:
        check_cpo_config(cpo_config(override))
    assert message in str(error.value)


@pytest.mark.parametrize("release", ["0.9.1", "0.7.1"])
def test_legacy_workers_are_refused_on_the_release_that_has_them(monkeypatch, release):
    import treetune_verl.version as version

    monkeypatch.setattr(version, "installed_verl_version", lambda: release)
    config = cpo_config("trainer.use_legacy_worker_impl=auto")
    if release == "0.7.1":
        with pytest.raises(ValueError, match="Set trainer.use_legacy_worker_impl=disable"):
            check_cpo_config(config)
    else:  # verl 0.9.1 has engine workers only and ignores the key
        check_cpo_config(config)


def test_run_check_requires_solutions_only_when_the_hint_needs_them(tmp_path):
    assets_dir = build_tiny_assets()
    frame_path = assets_dir / "data" / "train.parquet"
    frame = pd.read_parquet(frame_path)
    frame["extra_info"] = [{k: v for k, v in info.items() if k != "solution"} for info in frame["extra_info"]]
    no_solution = tmp_path / "train.parquet"
    frame.to_parquet(no_solution)
    paths = tiny_run_overrides(assets_dir, tmp_path)

    check_cpo_run(cpo_config(*paths))
    with pytest.raises(ValueError, match=r"data.train_files: .*extra_info.solution is missing .*: row 0, row 1"):
        check_cpo_run(cpo_config(*paths, f"data.train_files={no_solution}"))
    with pytest.raises(ValueError, match="cpo.hint.allow_all_missing=true"):  # no solution at all: plain GRPO
        check_cpo_run(cpo_config(*paths, f"data.train_files={no_solution}", "cpo.hint.on_missing=skip"))
    check_cpo_run(
        cpo_config(
            *paths, f"data.train_files={no_solution}", "cpo.hint.on_missing=skip", "cpo.hint.allow_all_missing=true"
        )
    )
    check_cpo_run(cpo_config(*paths, f"data.train_files={no_solution}", "algorithm.adv_estimator=grpo"))


def test_the_run_check_asks_what_the_runs_teacher_context_reads(tmp_path, capsys):
    """A sibling reads nothing from the files and RLSD's answer reads ``reward_model.ground_truth``: training rows
    without gold solutions pass for both. Control: the same rows are refused when the context is the gold solution.
    (RLSD with a sibling context stands for SDPO's, which verl 0.7.1 refuses for its loss, not its data.)"""
    assets_dir = build_tiny_assets()
    frame = pd.read_parquet(assets_dir / "data" / "train.parquet")
    frame["extra_info"] = [{k: v for k, v in info.items() if k != "solution"} for info in frame["extra_info"]]
    no_solution = tmp_path / "train.parquet"
    frame.to_parquet(no_solution)
    paths = (*tiny_run_overrides(assets_dir, tmp_path), f"data.train_files={no_solution}")

    check_cpo_run(cpo_config(*paths, "cpo.method=rlsd", "cpo.context=successful_sibling"))
    assert "teacher context successful_sibling: reads, at each step, a response of the same prompt group" in (
        capsys.readouterr().out
    )
    check_cpo_run(cpo_config(*paths, "cpo.method=rlsd"))
    assert f"0 of {len(frame)} rows (0%) have no reward_model.ground_truth" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"extra_info.solution is missing .*: row 0, row 1"):
        check_cpo_run(cpo_config(*paths, "cpo.method=rlsd", "cpo.context=gold_solution"))


def test_a_file_where_no_row_has_the_contexts_column_is_refused():
    from treetune_recipe.cpo.config import CPOConfig
    from treetune_recipe.cpo.trainer.preflight import _context_data_problems

    frame = pd.DataFrame({"reward_model": [{"style": "rule", "ground_truth": ""}, None], "extra_info": [{}, {}]})
    cpo = CPOConfig(method="rlsd")
    (problem,) = _context_data_problems([("train.parquet", frame)], cpo, 96, None, None)
    assert "no row has reward_model.ground_truth, which the teacher context answer_only shows" in problem
    assert "cpo.context=gold_solution|successful_sibling|environment_feedback" in problem
    frame["reward_model"] = [{"style": "rule", "ground_truth": ""}, {"style": "rule", "ground_truth": "4"}]
    assert _context_data_problems([("train.parquet", frame)], cpo, 96, None, None) == []
