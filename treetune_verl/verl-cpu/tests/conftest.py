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
"""A tiny model and data set built locally (no hub), for verl-cpu's end-to-end test.

The tokenizer has one token per printable character plus ChatML's special tokens; the model is a randomly initialised
two-layer Qwen3 whose output layer has more rows than the tokenizer has tokens, as real checkpoints pad theirs; the data
are addition problems in verl's RL parquet layout, scored by :mod:`reward` (1 when the answer appears in the response).
"""

import random
import string
from pathlib import Path

import pandas as pd
import pytest

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
REWARD_FILE = Path(__file__).with_name("reward.py")


def build_tokenizer():
    """A character-level fast tokenizer with ChatML special tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    characters = sorted(set(string.printable) - set("\t\r\x0b\x0c"))
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + characters)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
        chat_template=CHAT_TEMPLATE,
    )
    return tokenizer


def model_config(tokenizer) -> dict:
    """The ``Qwen3Config`` arguments of :func:`build_model`.

    A copy of the overlay's tiny Qwen3 (``treetune_verl/tiny_assets.py:tiny_qwen3_config``) with two heads and a
    shorter context: verl-cpu stands alone and its tests run where the overlay cannot be imported, so the copy stays;
    ``treetune_tests/treetune_verl/test_tiny_assets_on_cpu.py`` checks that the two agree.
    """
    return dict(
        vocab_size=len(tokenizer) + 8,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )


def build_model(tokenizer, seed: int = 0):
    """A random two-layer Qwen3 (head_dim 32) with 8 padded output rows beyond the tokenizer's ids."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    return Qwen3ForCausalLM(Qwen3Config(**model_config(tokenizer)))


def rl_rows(count: int, split: str, seed: int) -> list[dict]:
    """Addition problems in verl's RL layout (prompt as chat messages, ground truth under ``reward_model``)."""
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows.append(
            {
                "data_source": "verl_cpu_addition",
                "prompt": [{"role": "user", "content": f"{a}+{b}="}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"index": index, "split": split},
            }
        )
    return rows


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory) -> Path:
    """``model/`` (weights and tokenizer), ``train.parquet`` and ``val.parquet`` in a fresh folder."""
    root = tmp_path_factory.mktemp("verl_cpu_assets")
    tokenizer = build_tokenizer()
    build_model(tokenizer).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    pd.DataFrame(rl_rows(32, "train", seed=0)).to_parquet(root / "train.parquet")
    pd.DataFrame(rl_rows(8, "test", seed=1)).to_parquet(root / "val.parquet")
    return root
