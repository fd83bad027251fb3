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
"""Preparation scripts on the fixtures: verl's RLHFDataset loads the output and the validator accepts it."""

import json
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from treetune_scripts.data import prepare_competition, prepare_gpqa, prepare_math, validate_rl_parquet
from treetune_verl.data.rl_schema import DEFAULT_INSTRUCTION, validate_rl_dataframe

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SYSTEM = "You are a helpful assistant."
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _read_jsonl(name):
    return [json.loads(line) for line in (FIXTURES / name).read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def tiny_tokenizer():
    """A byte-level BPE trained on the fixture text, with a ChatML chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special_tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=special_tokens, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    texts = [path.read_text(encoding="utf-8") for path in sorted(FIXTURES.glob("*.jsonl"))]
    bpe.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """All preparation scripts run on the fixtures; returns {name: parquet path}."""
    out = tmp_path_factory.mktemp("rl_data")
    paths = {
        "train_math": out / "train_math.parquet",
        "test_math500": out / "test_math500.parquet",
        "test_aime2024": out / "test_aime2024.parquet",
        "test_aime2025": out / "test_aime2025.parquet",
        "test_amc2301": out / "test_amc2301.parquet",
        "test_gpqa": out / "test_gpqa.parquet",
    }
    jobs = [
        (prepare_math, "train_math", ["--preset", "math_train", "--input", "math_train.jsonl"]),
        (prepare_math, "test_math500", ["--preset", "math500", "--input", "math500.jsonl", "--system-prompt", SYSTEM]),
        (prepare_competition, "test_aime2024", ["--preset", "aime2024", "--input", "aime2024.jsonl"]),
        (prepare_competition, "test_aime2025", ["--preset", "aime2025", "--input", "aime2025.jsonl"]),
        (prepare_competition, "test_amc2301", ["--preset", "amc23", "--zero-one", "--input", "amc23.jsonl"]),
        (prepare_gpqa, "test_gpqa", ["--input", "gpqa.jsonl"]),
    ]
    for script, name, arguments in jobs:
        arguments = [str(FIXTURES / item) if item.endswith(".jsonl") else item for item in arguments]
        script.main(arguments + ["--output", str(paths[name])])
    return paths


def test_math_train_rows_keep_question_solution_and_boxed_ground_truth(prepared):
    df = pd.read_parquet(prepared["train_math"])
    fixture = _read_jsonl("math_train.jsonl")[:6]  # the 7th record has no boxed answer and is skipped
    assert len(df) == 6
    assert list(df["reward_model"].map(lambda r: r["ground_truth"])) == [
        "\\frac{1}{2}",
        "\\frac{x}{2}",
        "(-2,2)",
        "10\\text{ square cm}",
        "1,\\!000,\\!000",
        "50\\%",
    ]
    for position, (row, record) in enumerate(zip(df.to_dict(orient="records"), fixture)):
        assert row["data_source"] == "hendrycks_math" and row["ability"] == "math"
        assert row["reward_model"]["style"] == "rule"
        assert list(row["prompt"]) == [{"role": "user", "content": record["problem"] + DEFAULT_INSTRUCTION}]
        assert row["extra_info"]["index"] == position and row["extra_info"]["split"] == "train"
        assert row["extra_info"]["question"] == record["problem"]
        assert row["extra_info"]["solution"] == record["solution"]
        assert row["extra_info"]["subject"] == record["type"] and row["extra_info"]["level"] == record["level"]


def test_math500_uses_the_given_answer_and_the_system_prompt(prepared):
    df = pd.read_parquet(prepared["test_math500"])
    assert list(df["reward_model"].map(lambda r: r["ground_truth"])) == ["3", "\\frac{1}{4}", "2,3"]
    assert df["prompt"][0][0] == {"role": "system", "content": "You are a helpful assistant."}
    assert df["extra_info"][0]["level"] == "1" and df["data_source"][0] == "math500"


def test_competition_sets(prepared):
    aime24 = pd.read_parquet(prepared["test_aime2024"])
    assert list(aime24["reward_model"].map(lambda r: r["ground_truth"])) == ["401", "30"]
    aime25 = pd.read_parquet(prepared["test_aime2025"])
    assert aime25["extra_info"].map(lambda e: e["solution"]).isna().all()
    amc = pd.read_parquet(prepared["test_amc2301"])
    assert set(amc["data_source"]) == {"amc2301"}
    assert list(amc["reward_model"].map(lambda r: r["ground_truth"])) == ["27.0", "42"]


def test_gpqa_letters_point_at_the_correct_option(prepared):
    df = pd.read_parquet(prepared["test_gpqa"])
    fixture = _read_jsonl("gpqa.jsonl")
    correct_texts = [fixture[0]["Correct Answer"], fixture[1]["Correct Answer"], "Thymine"]
    for row, correct in zip(df.to_dict(orient="records"), correct_texts):
        letter = row["reward_model"]["ground_truth"]
        assert f"\n({letter}): {correct}\n" in row["extra_info"]["question"] + "\n"
        assert row["prompt"][0]["content"] == row["extra_info"]["question"] + DEFAULT_INSTRUCTION
    assert df["reward_model"][2]["ground_truth"] == "B"


def test_validator_accepts_every_prepared_file(prepared):
    assert validate_rl_dataframe(pd.read_parquet(prepared["train_math"]), require_solution=True) == []
    for name in ("test_math500", "test_aime2024", "test_aime2025", "test_amc2301", "test_gpqa"):
        assert validate_rl_dataframe(pd.read_parquet(prepared[name]), require_solution=False) == [], name
    assert validate_rl_parquet.main([str(prepared["train_math"])]) == 0


def test_validator_rejects_missing_solutions_with_row_and_column(prepared, tmp_path, capsys):
    df = pd.read_parquet(prepared["train_math"])
    df.at[1, "extra_info"] = {**df["extra_info"][1], "solution": None}
    df.at[4, "extra_info"] = {key: value for key, value in df["extra_info"][4].items() if key != "solution"}
    problems = validate_rl_dataframe(df, require_solution=True)
    assert [problem.split(":")[0] for problem in problems] == [
        "row 1, column extra_info.solution",
        "row 4, column extra_info.solution",
    ]
    assert validate_rl_dataframe(df, require_solution=False) == []

    broken = tmp_path / "broken.parquet"
    df.to_parquet(broken)
    assert validate_rl_parquet.main([str(broken)]) == 1
    assert f"{broken}: row 1, column extra_info.solution: missing or empty" in capsys.readouterr().out


def test_validator_reports_other_schema_problems():
    df = pd.DataFrame(
        [
            {
                "data_source": "",
                "prompt": [{"role": "robot", "content": "hi"}],
                "ability": "math",
                "reward_model": {"style": "model", "ground_truth": ""},
                "extra_info": {"index": "zero", "split": "train", "question": "q", "solution": "s"},
            }
        ]
    )
    columns = [problem.split(":")[0] for problem in validate_rl_dataframe(df)]
    assert columns == [
        "row 0, column data_source",
        "row 0, column prompt[0].role",
        "row 0, column prompt",
        "row 0, column reward_model.style",
        "row 0, column reward_model.ground_truth",
        "row 0, column extra_info.index",
    ]
    assert validate_rl_dataframe(df.drop(columns=["extra_info"])) == [
        "column extra_info: missing (the file has ['data_source', 'prompt', 'ability', 'reward_model'])"
    ]


def test_verl_rlhf_dataset_loads_train_and_concatenated_validation_files(prepared, tiny_tokenizer, tmp_path):
    from verl.utils.dataset.rl_dataset import RLHFDataset

    config = OmegaConf.create(
        {
            "max_prompt_length": 2048,
            "filter_overlong_prompts": True,
            "filter_overlong_prompts_workers": 1,
            "cache_dir": str(tmp_path / "cache"),
        }
    )
    train = RLHFDataset(str(prepared["train_math"]), tiny_tokenizer, config)
    assert len(train) == 6
    item = train[0]
    assert item["raw_prompt"][-1]["content"].endswith(DEFAULT_INSTRUCTION)
    assert item["extra_info"]["solution"].endswith("$\\boxed{\\frac{1}{2}}$.")
    assert item["reward_model"]["ground_truth"] == "\\frac{1}{2}"
    assert item["index"] == 0

    validation_names = ("test_math500", "test_aime2024", "test_aime2025", "test_amc2301", "test_gpqa")
    validation = RLHFDataset([str(prepared[name]) for name in validation_names], tiny_tokenizer, config)
    assert len(validation) == 3 + 2 + 2 + 2 + 3
    assert [validation[i]["data_source"] for i in (0, 3, 5, 7, 9)] == [
        "math500",
        "aime2024",
        "aime2025",
        "amc2301",
        "gpqa",
    ]
    messages = validation[0]["raw_prompt"]
    rendered = tiny_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n")


def test_check_rl_files_raises_with_the_config_key_file_and_rows(prepared, tmp_path):
    from treetune_verl.data.rl_schema import check_rl_files

    check_rl_files(OmegaConf.create([str(prepared["train_math"])]), require_solution=True, what="data.train_files")
    check_rl_files(str(prepared["test_aime2025"]), require_solution=False, what="data.val_files")
    check_rl_files(None)
    with pytest.raises(ValueError, match=r"data.val_files: .*test_aime2025.parquet has 2 schema problems"):
        check_rl_files([str(prepared["test_aime2025"])], require_solution=True, what="data.val_files")
    with pytest.raises(ValueError, match=r"row 0, column extra_info.solution: missing or empty.*\n  \.\.\. and 1 more"):
        check_rl_files([str(prepared["test_aime2025"])], require_solution=True, max_listed=1)
    with pytest.raises(ValueError, match="does not exist"):
        check_rl_files([str(tmp_path / "missing.parquet")], what="data.train_files")
