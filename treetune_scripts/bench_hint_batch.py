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
"""Benchmark: CPO hint-batch builder (one render per prompt group, batched) vs a per-row loop, on one CPU core.

The batch has the shape of the reference runs: 1024 prompts x n=8 rollouts, prompt width 2048, response width 4096
(synthetic response ids), shuffled rows as after ``balance_batch``, questions of 150-600 characters and gold
solutions of 400-2000 characters. The tokenizer is a byte-level BPE trained locally (Qwen3-style chat template).

The per-row baseline follows the reference's loop: for every row, decode the padded prompt, cut the question out of
the decoded text, render and tokenize the hint messages, left-pad, and build the row's tensors; rows are stacked at
the end. It is timed on a subset of rows (``--baseline-rows``) and extrapolated linearly, which the table states.

Usage::

    python -m treetune_scripts.bench_hint_batch [--prompts 1024] [--n 8] [--baseline-rows 512]

Targets (issue 4): >= 20x the per-row rows/s, and < 2 s for the whole batch.
"""

from __future__ import annotations

import argparse
import os

# One CPU core: pin the process, and keep torch and the Rust tokenizer from spawning worker threads.
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"
if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

import random  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.utils.model import compute_position_id_with_mask  # noqa: E402

from treetune_recipe.cpo.cpo_hint import HintConfig, build_hint_batch, fill_user_template  # noqa: E402
from treetune_scripts.make_tiny_assets import build_tokenizer  # noqa: E402

SYSTEM = "You are a helpful assistant."
INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{}."
_WORDS = (
    "let the function be defined for every real number such that its value at each point equals the sum of the "
    "previous two terms and we want to find the smallest positive integer for which the sequence is divisible by "
    "seven so we compute the remainder modulo each prime and combine the results with the chinese remainder theorem"
).split()
_MATH = [
    "$x^2 + 5x + 6 = 0$",
    "\\frac{3}{4}",
    "$\\sqrt{17}$",
    "$a_n = a_{n-1} + a_{n-2}$",
    "$2^{10} = 1024$",
    "\\pi r^2",
]


def _text(rng: random.Random, num_chars: int) -> str:
    pieces, size = [], 0
    while size < num_chars:
        piece = rng.choice(_MATH) if rng.random() < 0.15 else rng.choice(_WORDS)
        pieces.append(piece)
        size += len(piece) + 1
    return " ".join(pieces)


def make_problems(num_prompts: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    problems = []
    for index in range(num_prompts):
        question = _text(rng, rng.randint(150, 600)) + "?"
        solution = _text(rng, rng.randint(400, 2000)) + f" So the answer is \\boxed{{{rng.randint(1, 999)}}}."
        problems.append({"index": index, "question": question, "solution": solution})
    return problems


def make_batch(tokenizer, problems, n: int, prompt_width: int, response_width: int, seed: int = 0) -> DataProto:
    """verl-shaped batch after compute_advantage: interleaved rollouts, rows shuffled like balance_batch does."""
    generator = torch.Generator().manual_seed(seed)
    num_rows = len(problems) * n
    pad = tokenizer.pad_token_id
    prompts = torch.full((num_rows, prompt_width), pad)
    prompt_mask = torch.zeros((num_rows, prompt_width), dtype=torch.long)
    conversations = [
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": p["question"] + INSTRUCTION}]
        for p in problems
    ]
    texts = tokenizer.apply_chat_template(conversations, tokenize=False, add_generation_prompt=True)
    for k, ids in enumerate(tokenizer(texts, add_special_tokens=False)["input_ids"]):
        prompts[k * n : (k + 1) * n, prompt_width - len(ids) :] = torch.tensor(ids)
        prompt_mask[k * n : (k + 1) * n, prompt_width - len(ids) :] = 1
    lengths = torch.randint(1, response_width + 1, (num_rows,), generator=generator)
    response_mask = (torch.arange(response_width)[None, :] < lengths[:, None]).long()
    responses = torch.randint(3, len(tokenizer), (num_rows, response_width), generator=generator)
    responses = torch.where(response_mask.bool(), responses, torch.full_like(responses, pad))
    attention_mask = torch.cat([prompt_mask, response_mask], dim=-1)
    order = torch.randperm(num_rows, generator=generator)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompts, responses], dim=-1),
        "attention_mask": attention_mask,
        "position_ids": compute_position_id_with_mask(attention_mask),
    }
    uids = np.array([str(uuid.UUID(int=k + 1)) for k in range(len(problems)) for _ in range(n)], dtype=object)
    extra_info = np.array([p for p in problems for _ in range(n)], dtype=object)
    return DataProto.from_dict(
        tensors={key: value[order] for key, value in tensors.items()},
        non_tensors={"uid": uids[order.numpy()], "extra_info": extra_info[order.numpy()]},
        meta_info={"temperature": 1.0},
    )


def per_row_hint_tensors(batch: DataProto, tokenizer, config: HintConfig, rows: range) -> dict[str, torch.Tensor]:
    """Baseline modelled on the reference: decode, cut out the question, render, tokenize and pad, row by row."""
    width = config.max_prompt_length
    pad = tokenizer.pad_token_id
    user_header = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
    out = {"prompts": [], "input_ids": [], "attention_mask": [], "position_ids": []}
    for row in rows:
        responses = batch.batch["responses"][row]
        response_mask = batch.batch["response_mask"][row]
        prompt_text = tokenizer.decode(batch.batch["prompts"][row])
        question = prompt_text.split(user_header)[1].split(INSTRUCTION)[0]
        solution = batch.non_tensor_batch["extra_info"][row]["solution"]
        messages = [
            {"role": "system", "content": config.system},
            {"role": "user", "content": fill_user_template(config.user_template, question, solution)},
        ]
        ids = list(
            tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
        )
        if len(ids) > width:
            solution_ids = tokenizer.encode(solution, add_special_tokens=False)[len(ids) - width + 2 :]
            messages[1]["content"] = fill_user_template(config.user_template, question, tokenizer.decode(solution_ids))
            ids = list(
                tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
            )
        new_prompt = torch.tensor([pad] * (width - len(ids)) + ids)
        out["prompts"].append(new_prompt)
        out["input_ids"].append(torch.cat([new_prompt, responses]))
        out["attention_mask"].append(
            torch.cat(
                [torch.zeros(width - len(ids), dtype=torch.long), torch.ones(len(ids), dtype=torch.long), response_mask]
            )
        )
        out["position_ids"].append(
            torch.cat([torch.zeros(width - len(ids), dtype=torch.long), torch.arange(len(ids) + len(responses))])
        )
    return {key: torch.stack(values) for key, values in out.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=1024)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompt-width", type=int, default=2048)
    parser.add_argument("--response-width", type=int, default=4096)
    parser.add_argument("--margin", type=int, default=512, help="cpo.hint.max_prompt_length_margin")
    parser.add_argument("--baseline-rows", type=int, default=512, help="rows the per-row loop is timed on")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument(
        "--truncation-width", type=int, default=640, help="hint width of an extra timing where many solutions are cut"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    problems = make_problems(args.prompts)
    # The tokenizer learns the problems' words and the fixed prompt text, as a real tokenizer knows English.
    corpus = [p["question"] + "\n" + p["solution"] for p in problems[:256]]
    corpus += [SYSTEM, INSTRUCTION, HintConfig().user_template] * 16
    tokenizer = build_tokenizer(corpus, args.vocab_size)
    tokenizer.model_max_length = 1 << 30  # only silences a length warning; nothing is truncated by the tokenizer
    batch = make_batch(tokenizer, problems, args.n, args.prompt_width, args.response_width)
    config = HintConfig(max_prompt_length_margin=args.margin).resolve(args.prompt_width)
    num_rows = len(batch)

    baseline_rows = min(args.baseline_rows, num_rows)
    rendered = tokenizer.apply_chat_template(
        [
            [
                {"role": "system", "content": config.system},
                {"role": "user", "content": fill_user_template(config.user_template, p["question"], p["solution"])},
            ]
            for p in problems
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    # Alternate the methods and keep each one's best time: the fairest reading on a shared machine.
    truncating = HintConfig(max_prompt_length=args.truncation_width)
    ours_s = baseline_s = tokenize_s = truncating_s = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        hint_batch, metrics = build_hint_batch(batch, tokenizer, config)
        ours_s = min(ours_s, time.perf_counter() - start)
        del hint_batch
        start = time.perf_counter()
        hint_batch, truncating_metrics = build_hint_batch(batch, tokenizer, truncating)
        truncating_s = min(truncating_s, time.perf_counter() - start)
        del hint_batch
        start = time.perf_counter()
        baseline = per_row_hint_tensors(batch, tokenizer, config, range(baseline_rows))
        baseline_s = min(baseline_s, time.perf_counter() - start)
        start = time.perf_counter()
        tokenizer(rendered, add_special_tokens=False, return_attention_mask=False)
        tokenize_s = min(tokenize_s, time.perf_counter() - start)
    hint_batch, metrics = build_hint_batch(batch, tokenizer, config)
    # Same output on the timed rows (the baseline counts positions on through response padding, like the
    # reference, so positions are compared on valid tokens only).
    for key in ("prompts", "input_ids", "attention_mask"):
        assert torch.equal(baseline[key], hint_batch.batch[key][:baseline_rows]), key
    valid = hint_batch.batch["attention_mask"][:baseline_rows].bool()
    assert torch.equal(baseline["position_ids"][valid], hint_batch.batch["position_ids"][:baseline_rows][valid])

    ours_rate = num_rows / ours_s
    baseline_rate = baseline_rows / baseline_s
    note = " (extrapolated)" if baseline_rows < num_rows else ""
    print(
        f"hint batch: {args.prompts} prompts x n={args.n} = {num_rows} rows; prompt width {args.prompt_width} -> hint "
        f"width {config.max_prompt_length}; response width {args.response_width}; 1 CPU core; best of "
        f"{args.repeats}; mean hint prompt {metrics['cpo/hint_prompt_len_mean']:.0f} tokens, truncated "
        f"{metrics['cpo/hint_truncated_frac']:.1%}"
    )
    rows = [
        ("per-row loop (reference-style)", baseline_rows, f"{num_rows / baseline_rate:.2f}{note}", baseline_rate),
        ("build_hint_batch (per uid, batched)", num_rows, f"{ours_s:.2f}", ours_rate),
        (
            f"  same, width {args.truncation_width}: {truncating_metrics['cpo/hint_truncated_frac']:.0%} truncated",
            num_rows,
            f"{truncating_s:.2f}",
            num_rows / truncating_s,
        ),
    ]
    print(f"| {'method':<40} | {'rows timed':>10} | {'s (all rows)':>22} | {'rows/s':>9} | {'speed-up':>8} |")
    print(f"|{'-' * 42}|{'-' * 12}|{'-' * 24}|{'-' * 11}|{'-' * 10}|")
    for name, timed, seconds, rate in rows:
        print(f"| {name:<40} | {timed:>10} | {seconds:>22} | {rate:>9.0f} | {f'{rate / baseline_rate:.1f}x':>8} |")
    print(f"of which the one tokenizer call on the {len(problems)} unique hint prompts: {tokenize_s:.2f} s")


if __name__ == "__main__":
    main()
