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
"""The hard regime's prompts: the task's problems that a warm start fails in every one of several samples.

Hint-guided methods claim their gain where GRPO has no signal: prompt groups whose responses are all wrong. The hard
regime keeps the default regime's warm start and trains and validates it on the problems it fails:

- **Selection** (:func:`select_hard_prompts`): :data:`SELECTION_SAMPLES` responses per prompt, sampled as the rollout
  samples (temperature 1, only the tokenizer's ids), for every training prompt and every held-out one (the warm
  start's validation and test splits); a prompt is hard when none of its responses is right.
- **Gate** (:func:`check_hard_regime`): a fresh sample (another seed) of the first :data:`GATE_PROMPTS` hard training
  prompts must leave at least :data:`ALL_WRONG_MIN` of their groups all wrong, which estimates the share GRPO sees at
  its first step without the selection's own luck, and the hint must still help: greedy accuracy on the hard held-out
  prompts at least :data:`HINT_GAIN_MIN` higher with the hint than without.

Cached in the warm start's folder (``hard_prompts/``: ``train.parquet``, ``val.parquet`` in the task's schema and
``info.json``).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from treetune_recipe.cpo.experiments.task import RegimePrompts
from treetune_recipe.cpo.experiments.warm_start import WarmStartGateError, completion_correctness, measure_accuracy
from treetune_verl.tiny_assets import build_cached

#: Responses sampled per prompt to call it hard (none right) and, in the gate, to count all-wrong groups; as many as
#: the experiment's rollout samples per prompt.
SELECTION_SAMPLES = 8
SELECTION_SEED = 0
GATE_SEED = 1
GATE_PROMPTS = 128
#: The regime asks for at least half of GRPO's groups all wrong at step 1. One step holds 16 groups, whose all-wrong
#: share varies by about ±0.12 around its expectation; the gate asks for a margin above one half.
ALL_WRONG_MIN = 0.6
#: Greedy accuracy gain the hint must give on the hard held-out prompts.
HINT_GAIN_MIN = 0.2
HELD_OUT_SPLITS = ("val", "test")
FOLDER = "hard_prompts"


def select_hard_prompts(warm_start_dir: Path) -> RegimePrompts:
    """The warm start's hard training and held-out prompts (built once, then read from ``<warm_start>/hard_prompts``).

    ``info.json`` holds the pool and selected counts per split and the gate's measurements: ``all_wrong_frac`` and
    ``correct_frac`` of the fresh sample, ``val_acc_plain`` and ``val_acc_hint`` (greedy, hard held-out prompts).
    """
    warm_start_dir = Path(warm_start_dir)
    folder = build_cached(warm_start_dir / FOLDER, functools.partial(_write_hard_prompts, warm_start_dir))
    info = json.loads((folder / "info.json").read_text())
    return RegimePrompts(train=folder / "train.parquet", val=folder / "val.parquet", info=info)


def _write_hard_prompts(warm_start_dir: Path, out_dir: Path) -> None:
    import pandas as pd

    model_dir = warm_start_dir / "model"
    max_new_tokens = json.loads((warm_start_dir / "build_info.json").read_text())["config"]["eval_max_new_tokens"]

    def never_right(rows) -> list[bool]:
        groups = completion_correctness(
            model_dir, _plain(rows), _answers(rows), max_new_tokens, SELECTION_SAMPLES, seed=SELECTION_SEED
        )
        return [not any(group) for group in groups]

    data = warm_start_dir / "data"
    train_pool = pd.read_parquet(data / "train.parquet")
    held_out_pool = pd.concat(
        [
            pd.read_parquet(data / f"{split}.parquet")
            for split in HELD_OUT_SPLITS
            if (data / f"{split}.parquet").is_file()
        ],
        ignore_index=True,
    )
    train = train_pool[never_right(train_pool)].reset_index(drop=True)
    val = held_out_pool[never_right(held_out_pool)].reset_index(drop=True)
    train.to_parquet(out_dir / "train.parquet", index=False)
    val.to_parquet(out_dir / "val.parquet", index=False)

    gate_rows = train.head(GATE_PROMPTS)
    fresh = completion_correctness(
        model_dir, _plain(gate_rows), _answers(gate_rows), max_new_tokens, SELECTION_SAMPLES, seed=GATE_SEED
    )
    info = {
        "selection": f"no right response in {SELECTION_SAMPLES} samples at temperature 1 (seed {SELECTION_SEED})",
        "train_pool": len(train_pool),
        "train_prompts": len(train),
        "val_pool": len(held_out_pool),
        "val_prompts": len(val),
        "gate_prompts": len(gate_rows),
        "all_wrong_frac": sum(not any(group) for group in fresh) / len(fresh),
        "correct_frac": sum(map(sum, fresh)) / (len(fresh) * SELECTION_SAMPLES),
        **measure_accuracy(model_dir, out_dir / "val.parquet", max_new_tokens),  # val_acc_plain, val_acc_hint
    }
    (out_dir / "info.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def _plain(rows) -> list[list[dict]]:
    return [[dict(message) for message in prompt] for prompt in rows["prompt"]]


def _answers(rows) -> list[str]:
    return [str(reward["ground_truth"]) for reward in rows["reward_model"]]


def check_hard_regime(info: dict) -> None:
    """Raise :class:`WarmStartGateError` unless most fresh groups on the hard prompts are all wrong and the hint helps.

    Args:
        info: :attr:`RegimePrompts.info`.
    """
    problems = []
    if info["all_wrong_frac"] < ALL_WRONG_MIN:
        problems.append(
            f"only {info['all_wrong_frac']:.3f} of the freshly sampled groups of the hard training prompts are all "
            f"wrong (need >= {ALL_WRONG_MIN})"
        )
    gain = info["val_acc_hint"] - info["val_acc_plain"]
    if gain < HINT_GAIN_MIN:
        problems.append(
            f"the hint raises greedy accuracy on the hard held-out prompts by {gain:.3f} ({info['val_acc_plain']:.3f} "
            f"-> {info['val_acc_hint']:.3f}), less than {HINT_GAIN_MIN}"
        )
    if problems:
        raise WarmStartGateError(
            f"the warm start is not in the hard regime: {'; '.join(problems)}. Change the regime's warm start or "
            f"selection in treetune_recipe/cpo/experiments/ (REGIMES, hard_prompts.py)."
        )


def describe(info: dict) -> str:
    """One paragraph for the experiment's log and summary."""
    return (
        f"Hard prompts: {info['train_prompts']} of {info['train_pool']} training and {info['val_prompts']} of "
        f"{info['val_pool']} held-out prompts got no right response in {SELECTION_SAMPLES} samples of the warm start. "
        f"A fresh sample of {info['gate_prompts']} of the hard training prompts: {info['all_wrong_frac']:.3f} of the "
        f"groups all wrong, {info['correct_frac']:.3f} of the responses right. Greedy accuracy on the hard held-out "
        f"prompts: {info['val_acc_plain']:.3f} plain, {info['val_acc_hint']:.3f} with the hint."
    )
