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
"""A warm-started model for the CPU experiments: a small Qwen3 fine-tuned by verl's own SFT trainer.

A pretrained LLM can already solve some problems and can use a worked solution placed in its prompt. The randomly
initialised tiny model can do neither, so before RL it is fine-tuned on worked solutions for

- the plain prompts of the ``chain`` task (``treetune_verl/tiny_assets.py``) and of its ``long_chain`` variant (5-8
  operations, every step restated; the experiment's long regime), and
- the same problems under every teacher context a method reads (:data:`SFT_CONTEXTS`): the hint prompt with the gold
  solution, the answer alone, SDPO's re-prompt around a right solution, each rendered by the recipe's own builder, so
  that the model has read every context it is later given as a teacher and follows none of them into a different
  format (``teacher_probe.py`` measures it).

The task's reward returns no feedback, so ``environment_feedback`` has no rows to learn from and is left out.

Trainer: ``verl.trainer.sft_trainer`` (upstream, unmodified) on the project's CPU backend, run with
``torch.distributed.run`` in a subprocess (:func:`sft_command` holds the overrides it needs).
The checkpoint's ``hf_model`` content is re-saved in float32 as ``model/`` with the tokenizer. The greedy accuracy on
the validation prompts (plain and hinted) is measured with transformers' ``generate`` and stored in
``build_info.json``; :func:`check_mixed_groups` refuses a warm start whose plain accuracy would not give RL mixed
prompt groups.

Cached like the tiny assets: ``<cache_root>/warm_start/<content hash>/``, the hash covering the assets' hash and every
SFT parameter.

**The shipped warm starts.** verl's SFT on CPU is not bitwise reproducible across machines (instruction sets change
float results, and at this scale the difference shows in the accuracy), so the weights of :data:`DEFAULT_WARM_START`
(the demo's and the tests') and of :data:`EXPERIMENT_WARM_START` (every regime of the experiment) ship with the
project: ``treetune_recipe/cpo/experiments/shipped_warm_start/{model,experiment}.safetensors`` (1.6 MB each), checked
against their SHA-256 (:data:`SHIPPED_BUILDS`) whenever a run takes them. Config, tokenizer and data come from the
tiny assets, built in the user's own environment (each transformers release writes its own tokenizer files); the
tokenizer's vocabulary must be the one the weights were trained with (:data:`SHIPPED_VOCAB_SHA256`). The command line
``python -m treetune_scripts.experiments.warm_start [--experiment] [--force] [--rebuild [--ship]]`` takes one;
``--rebuild`` runs the SFT recipe instead (into the cache; the shipped file stays), ``--ship`` copies a rebuilt
model's weights over the shipped file (:func:`ship_weights`) and prints the new hashes.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from treetune_recipe.cpo.experiments.task import HINT_USER_TEMPLATE
from treetune_verl.tiny_assets import (
    TinyAssetsConfig,
    build_cached,
    build_tiny_assets,
    content_hash,
    default_cache_root,
    write_task_data,
)

WARM_START_VERSION = "warm-start-v2"
#: Greedy plain-prompt validation accuracy that gives RL mixed groups (some prompts solved, some not).
MIXED_GROUPS_ACC_RANGE = (0.15, 0.50)


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
    """Every parameter of a warm start; all of them go into its cache key."""

    assets: TinyAssetsConfig
    sft_steps: int = 400
    sft_batch_size: int = 32
    sft_lr: float = 1e-3
    sft_max_length: int = 192
    eval_max_new_tokens: int = 48
    #: The long regime's problems, written with the assets' tokenizer into ``data/long_chain/`` (None: none).
    long_chain: LongChainConfig | None = None
    #: The teacher contexts whose prompts the SFT data holds besides the plain prompt (:func:`context_messages`).
    sft_contexts: tuple[str, ...] = ("gold_solution",)


@dataclasses.dataclass(frozen=True)
class LongChainConfig:
    """The long regime's problems: ``tiny_assets`` task ``long_chain`` with the assets' other settings (measured by
    the long regime's gate, ``long_chain.py``, not at the build)."""

    min_ops: int = 5
    max_ops: int = 8
    max_answer: int = 15
    num_train: int = 2048
    num_val: int = 128
    num_test: int = 256
    seed: int = 100

    def assets(self, base: TinyAssetsConfig) -> TinyAssetsConfig:
        counts = dict(num_train=self.num_train, num_val=self.num_val, num_test=self.num_test)
        ops = dict(min_ops=self.min_ops, max_ops=self.max_ops, max_answer=self.max_answer)
        return dataclasses.replace(base, task="long_chain", seed=self.seed, **ops, **counts)


#: The teacher contexts a warm start can be fine-tuned to read, each rendered as the trainer renders it.
SFT_CONTEXTS = ("gold_solution", "answer_only", "successful_sibling")
#: Folder of the long regime's parquet files inside a warm start's ``data/``.
LONG_CHAIN_DATA = "long_chain"


def _chain_assets(**settings) -> TinyAssetsConfig:
    task = dict(task="chain", num_train=2048, num_val=64, num_test=128, max_answer=15, min_ops=2, max_ops=3)
    return TinyAssetsConfig(**{**task, **settings})


#: The demo's and the tests' warm start (~0.39M parameters: the tiny model of ``tiny_assets.tiny_qwen3_config``, wider
#: and one layer deeper): the short problems after the plain and the hint prompt only. verl's SFT on CPU is not bitwise
#: reproducible from build to build, and at this scale the difference shows: builds of this config measured greedy
#: validation accuracy 0.125, 0.203 and 0.234 on plain prompts (0.609, 0.859 and 0.656 with the hint). The last one
#: ships with the project (:data:`SHIPPED_WEIGHTS`) and is what every run of this config trains from.
DEFAULT_WARM_START = WarmStartConfig(
    assets=_chain_assets(hidden_size=96, intermediate_size=256, num_hidden_layers=3),
    sft_steps=300,
    sft_batch_size=16,
    sft_lr=2e-3,
)

#: The experiment's warm start (every regime of ``cpo_vs_grpo.py``, the teacher probe): the same model and assets,
#: fine-tuned on the short and the long problems under every context of :data:`SFT_CONTEXTS`. The long problems'
#: numbers go up to 30 (the short ones' to 15): with long chains of numbers up to 15, a build of the same recipe
#: computed well enough alone that it learned to ignore the solution in its context (greedy 0.547 plain and 0.578 with
#: the hint on the short prompts); with harder long chains it reads the context (0.172 and 0.906), and a wider, deeper
#: model (0.87M parameters) read it less (0.266 and 0.766). One build ships (:data:`EXPERIMENT_WEIGHTS`). GRPO on the
#: demo's 16 fixed prompts does not learn from it within 40 steps (greedy accuracy 3/16 throughout, train reward trends
#: of +0.24 and -0.06 over 20 steps at lr 1e-3 for seeds 0 and 1), so the demo and the GRPO-learns test keep
#: :data:`DEFAULT_WARM_START`.
EXPERIMENT_WARM_START = WarmStartConfig(
    assets=DEFAULT_WARM_START.assets,
    sft_steps=800,
    sft_batch_size=16,
    sft_lr=2e-3,
    sft_max_length=448,
    long_chain=LongChainConfig(max_answer=30),
    sft_contexts=SFT_CONTEXTS,
)


#: The shipped weights of :data:`DEFAULT_WARM_START` and :data:`EXPERIMENT_WARM_START` (see the module docstring),
#: their SHA-256, and the SHA-256 of the vocabulary both were trained with (:func:`vocab_sha256`).
SHIPPED_DIR = Path(__file__).with_name("shipped_warm_start")
SHIPPED_WEIGHTS = SHIPPED_DIR / "model.safetensors"
SHIPPED_WEIGHTS_SHA256 = "2445a529638f5531198c79a8b6767b8725dfa4c53736482c72a1dba6ba4a8584"
EXPERIMENT_WEIGHTS = SHIPPED_DIR / "experiment.safetensors"
EXPERIMENT_WEIGHTS_SHA256 = "7bda856fc225adfd85c0b269c44d3cf63dd1b4049d774aa3a607e7589924725a"
SHIPPED_VOCAB_SHA256 = "c187eec5ae234afa3b0eae6b3780b2c909c607b8dbacdb3624c0481935ed8724"
#: Config -> (weights file, its SHA-256): the warm starts that ship instead of being built.
SHIPPED_BUILDS = {
    DEFAULT_WARM_START: (SHIPPED_WEIGHTS, SHIPPED_WEIGHTS_SHA256),
    EXPERIMENT_WARM_START: (EXPERIMENT_WEIGHTS, EXPERIMENT_WEIGHTS_SHA256),
}


class WarmStartGateError(RuntimeError):
    """The warm start's greedy accuracy would not give RL mixed prompt groups."""


class WarmStartIntegrityError(RuntimeError):
    """A shipped warm-start file is missing or its content is not the one the project ships."""


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def vocab_sha256(model_dir: Path) -> str:
    """SHA-256 of the tokenizer's vocabulary (token -> id, sorted), whatever files the installed transformers writes."""
    from transformers import AutoTokenizer

    vocab = sorted(AutoTokenizer.from_pretrained(model_dir).get_vocab().items())
    return hashlib.sha256(json.dumps(vocab).encode()).hexdigest()


def check_shipped_weights(weights: Path, config: WarmStartConfig = DEFAULT_WARM_START) -> None:
    """Raise :class:`WarmStartIntegrityError` unless ``weights`` is ``config``'s shipped weights file, byte for byte."""
    source, expected = SHIPPED_BUILDS[config]
    actual = file_sha256(weights) if Path(weights).is_file() else "missing"
    if actual != expected:
        raise WarmStartIntegrityError(
            f"{weights}: sha256 {actual}, but the shipped warm start's weights are {expected}. Restore "
            f"{source} from the repository (git checkout) and delete {Path(weights).parent.parent}."
        )


def warm_start_hash(config: WarmStartConfig) -> str:
    """Cache key: the assets' content hash plus every SFT parameter and the builder version."""
    key = {
        "builder": WARM_START_VERSION,
        "assets": content_hash(config.assets),
        "sft": {k: v for k, v in dataclasses.asdict(config).items() if k != "assets"},
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------------------------------------------------
# SFT data
# ----------------------------------------------------------------------------------------------------------------------


def hint_messages(question: str, solution: str) -> list[dict]:
    """The hint prompt's chat messages exactly as the CPO trainer builds them with
    :data:`~treetune_recipe.cpo.experiments.task.HINT_OVERRIDES`."""
    from treetune_recipe.cpo.teacher.hint import HintConfig

    return HintConfig(user_template=HINT_USER_TEMPLATE).chat_messages(question, solution)


def context_messages(context: str, prompt: list[dict], extra_info: dict, answer: str) -> list[dict]:
    """A row's teacher prompt under ``context`` as the trainer writes it: the hint prompt with the gold solution
    (:func:`hint_messages`), or the plain prompt whose last message is wrapped with the answer or with a right
    solution (the gold one stands in for a successful sibling)."""
    from treetune_recipe.cpo.teacher.answer import answer_teacher_message
    from treetune_recipe.cpo.teacher.sibling import sibling_teacher_message

    if context == "gold_solution":
        return hint_messages(extra_info["question"], extra_info["solution"])
    *head, last = [dict(m) for m in prompt]
    if context == "answer_only":
        content = answer_teacher_message(last["content"], answer)
    elif context == "successful_sibling":
        content = sibling_teacher_message(last["content"], extra_info["solution"])
    else:
        raise ValueError(f"no SFT prompt for context {context!r}; use one of {', '.join(SFT_CONTEXTS)}.")
    return [*head, {**last, "content": content}]


def sft_rows(rl_rows, contexts: tuple[str, ...] = SFT_CONTEXTS) -> list[dict]:
    """1 + len(contexts) SFT conversations per RL row, each ending in the gold solution: the plain prompt, then the
    row's teacher prompt under each context (the answer read from the row as the answer context reads it)."""
    from treetune_recipe.cpo.teacher.answer import row_answer

    rows = []
    for prompt, extra_info, reward in zip(
        rl_rows["prompt"], rl_rows["extra_info"], rl_rows["reward_model"], strict=True
    ):
        answer = {"role": "assistant", "content": extra_info["solution"]}
        rows.append({"messages": [*[dict(m) for m in prompt], answer]})
        for context in contexts:
            messages = context_messages(context, list(prompt), extra_info, row_answer(reward))
            rows.append({"messages": [*messages, answer]})
    return rows


def _write_sft_data(config: WarmStartConfig, data_dir: Path, out_dir: Path) -> tuple[Path, Path]:
    import pandas as pd

    folders = [data_dir] + ([data_dir / LONG_CHAIN_DATA] if config.long_chain else [])
    paths = []
    for split in ("train", "val"):
        rows = [
            row
            for folder in folders
            for row in sft_rows(pd.read_parquet(folder / f"{split}.parquet"), config.sft_contexts)
        ]
        path = out_dir / f"sft_{split}.parquet"
        pd.DataFrame(rows).to_parquet(path, index=False)
        paths.append(path)
    return paths[0], paths[1]


# ----------------------------------------------------------------------------------------------------------------------
# SFT with verl's trainer
# ----------------------------------------------------------------------------------------------------------------------


def sft_command(config: WarmStartConfig, model_dir: Path, train: Path, val: Path, work_dir: Path) -> list[str]:
    """``torchrun``-style command running upstream ``verl.trainer.sft_trainer`` on the CPU backend."""
    # SYNC WARNING: verl/trainer/config/sft_trainer_engine.yaml (keys below; checkpoint.save_contents hf_model)
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
        "-m", "verl.trainer.sft_trainer",
        f"data.train_files={train}", f"data.val_files={val}",
        f"data.train_batch_size={config.sft_batch_size}", f"data.micro_batch_size_per_gpu={config.sft_batch_size}",
        f"data.max_length={config.sft_max_length}", "data.num_workers=0",
        f"model.path={model_dir}", "+model.override_config.attn_implementation=sdpa",
        "engine.strategy=fsdp2", "trainer.device=cpu", "trainer.logger=[console]",
        f"optim.lr={config.sft_lr}", "trainer.total_epochs=1000", f"trainer.total_training_steps={config.sft_steps}",
        "trainer.resume_mode=disable", f"trainer.default_local_dir={work_dir / 'checkpoints'}",
        "checkpoint.save_contents=[model,optimizer,extra,hf_model]", f"hydra.run.dir={work_dir / 'hydra'}",
    ]  # fmt: skip


def run_sft(config: WarmStartConfig, assets_dir: Path, data_dir: Path, work_dir: Path, log_path: Path) -> Path:
    """Fine-tune the assets' model on the problems in ``data_dir``; returns the HF folder of the final checkpoint."""
    train, val = _write_sft_data(config, data_dir, work_dir)
    command = sft_command(config, assets_dir / "model", train, val, work_dir)
    env = {
        **os.environ,
        "VERL_USE_EXTERNAL_MODULES": "verl_cpu.activate",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",
    }
    with open(log_path, "w") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work_dir).returncode
    hf_dirs = sorted((work_dir / "checkpoints").glob("global_step_*/huggingface"))
    if code != 0 or not hf_dirs or not (hf_dirs[-1] / "config.json").is_file():
        tail = "\n".join(log_path.read_text().splitlines()[-30:])
        raise RuntimeError(f"verl SFT trainer failed (exit code {code}); log {log_path}:\n{tail}")
    return hf_dirs[-1]


# ----------------------------------------------------------------------------------------------------------------------
# Greedy accuracy
# ----------------------------------------------------------------------------------------------------------------------


def completion_correctness(
    model_dir: Path,
    conversations: list[list[dict]],
    answers: list[str],
    max_new_tokens: int,
    samples: int = 0,
    *,
    seed: int = 0,
) -> list[list[bool]]:
    """Per conversation, whether each completion holds the right final answer (tiny_arith grading): one greedy
    completion (``samples=0``), or ``samples`` completions sampled at temperature 1 (torch seeded with ``seed``). As
    the rollouts, only the tokenizer's ids are candidates: the output layer's padding rows are suppressed (sampled,
    they end a response in garbage)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from treetune_verl.utils.reward_score.tiny_arith import extract_answer, is_correct

    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    torch.manual_seed(seed)
    decoding = {"do_sample": True, "temperature": 1.0, "top_k": 0, "num_return_sequences": samples} if samples else {}
    padding_rows = list(range(len(tokenizer), model.config.vocab_size))
    decoding = {"do_sample": False, **decoding, **({"suppress_tokens": padding_rows} if padding_rows else {})}
    per_conversation = max(samples, 1)
    results = []
    for start in range(0, len(conversations), 32):
        texts = tokenizer.apply_chat_template(
            conversations[start : start + 32], tokenize=False, add_generation_prompt=True
        )
        inputs = tokenizer(
            texts, return_tensors="pt", padding=True, add_special_tokens=False, return_token_type_ids=False
        )
        with torch.no_grad():
            output = model.generate(**inputs, max_new_tokens=max_new_tokens, **decoding)
        completions = tokenizer.batch_decode(output[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        for k, answer in enumerate(answers[start : start + 32]):
            group = completions[k * per_conversation : (k + 1) * per_conversation]
            results.append([bool(is_correct(extract_answer(completion), answer)) for completion in group])
    return results


def greedy_accuracy(model_dir: Path, conversations: list[list[dict]], answers: list[str], max_new_tokens: int) -> float:
    """Share of ``conversations`` whose greedy completion holds the right final answer (tiny_arith grading)."""
    results = completion_correctness(model_dir, conversations, answers, max_new_tokens)
    return sum(correct for (correct,) in results) / len(conversations)


def measure_accuracy(model_dir: Path, val_parquet: Path, max_new_tokens: int) -> dict[str, float]:
    """Greedy accuracy on the validation prompts, plain and with the hint prompt."""
    import pandas as pd

    rows = pd.read_parquet(val_parquet)
    answers = [str(reward["ground_truth"]) for reward in rows["reward_model"]]
    plain = [[dict(m) for m in prompt] for prompt in rows["prompt"]]
    hinted = [hint_messages(info["question"], info["solution"]) for info in rows["extra_info"]]
    return {
        "val_acc_plain": greedy_accuracy(model_dir, plain, answers, max_new_tokens),
        "val_acc_hint": greedy_accuracy(model_dir, hinted, answers, max_new_tokens),
    }


def check_mixed_groups(info: dict, acc_range: tuple[float, float] = MIXED_GROUPS_ACC_RANGE) -> None:
    """Raise :class:`WarmStartGateError` unless the plain greedy accuracy lies in ``acc_range``."""
    low, high = acc_range
    accuracy = info["val_acc_plain"]
    if not low <= accuracy <= high:
        raise WarmStartGateError(
            f"the warm start's greedy validation accuracy on plain prompts is {accuracy:.3f}, outside "
            f"[{low:.2f}, {high:.2f}]: RL would see too few mixed prompt groups (all wrong or all right). "
            f"Change the warm start (WarmStartConfig.sft_steps, the task's min_ops/max_ops/max_answer) in "
            f"treetune_recipe/cpo/experiments/warm_start.py; the build is {info.get('path', '?')}."
        )


# ----------------------------------------------------------------------------------------------------------------------
# Build and cache
# ----------------------------------------------------------------------------------------------------------------------


def build_warm_start(
    config: WarmStartConfig = DEFAULT_WARM_START,
    cache_root: Path | str | None = None,
    *,
    force: bool = False,
    rebuild: bool = False,
) -> Path:
    """The warm start of ``config``: the shipped model for a config of :data:`SHIPPED_BUILDS` (hash-checked at every
    call), otherwise (or with ``rebuild``) an SFT build, found in the cache or made.

    Returns:
        ``<cache_root>/warm_start/<hash>/`` (SFT build) or ``<cache_root>/warm_start/<hash>-shipped/`` with
        ``model/`` (float32 HF model, tokenizer, generation config), ``data/`` (the task's train/val/test parquet
        files, copied from the assets), ``build_info.json`` (config, source, accuracies measured on this machine;
        SFT wall time for a build) and, for a build, ``sft.log``.
    """
    cache_root = Path(cache_root) if cache_root is not None else default_cache_root()
    shipped = config in SHIPPED_BUILDS and not rebuild
    final_dir = cache_root / "warm_start" / (warm_start_hash(config) + ("-shipped" if shipped else ""))
    if not (final_dir.is_dir() and not force):
        assets_dir = build_tiny_assets(cache_root, config=config.assets)
        write = _write_shipped_warm_start if shipped else _write_warm_start
        build_cached(final_dir, functools.partial(write, config, assets_dir), force=force)
    if shipped:
        check_shipped_weights(final_dir / "model" / "model.safetensors", config)
    return final_dir


def _write_shipped_warm_start(config: WarmStartConfig, assets_dir: Path, out_dir: Path) -> None:
    """The assets' model folder and data with the shipped weights (both hash-checked) in ``out_dir``, and its accuracy
    measured here."""
    weights = SHIPPED_BUILDS[config][0]
    check_shipped_weights(weights, config)
    vocab = vocab_sha256(assets_dir / "model")
    if vocab != SHIPPED_VOCAB_SHA256:
        raise WarmStartIntegrityError(
            f"the tiny assets' tokenizer ({assets_dir / 'model'}) has vocabulary sha256 {vocab}, but the shipped "
            f"weights were trained with {SHIPPED_VOCAB_SHA256}: the tokenizer build changed. Rebuild the warm start "
            "(python -m treetune_scripts.experiments.warm_start --rebuild) or restore the tokenizer build."
        )
    shutil.copytree(assets_dir / "model", out_dir / "model")
    shutil.copy2(weights, out_dir / "model" / "model.safetensors")
    _copy_data(config, assets_dir, out_dir / "data")
    _write_build_info(config, out_dir, source=f"shipped ({SHIPPED_DIR.name}/{weights.name}, sha256 checked)")


def _copy_data(config: WarmStartConfig, assets_dir: Path, data_dir: Path) -> None:
    """The assets' problems, and the long regime's in ``long_chain/`` when the config has one."""
    shutil.copytree(assets_dir / "data", data_dir)
    if config.long_chain is not None:
        write_task_data(config.long_chain.assets(config.assets), data_dir / LONG_CHAIN_DATA)


def _write_build_info(config: WarmStartConfig, out_dir: Path, **fields) -> None:
    import torch
    from safetensors.torch import load_file

    weights = load_file(out_dir / "model" / "model.safetensors")
    info = {
        "builder": WARM_START_VERSION,
        "trainer": "verl.trainer.sft_trainer (CPU backend, torch.distributed.run, 1 process)",
        "config": dataclasses.asdict(config),
        "parameters": sum(t.numel() for name, t in weights.items() if name != "lm_head.weight"),
        "weights_sha256": file_sha256(out_dir / "model" / "model.safetensors"),
        "torch": torch.__version__,
        **fields,
        **measure_accuracy(out_dir / "model", out_dir / "data" / "val.parquet", config.eval_max_new_tokens),
    }
    (out_dir / "build_info.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def _write_warm_start(config: WarmStartConfig, assets_dir: Path, out_dir: Path) -> None:
    """Run the SFT from the assets in ``assets_dir`` and write the warm start's files into ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    _copy_data(config, assets_dir, out_dir / "data")
    started = time.monotonic()
    hf_dir = run_sft(config, assets_dir, out_dir / "data", out_dir, out_dir / "sft.log")
    sft_wall_s = time.monotonic() - started
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    model.save_pretrained(out_dir / "model")
    AutoTokenizer.from_pretrained(assets_dir / "model").save_pretrained(out_dir / "model")
    GenerationConfig.from_pretrained(assets_dir / "model").save_pretrained(out_dir / "model")
    for leftover in ("checkpoints", "hydra", "sft_train.parquet", "sft_val.parquet"):
        target = out_dir / leftover
        shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
    _write_build_info(config, out_dir, source="SFT build on this machine", sft_wall_s=round(sft_wall_s, 1))


def write_first_prompts(warm_start_dir: Path, path: Path, count: int) -> Path:
    """The first ``count`` rows of the warm start's training set (same schema) as one parquet file at ``path``.

    A small fixed prompt set, used as both training and validation set, shows RL fitting prompts it sees many times
    within minutes on a CPU (the GRPO-learns test, the demo); it says nothing about held-out prompts.
    """
    import pandas as pd

    rows = pd.read_parquet(Path(warm_start_dir) / "data" / "train.parquet").head(count)
    if len(rows) < count:
        raise ValueError(f"the warm start has {len(rows)} training prompts, fewer than the {count} asked for.")
    path.parent.mkdir(parents=True, exist_ok=True)
    rows.to_parquet(path, index=False)
    return path


def describe_warm_start(info: dict) -> str:
    """One line naming the warm start a run trains from: source, weights hash, accuracies measured here, folder."""
    sha = info.get("weights_sha256", "?")[:16]
    return (
        f"warm start: {info.get('source', 'SFT build')}, weights sha256 {sha}…, {info['parameters']} parameters; "
        f"greedy val acc {info['val_acc_plain']:.3f} plain, {info['val_acc_hint']:.3f} with the hint; {info['path']}"
    )


def read_build_info(warm_start_dir: Path) -> dict:
    info = json.loads((Path(warm_start_dir) / "build_info.json").read_text())
    info["path"] = str(warm_start_dir)
    return info


def ship_weights(warm_start_dir: Path, config: WarmStartConfig = DEFAULT_WARM_START) -> str:
    """Copy the weights of a rebuilt warm start (``--rebuild --ship``) over ``config``'s shipped file; returns the line
    that names the hashes to record in this module."""
    target = SHIPPED_BUILDS[config][0]
    shutil.copy2(Path(warm_start_dir) / "model" / "model.safetensors", target)
    return (
        f"copied to {target}; in {__file__} set its SHA-256 to {file_sha256(target)!r} "
        f"and SHIPPED_VOCAB_SHA256 = {vocab_sha256(Path(warm_start_dir) / 'model')!r}"
    )
