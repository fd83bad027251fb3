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
"""Start-up checks for the rows of issue 11 that used to fail late or silently (no Ray, no model weights).

Each case composes the real ``cpo_trainer`` config with the CPU profile on the tiny assets and runs the checks the
entry point runs before Ray (``check_run_config`` and ``check_cpo_run``).
"""

from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from treetune_recipe.cpo import CONFIG_DIR, CONFIG_NAME
from treetune_recipe.cpo.trainer.preflight import check_cpo_config, check_cpo_run
from treetune_verl.data.rl_schema import validate_rl_dataframe
from treetune_verl.preflight import PreflightError, check_run_config
from treetune_verl.tiny_assets import build_tiny_assets
from treetune_verl.tiny_run import tiny_run_overrides


@pytest.fixture(scope="module")
def assets_dir():
    return build_tiny_assets()


@pytest.fixture
def run_config(assets_dir, tmp_path):
    def compose_run(*overrides):
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            base = ["platform=cpu", *tiny_run_overrides(assets_dir, tmp_path)]
            return compose(CONFIG_NAME, overrides=[*base, *overrides])

    return compose_run


def train_frame(assets_dir) -> pd.DataFrame:
    return pd.read_parquet(assets_dir / "data" / "train.parquet")


def write(frame: pd.DataFrame, path: Path) -> Path:
    frame.to_parquet(path)
    return path


def without_extra_info_key(frame: pd.DataFrame, key: str) -> pd.DataFrame:
    frame = frame.copy()
    frame["extra_info"] = [{k: v for k, v in info.items() if k != key} for info in frame["extra_info"]]
    return frame


# ---------------------------------------------------------------------------------------------- rows 4 and 5: batch


@pytest.mark.parametrize("estimator", ["cpo", "grpo"])
def test_row4_one_response_per_prompt_with_a_group_estimator_stops(run_config, estimator):
    config = run_config(
        "actor_rollout_ref.rollout.n=1",
        f"algorithm.adv_estimator={estimator}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",  # micro-batches that divide: only n is wrong
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    )
    with pytest.raises(PreflightError) as error:
        check_run_config(config)
    message = str(error.value)
    assert f"actor_rollout_ref.rollout.n=1 with algorithm.adv_estimator={estimator}" in message
    assert "rollout.n=2 or more" in message and "micro-batch" not in message


def test_row5_rows_that_do_not_split_into_micro_batches_stop_naming_the_keys(run_config):
    with pytest.raises(PreflightError) as error:
        check_run_config(run_config("actor_rollout_ref.rollout.n=3"))
    message = str(error.value)
    # 4 prompts x 3 = 12 rows; the CPU profile's micro-batches are 8 (log-prob, ref and update).
    assert "data.train_batch_size x actor_rollout_ref.rollout.n = 4 x 3 = 12 rows" in message
    assert "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8" in message
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8" in message
    assert "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=6" in message  # a size that divides 12


def test_row5_sizes_that_divide_pass(run_config):
    check_run_config(run_config("actor_rollout_ref.rollout.n=2"))  # 4 x 2 = 8 rows: one micro-batch of 8
    check_run_config(run_config("actor_rollout_ref.rollout.n=3", "actor_rollout_ref.actor.use_dynamic_bsz=true"))


# ----------------------------------------------------------------------------------------- row 6: overlong prompts


def test_row6_prompts_longer_than_max_prompt_length_stop_naming_the_rows(run_config, assets_dir, tmp_path):
    frame = train_frame(assets_dir)
    long_text = " ".join(["seven plus seven"] * 40)
    frame.at[5, "prompt"] = [{"role": "user", "content": long_text}]
    path = write(frame, tmp_path / "long.parquet")
    with pytest.raises(ValueError) as error:
        check_cpo_run(run_config(f"data.train_files={path}"))
    message = str(error.value)
    assert "data.train_files" in message and "longer than data.max_prompt_length=64" in message
    assert "row 5 (" in message and "row 4 (" not in message
    assert "data.filter_overlong_prompts=true" in message
    # verl drops them itself when asked to, or truncates them: nothing to stop then.
    check_cpo_run(run_config(f"data.train_files={path}", "data.filter_overlong_prompts=true"))
    check_cpo_run(run_config(f"data.train_files={path}", "data.truncation=left"))


# ------------------------------------------------------------------------------------------ rows 7-10: hint prompt


def test_row7_solution_key_missing_from_the_data_stops_naming_the_key(run_config):
    with pytest.raises(ValueError) as error:
        check_cpo_run(run_config("cpo.hint.solution_key=answer"))
    message = str(error.value)
    assert "extra_info.answer is missing or empty in 64 row(s): row 0, row 1" in message
    assert "cpo.hint.solution_key" in message and "cpo.hint.on_missing=skip" in message


def test_row8_hint_prompt_that_cannot_fit_even_without_solution_stops(run_config):
    with pytest.raises(ValueError) as error:
        check_cpo_run(run_config("cpo.hint.max_prompt_length=16"))
    message = str(error.value)
    assert "cpo.hint.max_prompt_length=16" in message and "even with an empty solution" in message
    check_cpo_run(run_config("cpo.hint.max_prompt_length=600"))


@pytest.mark.parametrize("value", ["600.5", "abc", "true"])
def test_row9_hint_lengths_of_the_wrong_type_stop_naming_the_key(run_config, value):
    with pytest.raises(ValueError) as error:
        check_cpo_config(run_config(f"cpo.hint.max_prompt_length={value}"))
    assert "cpo.hint.max_prompt_length must be an integer or null" in str(error.value)


def test_row9_margin_of_the_wrong_type_stops_naming_the_key(run_config):
    with pytest.raises(ValueError, match="cpo.hint.max_prompt_length_margin must be an integer"):
        check_cpo_config(run_config("cpo.hint.max_prompt_length_margin=1.5"))


def test_row10_missing_solutions_are_reported_and_none_at_all_stops_under_skip(
    run_config, assets_dir, tmp_path, capsys
):
    frame = train_frame(assets_dir)
    frame["extra_info"] = [
        {**info, "solution": None} if row % 4 == 0 else info for row, info in enumerate(frame["extra_info"])
    ]
    quarter = write(frame, tmp_path / "quarter.parquet")
    check_cpo_run(run_config(f"data.train_files={quarter}", "cpo.hint.on_missing=skip"))
    assert "16 of 64 rows (25%) have no extra_info.solution" in capsys.readouterr().out

    none = write(without_extra_info_key(train_frame(assets_dir), "solution"), tmp_path / "none.parquet")
    with pytest.raises(ValueError) as error:
        check_cpo_run(run_config(f"data.train_files={none}", "cpo.hint.on_missing=skip"))
    assert "plain GRPO" in str(error.value) and "cpo.hint.allow_all_missing=true" in str(error.value)
    check_cpo_run(run_config(f"data.train_files={none}", "cpo.hint.on_missing=skip", "cpo.hint.allow_all_missing=true"))
    assert "64 of 64 rows (100%)" in capsys.readouterr().out


# ---------------------------------------------------------------------------------- row 11: checks agree with docs


def test_row11_rows_without_question_and_val_rows_without_ability_are_accepted(run_config, assets_dir, tmp_path):
    no_question = write(without_extra_info_key(train_frame(assets_dir), "question"), tmp_path / "train.parquet")
    val = pd.read_parquet(assets_dir / "data" / "val.parquet").drop(columns=["ability"])
    val_path = write(val, tmp_path / "val.parquet")
    check_cpo_run(run_config(f"data.train_files={no_question}", f"data.val_files={val_path}"))


def test_row11_training_rows_still_need_ability_and_a_last_user_message(assets_dir):
    frame = train_frame(assets_dir).drop(columns=["ability"])
    assert validate_rl_dataframe(frame) == [f"column ability: missing (the file has {list(frame.columns)})"]
    assert validate_rl_dataframe(frame, require_ability=False) == []
    frame = without_extra_info_key(train_frame(assets_dir), "question")
    frame.at[0, "prompt"] = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert validate_rl_dataframe(frame) == [
        "row 0, column prompt: the last message must be the user's question, got role 'assistant'"
    ]
