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
"""Tests of the tiny-asset builder (``treetune_verl/tiny_assets.py``): cache, determinism, model shape, tokenizer, chat
template and data schema."""

import dataclasses
import importlib.util
import re
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from treetune_verl import tiny_assets
from treetune_verl.tiny_assets import TinyAssetsConfig, build_tiny_assets

EXPECTED_INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{}."


@pytest.fixture(scope="module")
def assets_dir(tmp_path_factory) -> Path:
    return build_tiny_assets(tmp_path_factory.mktemp("tiny_assets_cache"))


@pytest.fixture(scope="module")
def tokenizer(assets_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(assets_dir / "model")


# ----------------------------------------------------------------------------------------------------------------------
# Cache and determinism
# ----------------------------------------------------------------------------------------------------------------------


def test_layout(assets_dir):
    for relative in ["model/config.json", "model/model.safetensors", "model/tokenizer.json",
                     "model/tokenizer_config.json", "model/generation_config.json",
                     "data/train.parquet", "data/val.parquet"]:  # fmt: skip
        assert (assets_dir / relative).is_file(), relative
    assert re.fullmatch(r"[0-9a-f]{16}", assets_dir.name)
    assert not [p for p in assets_dir.parent.iterdir() if p.name.startswith(".")], "temp folders left behind"


def test_rebuild_in_another_root_is_byte_identical(assets_dir, tmp_path):
    other = build_tiny_assets(tmp_path / "other_root")
    assert other.name == assets_dir.name
    for relative in ["data/train.parquet", "data/val.parquet", "model/tokenizer.json"]:
        assert (other / relative).read_bytes() == (assets_dir / relative).read_bytes(), relative
    weights_a = load_file(assets_dir / "model" / "model.safetensors")
    weights_b = load_file(other / "model" / "model.safetensors")
    assert weights_a.keys() == weights_b.keys()
    for name in weights_a:
        torch.testing.assert_close(weights_a[name], weights_b[name], rtol=0, atol=0)


def test_second_call_uses_cache(assets_dir, monkeypatch):
    def must_not_build(*args, **kwargs):
        raise AssertionError("cached assets were rebuilt")

    monkeypatch.setattr(tiny_assets, "_write_assets", must_not_build)
    assert build_tiny_assets(assets_dir.parent) == assets_dir


def test_force_rebuilds(tmp_path, monkeypatch):
    calls = []

    def fake_write(config, out_dir):
        calls.append(out_dir)
        (out_dir / "marker").write_text(str(len(calls)))

    monkeypatch.setattr(tiny_assets, "_write_assets", fake_write)
    first = build_tiny_assets(tmp_path)
    again = build_tiny_assets(tmp_path, force=True)
    assert first == again and len(calls) == 2
    assert (again / "marker").read_text() == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name]


def test_concurrent_builder_finishing_first_wins(tmp_path, monkeypatch):
    """If another process renames its folder into place first, ours is dropped and theirs returned."""
    final_dir = tmp_path / tiny_assets.content_hash(TinyAssetsConfig())

    def racing_write(config, out_dir):
        (out_dir / "marker").write_text("ours")
        final_dir.mkdir()
        (final_dir / "marker").write_text("theirs")

    monkeypatch.setattr(tiny_assets, "_write_assets", racing_write)
    assert build_tiny_assets(tmp_path) == final_dir
    assert (final_dir / "marker").read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir()] == [final_dir.name]


def test_hash_covers_parameters():
    base = tiny_assets.content_hash(TinyAssetsConfig())
    assert tiny_assets.content_hash(TinyAssetsConfig()) == base
    assert tiny_assets.content_hash(TinyAssetsConfig(num_train=8)) != base
    assert tiny_assets.content_hash(TinyAssetsConfig(seed=1)) != base
    assert tiny_assets.content_hash(TinyAssetsConfig(hidden_size=32)) != base


def test_default_cache_root(monkeypatch, tmp_path):
    monkeypatch.delenv(tiny_assets.CACHE_ENV_VAR, raising=False)
    repo_root = Path(tiny_assets.__file__).resolve().parent.parent
    assert tiny_assets.default_cache_root() == repo_root / ".cache" / "tiny_assets"
    monkeypatch.setenv(tiny_assets.CACHE_ENV_VAR, str(tmp_path))
    assert tiny_assets.default_cache_root() == tmp_path


# ----------------------------------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------------------------------


def test_model_architecture(assets_dir, tokenizer):
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(assets_dir / "model")
    config = model.config
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (64, 128, 2)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (
        4,
        2,
        32,
    )  # vLLM's CPU attention: >= 32
    assert config.max_position_embeddings >= 1024
    assert config.vocab_size % 64 == 0 and len(tokenizer) <= config.vocab_size < len(tokenizer) + 64
    assert config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()

    # Parameter count by hand: embeddings + per layer (q, k, v, o, gate/up/down, 2 RMSNorms, q/k norms) + final norm.
    hidden, inter, head_dim, vocab = 64, 128, 32, config.vocab_size
    per_layer = hidden * 4 * head_dim + 2 * hidden * 2 * head_dim + 4 * head_dim * hidden
    per_layer += 3 * hidden * inter + 2 * hidden + 2 * head_dim
    assert sum(p.numel() for p in model.parameters()) == vocab * hidden + 2 * per_layer + hidden

    generation_config = GenerationConfig.from_pretrained(assets_dir / "model")
    assert generation_config.eos_token_id == tokenizer.eos_token_id
    assert generation_config.pad_token_id == tokenizer.pad_token_id


def test_verl_cpus_copy_of_the_tiny_model_is_the_tiny_qwen3_with_two_heads():
    """verl-cpu's tests run where the overlay cannot be imported, so their conftest keeps a copy of the tiny Qwen3
    (``model_config``); it stays :func:`tiny_assets.tiny_qwen3_config` with two heads and a shorter context."""
    path = Path(tiny_assets.__file__).resolve().parent / "verl-cpu" / "tests" / "conftest.py"
    spec = importlib.util.spec_from_file_location("verl_cpu_tests_conftest", path)
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    tokenizer = conftest.build_tokenizer()
    assert conftest.model_config(tokenizer) == tiny_assets.tiny_qwen3_config(
        len(tokenizer) + 8,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )


# ----------------------------------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------------------------------


def test_tokenizer_special_tokens(tokenizer, assets_dir):
    from verl.utils import hf_tokenizer

    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token_id is not None and tokenizer.eos_token_id is not None
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    for token in ["<|im_start|>", "<think>", "</think>"]:
        assert len(tokenizer(token, add_special_tokens=False)["input_ids"]) == 1, token

    verl_tokenizer = hf_tokenizer(str(assets_dir / "model"))
    assert verl_tokenizer.pad_token_id == tokenizer.pad_token_id
    assert verl_tokenizer.eos_token_id == tokenizer.eos_token_id


def test_digits_are_single_tokens(tokenizer):
    tokens = tokenizer.convert_ids_to_tokens(tokenizer("12 + 305 = 317", add_special_tokens=False)["input_ids"])
    digit_tokens = [t for t in tokens if any(c.isdigit() for c in t)]
    assert digit_tokens == list("12305317")


ROUND_TRIP_TEXTS = ["3 + 4 = 7. \\boxed{7}", "", "héllo ✓ 日本 \x00\t garbage}}{{", "<think>\nok</think>"]


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_round_trip(tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text


def test_chat_template_enable_thinking(tokenizer):
    messages = [{"role": "user", "content": "What is 1 + 1?"}]
    plain = "<|im_start|>user\nWhat is 1 + 1?<|im_end|>\n<|im_start|>assistant\n"
    render = tokenizer.apply_chat_template
    assert render(messages, add_generation_prompt=True, tokenize=False) == plain
    assert render(messages, add_generation_prompt=True, tokenize=False, enable_thinking=True) == plain
    assert (
        render(messages, add_generation_prompt=True, tokenize=False, enable_thinking=False)
        == plain + "<think>\n\n</think>\n\n"
    )
    assert render(messages, add_generation_prompt=False, tokenize=False, enable_thinking=False) == (
        "<|im_start|>user\nWhat is 1 + 1?<|im_end|>\n"
    )
    conversation = messages + [{"role": "assistant", "content": "2"}]
    assert render(conversation, tokenize=False) == (
        "<|im_start|>user\nWhat is 1 + 1?<|im_end|>\n<|im_start|>assistant\n2<|im_end|>\n"
    )


# ----------------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("file_name", "split", "rows"), [("train.parquet", "train", 64), ("val.parquet", "test", 16)])
def test_data_schema(assets_dir, tokenizer, file_name, split, rows):
    frame = pd.read_parquet(assets_dir / "data" / file_name)
    assert list(frame.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert len(frame) == rows
    for index, row in frame.iterrows():
        assert row["data_source"] == "tiny_arith" and row["ability"] == "math"
        prompt = list(row["prompt"])
        assert len(prompt) == 1 and prompt[0]["role"] == "user"
        extra = row["extra_info"]
        assert prompt[0]["content"] == extra["question"] + EXPECTED_INSTRUCTION
        assert extra["index"] == index and extra["split"] == split
        assert row["reward_model"]["style"] == "rule"

        # The ground truth is recomputed from the numbers in the question and the operator in the solution.
        a, b = (int(x) for x in re.findall(r"\d+", extra["question"]))
        match = re.fullmatch(r"(\d+) ([+-]) (\d+) = (\d+)\. \\boxed\{(\d+)\}", extra["solution"])
        assert match, extra["solution"]
        assert (int(match[1]), int(match[3])) == (a, b)
        expected = a + b if match[2] == "+" else a - b
        assert match[4] == match[5] == row["reward_model"]["ground_truth"] == str(expected)
        assert 0 <= expected <= 20

        prompt_ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert len(prompt_ids) < 48


def test_val_questions_not_in_train(assets_dir):
    def questions(name):
        return {extra["question"] for extra in pd.read_parquet(assets_dir / "data" / name)["extra_info"]}

    train, val = questions("train.parquet"), questions("val.parquet")
    assert len(train) == 64 and len(val) == 16 and not train & val


def test_row_counts_are_parameters(tmp_path):
    small = build_tiny_assets(tmp_path, config=TinyAssetsConfig(num_train=5, num_val=3))
    assert len(pd.read_parquet(small / "data" / "train.parquet")) == 5
    assert len(pd.read_parquet(small / "data" / "val.parquet")) == 3


def test_verl_dataset_reads_the_data(assets_dir):
    from omegaconf import OmegaConf
    from verl.utils import hf_tokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    config = OmegaConf.create({"max_prompt_length": 48, "truncation": "error", "filter_overlong_prompts": True})
    dataset = RLHFDataset([str(assets_dir / "data" / "val.parquet")], hf_tokenizer(str(assets_dir / "model")), config)
    assert len(dataset) == 16
    item = dataset[3]
    assert item["data_source"] == "tiny_arith" and item["reward_model"]["ground_truth"].isdigit()


# ----------------------------------------------------------------------------------------------------------------------
# The chain task (multi-step problems of the CPO-vs-GRPO experiment)
# ----------------------------------------------------------------------------------------------------------------------

_STEP = re.compile(r"(\d+) ([+-]) (\d+) = (\d+)\.")


def test_chain_problems_show_every_intermediate_result_and_box_the_last():
    import random

    config = TinyAssetsConfig(task="chain", max_answer=15, min_ops=2, max_ops=4)
    problems = tiny_assets.generate_problems(random.Random(3), 300, config)
    lengths = set()
    for problem in problems:
        steps = _STEP.findall(problem["solution"])
        lengths.add(len(steps))
        start = int(re.search(r"has (\d+) ", problem["question"])[1])
        amount = start
        for a, operator, b, result in steps:
            assert int(a) == amount and 0 <= int(result) <= 15
            amount = amount + int(b) if operator == "+" else amount - int(b)
            assert int(result) == amount
            assert f" {b}" in problem["question"]
        assert problem["solution"].endswith(f"\\boxed{{{amount}}}") and problem["answer"] == amount
    assert lengths == {2, 3, 4}


def test_long_chain_problems_restate_each_operation_of_the_question_before_its_equation():
    import random

    config = TinyAssetsConfig(task="long_chain", max_answer=30, min_ops=5, max_ops=8)
    problems = tiny_assets.generate_problems(random.Random(3), 300, config)
    short = tiny_assets.generate_problems(random.Random(3), 300, dataclasses.replace(config, task="chain"))
    counts = set()
    for problem, plain in zip(problems, short, strict=True):
        # the same problems as the chain task's from the same seed, only the solution's wording differs
        assert problem["question"] == plain["question"] and problem["answer"] == plain["answer"]
        sentences = re.findall(
            r"(?:Then )?([A-Z]?[a-z]+ (?:buys|finds|gets|gives away|loses) \d+(?: more)?)\.", problem["question"]
        )
        steps = re.findall(r"([A-Za-z]+ [a-z ]+\d+(?: more)?): (\d+ [+-] \d+ = \d+\.)", problem["solution"])
        counts.add(len(steps))
        assert [equation for _, equation in steps] == re.findall(r"\d+ [+-] \d+ = \d+\.", plain["solution"])
        assert [text.lower() for text, _ in steps] == [text.lower() for text in sentences]
        assert problem["solution"].endswith(f"\\boxed{{{problem['answer']}}}")
    assert counts == {5, 6, 7, 8}


def test_chain_assets_have_disjoint_train_val_test_splits(tmp_path):
    config = TinyAssetsConfig(task="chain", num_train=40, num_val=10, num_test=12, tokenizer_corpus_problems=50)
    built = build_tiny_assets(tmp_path, config=config)
    splits = {name: pd.read_parquet(built / "data" / f"{name}.parquet") for name in ("train", "val", "test")}
    questions = {name: {row["question"] for row in frame["extra_info"]} for name, frame in splits.items()}
    assert [len(questions[name]) for name in ("train", "val", "test")] == [40, 10, 12]
    assert not (questions["train"] & questions["val"] or questions["train"] & questions["test"])
    assert not questions["val"] & questions["test"]
    assert all("\\boxed{" in row["solution"] for row in splits["test"]["extra_info"])


@pytest.mark.parametrize(
    ("kwargs", "message"), [({"task": "nope"}, "task='nope'"), ({"min_ops": 3, "max_ops": 2}, "min_ops")]
)
def test_bad_task_parameters_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TinyAssetsConfig(**kwargs)
