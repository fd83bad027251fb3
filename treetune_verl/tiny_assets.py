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
"""Build the tiny model, tokenizer and datasets that every CPU test and the CPU demo run on.

Nothing can be downloaded from a model hub, so everything is generated locally and deterministically:

- ``data/train.parquet`` and ``data/val.parquet`` (and ``data/test.parquet`` when ``num_test > 0``): synthetic
  arithmetic word problems in verl's RL schema, with ``extra_info.question`` and ``extra_info.solution``. Task
  ``one_step`` (default): "Tom has 3 apples and buys 4 more. ..."; task ``chain``: ``min_ops``-``max_ops`` chained
  operations ("Tom has 3 apples. He buys 4 more. Then he loses 2. ...") whose gold solution shows every
  intermediate result ("3 + 4 = 7. 7 - 2 = 5. \\boxed{5}"); the CPO-vs-GRPO experiment uses it; task
  ``long_chain``: the same problems whose gold solution also restates each operation before its equation
  ("He buys 4 more: 3 + 4 = 7. He loses 2: 7 - 2 = 5. \\boxed{5}"), for the experiment's long regime (5-8 operations,
  60-130 tokens of solution).
- ``model/``: a byte-level BPE tokenizer trained on generated problem text (digits stay single tokens), wrapped in
  ``PreTrainedTokenizerFast`` with a ChatML chat template that understands Qwen3's ``enable_thinking``, saved next to a
  randomly initialised ``Qwen3ForCausalLM`` (~107k parameters, float32) and its ``generation_config.json``.

The result lives in ``<cache_root>/<content hash>/``. The hash covers every build parameter, the builder version and
the versions of the libraries that shape the bytes, so a second call returns at once; a build writes into a temporary
folder that is renamed into place atomically, so concurrent builders never see a half-written folder.

Command line (prints the assets folder): ``python -m treetune_scripts.make_tiny_assets [--cache-root DIR] [--force]``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

# Bump whenever the builder changes what it writes: the cache key changes with it.
BUILDER_VERSION = "tiny-assets-v3"
CACHE_ENV_VAR = "TREETUNE_TINY_ASSETS_CACHE"
DATA_SOURCE = "tiny_arith"
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."

PAD_TOKEN = "<|endoftext|>"
IM_START_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
THINK_TOKENS = ("<think>", "</think>")

# ChatML; with enable_thinking=False the generation prompt gets an empty think block, as Qwen3's template does.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)


@dataclasses.dataclass(frozen=True)
class TinyAssetsConfig:
    """Every parameter of a build; all of them go into the cache key."""

    seed: int = 0
    task: str = "one_step"
    num_train: int = 64
    num_val: int = 16
    num_test: int = 0
    max_answer: int = 20
    min_ops: int = 2
    max_ops: int = 4
    tokenizer_vocab_size: int = 1024
    tokenizer_corpus_problems: int = 2000
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 2048
    vocab_multiple: int = 64
    torch_dtype: str = "float32"
    #: Standard deviation of the random init (transformers' Qwen3 default 0.02 gives near-uniform next-token
    #: distributions; :data:`CONTEXT_SENSITIVE` raises it so that log-probs depend on the context by nats).
    initializer_range: float = 0.02

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"TinyAssetsConfig.task={self.task!r} is unknown; use one of {', '.join(TASKS)}.")
        if not 1 <= self.min_ops <= self.max_ops:
            raise ValueError(f"TinyAssetsConfig needs 1 <= min_ops <= max_ops, got {self.min_ops}, {self.max_ops}.")


# ----------------------------------------------------------------------------------------------------------------------
# Problems
# ----------------------------------------------------------------------------------------------------------------------

_NAMES = [("Tom", "he"), ("Anna", "she"), ("Sam", "he"), ("Lily", "she"), ("Ben", "he"), ("Mia", "she")]
_ITEMS = ["apples", "pencils", "stickers", "books", "cookies", "marbles", "coins", "cards"]

# (template, operator); {a} is the starting amount, {b} the change.
_TEMPLATES = [
    ("{name} has {a} {items} and buys {b} more. How many {items} does {pron} have now?", "+"),
    ("{name} has {a} {items} and finds {b} more. How many {items} does {pron} have?", "+"),
    ("{name} has {a} {items} and gets {b} more. How many {items} does {pron} have?", "+"),
    ("{name} has {a} {items} and gives away {b}. How many {items} does {pron} have left?", "-"),
    ("{name} has {a} {items} and loses {b}. How many {items} does {pron} have left?", "-"),
    ("There are {a} {items} in a box. {name} takes {b}. How many {items} are left?", "-"),
]


def _sample_problem(rng: random.Random, max_answer: int) -> dict:
    """One single-operation word problem whose answer and operands lie in [0, max_answer]."""
    template, operator = rng.choice(_TEMPLATES)
    name, pronoun = rng.choice(_NAMES)
    items = rng.choice(_ITEMS)
    if operator == "+":
        answer = rng.randint(2, max_answer)
        a = rng.randint(1, answer - 1)
        b = answer - a
    else:
        a = rng.randint(1, max_answer)
        b = rng.randint(1, a)
        answer = a - b
    question = template.format(name=name, pron=pronoun, items=items, a=a, b=b)
    solution = f"{a} {operator} {b} = {answer}. \\boxed{{{answer}}}"
    return {"question": question, "answer": answer, "solution": solution}


# Chained task: the first sentence sets the amount, each further sentence is one operation.
_CHAIN_START = "{name} has {a} {items}."
_CHAIN_OPS = [
    ("{pron_cap} buys {b} more.", "+"),
    ("{pron_cap} finds {b} more.", "+"),
    ("{pron_cap} gets {b} more.", "+"),
    ("{pron_cap} gives away {b}.", "-"),
    ("{pron_cap} loses {b}.", "-"),
]
_CHAIN_QUESTION = "How many {items} does {pron} have now?"
TASKS = ("one_step", "chain", "long_chain")

#: Assets for numerics tests: the same task and sizes, with a random init wide enough that the model's next-token
#: distributions are peaked (mean entropy 2.3 nats on its own sampled responses; the default model: 6.45, about
#: log(vocab)) and depend on the context by nats (a response-only attention mask, a one-token shift and a dropped
#: prompt token move a token's log-prob by 7.4, 9.5 and 1.3 nats on average;
#: ``treetune_tests.support.engine_checks.check_context_sensitive`` asserts it). A near-uniform model gives a token the
#: same log-prob under any mask or position, so a comparison on it cannot fail.
CONTEXT_SENSITIVE = TinyAssetsConfig(initializer_range=0.5)


def _sample_chain_problem(
    rng: random.Random, max_answer: int, min_ops: int, max_ops: int, restate_steps: bool = False
) -> dict:
    """A problem of ``min_ops``..``max_ops`` chained operations; every intermediate amount lies in [0, max_answer].
    With ``restate_steps`` each step of the solution first restates its operation ("She loses 5: 7 - 5 = 2.")."""
    name, pronoun = rng.choice(_NAMES)
    items = rng.choice(_ITEMS)
    amount = rng.randint(1, max_answer)
    sentences = [_CHAIN_START.format(name=name, a=amount, items=items)]
    steps = []
    for position in range(rng.randint(min_ops, max_ops)):
        template, operator = rng.choice(_CHAIN_OPS)
        if operator == "+" and amount >= max_answer:
            template, operator = _CHAIN_OPS[3]
        elif operator == "-" and amount == 0:
            template, operator = _CHAIN_OPS[0]
        change = rng.randint(1, max_answer - amount) if operator == "+" else rng.randint(1, amount)
        result = amount + change if operator == "+" else amount - change
        sentence = template.format(pron_cap=pronoun.capitalize(), b=change)
        sentences.append(sentence if position == 0 else "Then " + sentence[0].lower() + sentence[1:])
        equation = f"{amount} {operator} {change} = {result}."
        steps.append(f"{sentence[:-1]}: {equation}" if restate_steps else equation)
        amount = result
    sentences.append(_CHAIN_QUESTION.format(items=items, pron=pronoun))
    solution = " ".join(steps) + f" \\boxed{{{amount}}}"
    return {"question": " ".join(sentences), "answer": amount, "solution": solution}


def generate_problems(
    rng: random.Random, count: int, config: TinyAssetsConfig, exclude: set[str] | None = None
) -> list[dict]:
    """``count`` distinct problems of ``config.task`` whose questions are not in ``exclude``."""
    if config.task in ("chain", "long_chain"):
        sample = functools.partial(
            _sample_chain_problem,
            max_answer=config.max_answer,
            min_ops=config.min_ops,
            max_ops=config.max_ops,
            restate_steps=config.task == "long_chain",
        )
    else:
        sample = functools.partial(_sample_problem, max_answer=config.max_answer)
    seen = set(exclude or ())
    problems = []
    while len(problems) < count:
        problem = sample(rng)
        if problem["question"] not in seen:
            seen.add(problem["question"])
            problems.append(problem)
    return problems


def _to_rl_rows(problems: list[dict], split: str) -> list[dict]:
    """Rows in verl's RL dataset schema (as read by verl.utils.dataset.rl_dataset.RLHFDataset)."""
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": problem["question"] + "\n" + INSTRUCTION}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(problem["answer"])},
            "extra_info": {
                "index": index,
                "split": split,
                "question": problem["question"],
                "solution": problem["solution"],
            },
        }
        for index, problem in enumerate(problems)
    ]


def _write_parquet(rows: list[dict], path: Path) -> None:
    import pandas as pd

    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)


# ----------------------------------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------------------------------


def _render_chat(problem: dict) -> str:
    """The full conversation text a problem produces, used as tokenizer training text."""
    return (
        f"{IM_START_TOKEN}user\n{problem['question']}\n{INSTRUCTION}{EOS_TOKEN}\n"
        f"{IM_START_TOKEN}assistant\n{THINK_TOKENS[0]}\n\n{THINK_TOKENS[1]}\n\n{problem['solution']}{EOS_TOKEN}\n"
    )


def build_tokenizer(corpus: list[str], vocab_size: int):
    """Train a byte-level BPE on ``corpus`` and wrap it for transformers.

    Digits are split off one by one before BPE, so numbers always tokenize digit by digit.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(THINK_TOKENS),
        special_tokens=[PAD_TOKEN, IM_START_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus, trainer=trainer)
    # Like Qwen3, the think markers are single tokens that survive decode(skip_special_tokens=True).
    bpe.add_tokens([AddedToken(token, special=False, normalized=False) for token in THINK_TOKENS])

    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        additional_special_tokens=[IM_START_TOKEN],
        chat_template=CHAT_TEMPLATE,
        model_max_length=1024,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


# ----------------------------------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------------------------------


#: The :class:`TinyAssetsConfig` fields that size the model, each a ``Qwen3Config`` argument of the same name.
MODEL_SHAPE_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
)


def tiny_qwen3_config(vocab_size: int, config: TinyAssetsConfig | None = None, **overrides) -> dict:
    """The ``transformers.Qwen3Config`` arguments of the tiny Qwen3: ``vocab_size``, the shape of ``config``
    (:data:`MODEL_SHAPE_FIELDS`; default ``TinyAssetsConfig()``: two layers, hidden size 64), tied embeddings, then
    ``overrides`` (any ``Qwen3Config`` argument, a shape key included). The one place the tiny model is written:
    :func:`build_model` (the tiny assets, and the CPU experiments' warm start through its ``TinyAssetsConfig``) and
    the tests that build a model in memory take it from here; verl-cpu's own tests keep a copy (their package cannot
    import this one), which ``treetune_tests/treetune_verl/test_tiny_assets_on_cpu.py`` checks against it."""
    config = config or TinyAssetsConfig()
    shape = {name: getattr(config, name) for name in MODEL_SHAPE_FIELDS}
    return {"vocab_size": vocab_size, **shape, "tie_word_embeddings": True, **overrides}


def build_model(config: TinyAssetsConfig, tokenizer):
    """A randomly initialised Qwen3ForCausalLM sized by ``config``; the global torch RNG is left untouched."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    vocab_size = -(-len(tokenizer) // config.vocab_multiple) * config.vocab_multiple
    model_config = Qwen3Config(
        **tiny_qwen3_config(
            vocab_size,
            config,
            initializer_range=config.initializer_range,
            bos_token_id=None,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            torch_dtype=config.torch_dtype,
        )
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = Qwen3ForCausalLM(model_config)
    return model.to(getattr(torch, config.torch_dtype))


# ----------------------------------------------------------------------------------------------------------------------
# Build and cache
# ----------------------------------------------------------------------------------------------------------------------


# Their versions join the cache key: they decide the RNG stream, the BPE merges and the file bytes.
_OUTPUT_SHAPING_LIBRARIES = ("torch", "transformers", "tokenizers", "pyarrow")


def default_cache_root() -> Path:
    """``$TREETUNE_TINY_ASSETS_CACHE`` if set, else ``<repo root>/.cache/tiny_assets``."""
    from_env = os.environ.get(CACHE_ENV_VAR)
    if from_env:
        return Path(from_env)
    return Path(__file__).resolve().parents[1] / ".cache" / "tiny_assets"


#: A frozen copy of the CPO recipe's default hint wording (``treetune_recipe/cpo/teacher/hint.py``, ``DEFAULT_SYSTEM``
#: and ``DEFAULT_USER_TEMPLATE``; the library imports no recipe), which the tiny tokenizer learns
#: (:data:`INSTRUCTION_CORPUS`). Like a real tokenizer, the tiny one then encodes English instructions compactly (whole
#: words), so the hint-guided prompt of the tiny runs fits its default width instead of being truncated on every row.
#: The text is part of the tokenizer's training data and of the cache key: changing a single byte changes every tiny
#: asset, the shipped warm start's tokenizer and the numbers the docs quote from tiny runs, so it stays as it is when
#: the recipe's wording changes (``treetune_tests/treetune_recipe/cpo/test_cpo_hint_on_cpu.py`` says when they part).
TOKENIZER_HINT_SYSTEM = "You are a helpful assistant."
TOKENIZER_HINT_USER_TEMPLATE = r"""Problem:
{question}

Worked solution (private; for your reference only):
{solution}

Solve the problem yourself, step by step, and reach the same final answer as the worked solution. Write the way a \
person thinks aloud while tackling the problem for the first time: a first-person train of thought, in real time.

Rules for your reply:
1. Start working right away. No preamble, no closing summary, no repetition of these rules.
2. Never mention, quote or hint at the worked solution, and do not suggest that you had any help or are acting.
3. Do not just restate the worked solution: derive each step, and show intermediate results, why you choose each \
approach, the checks you make, and any corrections.
4. Write the final answer inside \boxed{}."""
#: Instruction prose the tokenizer also learns from (see :data:`TOKENIZER_HINT_USER_TEMPLATE`).
INSTRUCTION_CORPUS = (TOKENIZER_HINT_SYSTEM, TOKENIZER_HINT_USER_TEMPLATE)


def content_hash(config: TinyAssetsConfig) -> str:
    """Cache key: build parameters, builder version and the library versions that shape the output bytes."""
    key = {
        "builder": BUILDER_VERSION,
        "instruction_corpus": list(INSTRUCTION_CORPUS),
        "config": dataclasses.asdict(config),
        "libraries": {name: importlib.metadata.version(name) for name in _OUTPUT_SHAPING_LIBRARIES},
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def write_task_data(config: TinyAssetsConfig, data_dir: Path) -> list[dict]:
    """Write ``train.parquet``, ``val.parquet`` (and ``test.parquet`` when ``num_test > 0``) of ``config``'s task into
    ``data_dir``: disjoint problem sets, each drawn from its own seed. Returns every problem written."""
    train_problems = generate_problems(random.Random(config.seed), config.num_train, config)
    val_problems = generate_problems(
        random.Random(config.seed + 1), config.num_val, config, exclude={p["question"] for p in train_problems}
    )
    _write_parquet(_to_rl_rows(train_problems, "train"), data_dir / "train.parquet")
    _write_parquet(_to_rl_rows(val_problems, "test"), data_dir / "val.parquet")
    test_problems = []
    if config.num_test > 0:
        held_out = {p["question"] for p in train_problems + val_problems}
        test_problems = generate_problems(random.Random(config.seed + 3), config.num_test, config, exclude=held_out)
        _write_parquet(_to_rl_rows(test_problems, "test"), data_dir / "test.parquet")
    return train_problems + val_problems + test_problems


def _write_assets(config: TinyAssetsConfig, out_dir: Path) -> None:
    """Write data/ and model/ for ``config`` into the (empty) folder ``out_dir``."""
    from transformers import GenerationConfig

    problems = write_task_data(config, out_dir / "data")
    corpus_problems = generate_problems(random.Random(config.seed + 2), config.tokenizer_corpus_problems, config)
    corpus = [_render_chat(p) for p in problems + corpus_problems]
    corpus += list(INSTRUCTION_CORPUS) * 50  # frequent enough for BPE to merge whole words
    tokenizer = build_tokenizer(corpus, config.tokenizer_vocab_size)

    model_dir = out_dir / "model"
    model = build_model(config, tokenizer)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None
    ).save_pretrained(model_dir)

    info = {"builder": BUILDER_VERSION, "config": dataclasses.asdict(config), "vocab_size": len(tokenizer)}
    (out_dir / "build_info.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def build_cached(final_dir: Path, write: Callable[[Path], None], *, force: bool = False) -> Path:
    """Return the cache folder ``final_dir``, first building it with ``write(tmp_dir)`` if it is missing (or ``force``).

    ``write`` fills a fresh temporary folder beside ``final_dir``, which is then renamed into place, so a reader
    never sees a half-written folder. When concurrent builders race, the first rename wins and the others (same
    content: the folder name is its content hash) drop their copy.
    """
    if final_dir.is_dir() and not force:
        return final_dir
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{final_dir.name}.tmp-", dir=final_dir.parent))
    tmp_dir.chmod(0o755)  # mkdtemp makes it private; the final folder should be readable like any other
    try:
        write(tmp_dir)
        if force and final_dir.is_dir():
            trash_dir = Path(tempfile.mkdtemp(prefix=f".{final_dir.name}.old-", dir=final_dir.parent))
            os.replace(final_dir, trash_dir / "old")
            shutil.rmtree(trash_dir, ignore_errors=True)
        try:
            os.rename(tmp_dir, final_dir)
        except OSError:
            # Another process finished the same build first; its folder has identical content.
            if not final_dir.is_dir():
                raise
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return final_dir


def build_tiny_assets(
    cache_root: Path | str | None = None, *, force: bool = False, config: TinyAssetsConfig | None = None
) -> Path:
    """Build (or find in the cache) the tiny assets and return their folder.

    Args:
        cache_root: Folder holding one sub-folder per content hash. Default: :func:`default_cache_root`.
        force: Rebuild even if the cached folder exists.
        config: Build parameters; default ``TinyAssetsConfig()``.

    Returns:
        ``<cache_root>/<content hash>/`` holding ``model/`` (model, tokenizer, generation config),
        ``data/train.parquet``, ``data/val.parquet`` and ``build_info.json``.
    """
    config = config or TinyAssetsConfig()
    cache_root = Path(cache_root) if cache_root is not None else default_cache_root()
    return build_cached(cache_root / content_hash(config), functools.partial(_write_assets, config), force=force)
