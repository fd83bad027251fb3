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
"""Does SDPO's teacher pull the student towards ending early? A probe of the warm start, before any update.

The student samples responses at temperature 1 (as the rollouts), graded by the task's reward. Every registered
teacher context (``teacher.contexts.CONTEXTS``) builds its teacher batch with the trainer's call
(``TeacherContext.build``, as ``RayCPOTrainer._build_teacher_rows``; the lengths of
:mod:`treetune_recipe.cpo.experiments.task`, the experiment's hint wording), one prompt kind per context that gives
some row a context (:func:`context_batches`; the task's reward returns no feedback, so ``environment_feedback`` gives
none and is left out): ``successful_sibling`` (SDPO's batch), ``gold_solution`` (the hint prompt the CPO and OPSD
teachers read, which the warm start's SFT saw) and ``answer_only`` (the answer in SDPG's wording, RLSD's published
context). The rows with a sibling (SDPO's loss rows) that every kind holds are measured; with two more texts in SDPO's
wrapper (``teacher.sibling.sibling_teacher_message``): ``wrapper: gold`` (the problem's worked solution) and
``wrapper: empty`` (an empty text).
Per prompt kind (the student's plain prompt, then each teacher variant): (a) the probability of ending early,
p(first token of `` \\boxed``) + p(end of turn), at the student's intermediate step boundaries (the token after its
k-th step-ending ``.``, k < the problem's number of operations); (b) responses the prompt samples itself (the
student's own rollouts; for a teacher, as many from one teacher prompt per group): mean length in tokens, ``=``
steps and accuracy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from verl import DataProto

from treetune_recipe.cpo.experiments.task import (
    HINT_OVERRIDES,
    HINT_USER_TEMPLATE,
    LONG_CHAIN_OVERRIDES,
    TASK_RL_OVERRIDES,
    override_value,
)
from treetune_recipe.cpo.methods.advantage_terms import DEFAULT_SUCCESS_VALUE, succeeded
from treetune_recipe.cpo.teacher.contexts import CONTEXTS
from treetune_recipe.cpo.teacher.hint import HintConfig, left_pad, reprompted_batch
from treetune_recipe.cpo.teacher.sibling import sibling_teacher_message
from treetune_verl.utils.reward_score.tiny_arith import compute_binary_score

#: The context whose rows are measured: SDPO's loss rows.
MEASURED_CONTEXT = "successful_sibling"
#: Texts put into SDPO's wrapper besides the sibling: prompt kind -> the text of a problem's group.
WRAPPED_TEXTS = ("wrapper: gold", "wrapper: empty")
DEFAULT_PROMPTS = 64
DEFAULT_SAMPLES = 8


@dataclasses.dataclass(frozen=True)
class ProbeLengths:
    """A regime's lengths: data.max_prompt_length, data.max_response_length (new tokens of every sample) and the
    teacher prompt's width limit (cpo.hint.max_prompt_length)."""

    max_prompt_length: int
    max_new_tokens: int
    teacher_max_prompt_length: int

    @classmethod
    def of(cls, overrides: Sequence[str]) -> ProbeLengths:
        return cls(
            override_value(overrides, "data.max_prompt_length"),
            override_value(overrides, "data.max_response_length"),
            override_value(overrides, "cpo.hint.max_prompt_length"),
        )


#: The probe's regimes: where its prompts come from and the lengths the experiment's runs use there.
REGIME_LENGTHS = {
    "hard": ProbeLengths.of([*TASK_RL_OVERRIDES, *HINT_OVERRIDES]),
    "long": ProbeLengths.of([*TASK_RL_OVERRIDES, *HINT_OVERRIDES, *LONG_CHAIN_OVERRIDES]),
}


@dataclasses.dataclass(frozen=True)
class PromptStats:
    """One prompt kind: mean p(end early) at the student's intermediate step boundaries (all; those after step ops-1,
    i.e. before the last step), and its own samples' mean length (tokens), ``=`` count and accuracy."""

    name: str
    early_end: float
    early_end_last: float
    length: float
    steps: float
    accuracy: float

    def table_row(self) -> str:
        numbers = zip((self.early_end, self.early_end_last, self.length, self.steps, self.accuracy), (3, 3, 1, 2, 3))
        return f"| {self.name} | " + " | ".join(f"{value:.{digits}f}" for value, digits in numbers) + " |"


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """The probe of :func:`run_probe`: the student's plain prompt first, then one row per context variant."""

    prompts: int
    samples: int
    seed: int
    context_rows: int
    context_groups: int
    boundaries: int
    rows: tuple[PromptStats, ...]

    def format_table(self) -> str:
        head = (
            f"{self.prompts} prompts x {self.samples} samples (seed {self.seed}): {self.context_rows} rows with an "
            f"SDPO context in {self.context_groups} groups, {self.boundaries} intermediate step boundaries\n\n"
            "| prompt | p(end early) after a step | after step ops-1 | sampled length | `=` steps | accuracy |\n"
            "|---|---|---|---|---|---|\n"
        )
        return head + "\n".join(stats.table_row() for stats in self.rows)


def step_boundaries(response: Sequence[int], step_end_id: int, ops: int) -> list[int]:
    """Positions in ``response`` right after each of its first ``ops - 1`` step ends (``step_end_id``): the token that
    follows an intermediate step, where the student goes on and an early stop would skip the remaining steps."""
    ends = [t + 1 for t, token in enumerate(response) if token == step_end_id][: max(ops - 1, 0)]
    return [t for t in ends if t < len(response)]


def early_end_ids(tokenizer) -> tuple[int, int]:
    """(first token of `` \\boxed``, end of turn): the two ways a response stops stepping."""
    return tokenizer(" \\boxed", add_special_tokens=False)["input_ids"][0], tokenizer.eos_token_id


def pack_batch(
    tokenizer,
    prompts: Sequence[list[int]],
    responses: Sequence[list[int]],
    raw_prompts,
    uids,
    extra_infos=None,
    reward_models=None,
) -> DataProto:
    """The rollout batch's layout: left-padded prompts, right-padded responses (``response_mask`` through the end of
    turn), positions 0.. from each prompt's first token; ``uid``, ``raw_prompt``, ``extra_info`` (default: empty) and,
    when given, ``reward_model`` (``{style, ground_truth}``) as verl's dataset keeps them."""
    pad = tokenizer.pad_token_id
    prompt_ids, prompt_len = left_pad(prompts, max(map(len, prompts)), pad)
    width = max(map(len, responses))
    response_ids = pad_sequence([torch.tensor(r) for r in responses], batch_first=True, padding_value=pad)
    response_mask = pad_sequence([torch.ones(len(r), dtype=torch.long) for r in responses], batch_first=True)
    prompt_mask = (torch.arange(prompt_ids.shape[1]) >= prompt_ids.shape[1] - prompt_len[:, None]).long()
    position_ids = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    tensors = {
        "prompts": prompt_ids,
        "responses": response_ids,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompt_ids, response_ids], 1),
        "attention_mask": torch.cat([prompt_mask, response_mask], 1),
        "position_ids": torch.cat([position_ids, prompt_len[:, None] + torch.arange(width)], 1),
    }
    raw, extra = np.empty(len(raw_prompts), dtype=object), np.empty(len(raw_prompts), dtype=object)
    for row, messages in enumerate(raw_prompts):
        raw[row] = list(messages)
        extra[row] = dict(extra_infos[row]) if extra_infos is not None else {}
    non_tensors = {"uid": np.array(uids, dtype=object), "raw_prompt": raw, "extra_info": extra}
    if reward_models is not None:
        non_tensors["reward_model"] = np.empty(len(raw_prompts), dtype=object)
        for row, reward_model in enumerate(reward_models):
            non_tensors["reward_model"][row] = dict(reward_model)
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


def context_batches(
    batch: DataProto, success: torch.Tensor, tokenizer, hint_config: HintConfig
) -> dict[str, tuple[DataProto, torch.Tensor]]:
    """Context name -> ``(teacher batch, has_context)`` of every registered context that gives some row of ``batch``
    a context, in the registry's order, each built by the trainer's call (``TeacherContext.build``, default knobs)."""
    built = {}
    for name, context in CONTEXTS.items():
        teacher_batch, has_context, _ = context.build(
            batch, tokenizer=tokenizer, hint_config=hint_config, success=success, chat_template_kwargs=None
        )
        if has_context.any():
            built[name] = (teacher_batch, has_context)
    return built


def chat_ids(tokenizer, messages) -> list[int]:
    """The chat template's prompt ids of ``messages`` (generation prompt on, no template kwargs), as verl's dataset."""
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)


def wrapped_teacher_batch(batch: DataProto, texts: Sequence[str | None], tokenizer, max_prompt_length: int):
    """``batch`` with row i's prompt holding ``texts[i]`` in SDPO's wrapper (its chat, the last message through
    ``sibling_teacher_message``), as ``teacher.contexts.build_sibling_batch`` holds a sibling's text. A row whose text
    is
    None or whose prompt would exceed ``max_prompt_length`` keeps its own prompt. Returns ``(batch, has_context)``."""
    rows, has_context = [], torch.zeros(len(batch), dtype=torch.bool)
    for row, text in enumerate(texts):
        messages = [dict(message) for message in batch.non_tensor_batch["raw_prompt"][row]]
        messages[-1]["content"] = sibling_teacher_message(str(messages[-1]["content"]), text or "")
        ids = chat_ids(tokenizer, messages)
        has_context[row] = text is not None and len(ids) <= max_prompt_length
        rows.append(ids if has_context[row] else prompt_of(batch, row))
    prompts, lengths = left_pad(rows, max(map(len, rows)), tokenizer.pad_token_id)
    return reprompted_batch(batch, prompts, lengths), has_context


@torch.no_grad()
def mass_at(model, batch: DataProto, spots: Sequence[tuple[int, int]], token_ids: Sequence[int]) -> torch.Tensor:
    """``[len(spots)]``: at each ``(row, t)``, the probability (softmax over the whole output layer, as verl's log-prob
    pass) of ``token_ids`` as response token t of ``row``, given its prompt and response tokens before t."""
    rows = sorted({row for row, _ in spots})
    sub, width = batch[rows], batch.batch["prompts"].shape[1]
    inputs = {key: sub.batch[key] for key in ("input_ids", "attention_mask", "position_ids")}
    logits = torch.cat([model(**{k: v[i : i + 64] for k, v in inputs.items()}).logits for i in range(0, len(sub), 64)])
    index = torch.tensor([[rows.index(row), width - 1 + t] for row, t in spots], dtype=torch.long).reshape(-1, 2)
    return torch.softmax(logits[index[:, 0], index[:, 1]].float(), -1)[:, list(token_ids)].sum(-1)


def prompt_of(batch: DataProto, row: int) -> list[int]:
    """Row ``row``'s prompt ids, padding dropped."""
    width = batch.batch["prompts"].shape[1]
    return batch.batch["prompts"][row][batch.batch["attention_mask"][row, :width].bool()].tolist()


@torch.no_grad()
def sample(
    model, tokenizer, prompts: Sequence[list[int]], n: int, seed: int, max_new_tokens: int, chunk: int = 32
) -> list[list[list[int]]]:
    """``n`` responses per prompt at temperature 1 (torch seeded with ``seed``; top-k off; padding rows of the output
    layer suppressed), each through its first end of turn or ``max_new_tokens`` tokens."""
    torch.manual_seed(seed)
    eos, padding_rows = tokenizer.eos_token_id, list(range(len(tokenizer), model.config.vocab_size))
    kwargs = dict(do_sample=True, temperature=1.0, top_k=0, num_return_sequences=n, max_new_tokens=max_new_tokens)
    kwargs.update(eos_token_id=eos, pad_token_id=tokenizer.pad_token_id, suppress_tokens=padding_rows or None)
    groups = []
    for start in range(0, len(prompts), chunk):
        part = prompts[start : start + chunk]
        ids, lengths = left_pad(part, max(map(len, part)), tokenizer.pad_token_id)
        mask = (torch.arange(ids.shape[1]) >= ids.shape[1] - lengths[:, None]).long()
        out = model.generate(input_ids=ids, attention_mask=mask, **kwargs)[:, ids.shape[1] :]
        responses = [r[: r.index(eos) + 1] if eos in r else r for r in out.tolist()]
        groups += [responses[k * n : (k + 1) * n] for k in range(len(lengths))]
    return groups


def _sample_stats(name: str, early_end: tuple[float, float], tokenizer, groups, answers) -> PromptStats:
    texts = [(tokenizer.decode(r, skip_special_tokens=True), len(r), a) for g, a in zip(groups, answers) for r in g]
    values = np.array([(n, t.count("="), _score(t, a)["acc"]) for t, n, a in texts], dtype=float).reshape(-1, 3)
    return PromptStats(name, *early_end, *map(float, values.mean(0) if len(values) else [float("nan")] * 3))


def _score(text: str, answer: str) -> dict:
    return compute_binary_score("tiny_arith", text, answer)  # the task's reward (TASK_RL_OVERRIDES)


def run_probe(
    warm_dir: Path | None = None,
    prompts_parquet: Path | None = None,
    n_prompts: int = DEFAULT_PROMPTS,
    samples: int = DEFAULT_SAMPLES,
    seed: int = 0,
    regime: str = "hard",
) -> ProbeResult:
    """The probe on the first ``n_prompts`` rows of ``prompts_parquet`` (default: the regime's training prompts of
    ``warm_dir``: the hard prompts, or the long-chain ones; default warm start :data:`EXPERIMENT_WARM_START`'s), with
    the regime's lengths (:data:`REGIME_LENGTHS`)."""
    import pandas as pd
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from treetune_recipe.cpo.experiments.hard_prompts import select_hard_prompts
    from treetune_recipe.cpo.experiments.warm_start import EXPERIMENT_WARM_START, LONG_CHAIN_DATA, build_warm_start

    lengths = REGIME_LENGTHS[regime]
    warm_dir = Path(warm_dir) if warm_dir is not None else Path(build_warm_start(EXPERIMENT_WARM_START))
    if prompts_parquet is None:
        long_train = warm_dir / "data" / LONG_CHAIN_DATA / "train.parquet"
        prompts_parquet = long_train if regime == "long" else select_hard_prompts(warm_dir).train
    rows = pd.read_parquet(prompts_parquet).head(n_prompts)
    tokenizer = AutoTokenizer.from_pretrained(warm_dir / "model")
    model = AutoModelForCausalLM.from_pretrained(warm_dir / "model", dtype=torch.float32).eval()
    raw = [[dict(message) for message in prompt] for prompt in rows["prompt"]]
    answers = [str(reward["ground_truth"]) for reward in rows["reward_model"]]
    solutions = [str(info["solution"]) for info in rows["extra_info"]]
    plain = [chat_ids(tokenizer, messages) for messages in raw]
    groups = sample(model, tokenizer, plain, samples, seed, lengths.max_new_tokens)

    group_of = [g for g in range(len(raw)) for _ in range(samples)]
    responses = [r for group in groups for r in group]
    extra = [dict(rows["extra_info"].iloc[g]) for g in group_of]
    reward_models = [dict(rows["reward_model"].iloc[g]) for g in group_of]
    batch = pack_batch(
        tokenizer, [plain[g] for g in group_of], responses, [raw[g] for g in group_of], group_of, extra, reward_models
    )
    texts = [tokenizer.decode(r, skip_special_tokens=True) for r in responses]
    rewards = torch.tensor([_score(t, answers[g])["score"] for t, g in zip(texts, group_of)])
    hint_config = HintConfig.from_config(
        {"max_prompt_length": lengths.teacher_max_prompt_length, "user_template": HINT_USER_TEMPLATE}
    ).resolve(lengths.max_prompt_length)
    built = context_batches(batch, succeeded(rewards, DEFAULT_SUCCESS_VALUE), tokenizer, hint_config)
    teacher = {name: teacher_batch for name, (teacher_batch, _) in built.items()}
    has_context = built[MEASURED_CONTEXT][1].clone() if MEASURED_CONTEXT in built else torch.zeros(len(batch)).bool()
    for _, rows_with_context in built.values():
        has_context &= rows_with_context
    for name, text_of in zip(WRAPPED_TEXTS, (lambda g: solutions[g], lambda g: "")):
        texts_v = [text_of(g) if has_context[b] else None for b, g in enumerate(group_of)]
        teacher[name], fits = wrapped_teacher_batch(batch, texts_v, tokenizer, lengths.teacher_max_prompt_length)
        has_context &= fits

    dot = tokenizer(".", add_special_tokens=False)["input_ids"]
    assert len(dot) == 1, f"'.' is not one token: {dot}"
    ops = [solution.count("=") for solution in solutions]
    measured = [b for b in range(len(batch)) if has_context[b]]
    found = {b: step_boundaries(responses[b], dot[0], ops[group_of[b]]) for b in measured}
    spots = [(b, t) for b in measured for t in found[b]]
    last = torch.tensor([k == ops[group_of[b]] - 2 for b in measured for k in range(len(found[b]))], dtype=torch.bool)
    groups_in = sorted({group_of[b] for b in measured})
    first_rows = [min(b for b in measured if group_of[b] == g) for g in groups_in]
    answers_in = [answers[g] for g in groups_in]

    def early_end(probe_batch: DataProto) -> tuple[float, float]:
        mass = mass_at(model, probe_batch, spots, early_end_ids(tokenizer)) if spots else torch.zeros(0)
        return mass.mean().item(), mass[last].mean().item()  # nan when empty

    stats = [_sample_stats("plain (student)", early_end(batch), tokenizer, [groups[g] for g in groups_in], answers_in)]
    for name in teacher:
        prompts = [prompt_of(teacher[name], b) for b in first_rows]
        own_samples = sample(model, tokenizer, prompts, samples, seed, lengths.max_new_tokens) if prompts else []
        stats.append(_sample_stats(name, early_end(teacher[name]), tokenizer, own_samples, answers_in))
    return ProbeResult(len(raw), samples, seed, len(measured), len(groups_in), len(spots), tuple(stats))
