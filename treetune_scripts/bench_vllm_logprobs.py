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
"""Per-token log-prob agreement of verl's vLLM rollout (vLLM's CPU build) with fp32 transformers, on one support.

vLLM samples one response per prompt from the task's own chat prompts (mixed lengths) at temperature 1, with verl's
rollout mask on the output layer (``monkey_patch_compute_logits``: ids at or above ``len(tokenizer)`` get ``-inf``),
and reports each sampled token's log-prob. The same tokens are then scored by fp32 transformers, one row at a time:

- over the tokenizer's ids (what the trainer computes with the ``trainer_vocabulary_support`` patch);
- over every row of the padded output layer (what verl's FSDP trainer computes without it).

Printed per model and vLLM dtype: the mean signed difference (rollout minus reference; the estimate of
``rollout_corr/kl`` verl logs), the mean and the largest absolute difference, in nats per token. The trainer itself
(the FSDP engine, bf16 autocast on CPU) is compared with the rollout by verl's own ``rollout_corr/kl`` in the runs.

Usage::

    python -m treetune_scripts.bench_vllm_logprobs [--prompts 64] [--max-tokens 32]

Needs vLLM's CPU build (``make install`` on verl 0.9.1).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the model lives in this process: apply_model
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import pandas as pd  # noqa: E402
import torch  # noqa: E402


def _models() -> dict[str, object]:
    from treetune_scripts.experiments.warm_start import build_warm_start
    from treetune_scripts.make_tiny_assets import CONTEXT_SENSITIVE, build_tiny_assets

    return {
        "context-sensitive random init": build_tiny_assets(config=CONTEXT_SENSITIVE),
        "warm start (SFT-trained)": build_warm_start(),
    }


def _prompts(assets_dir, tokenizer, count: int) -> list[list[int]]:
    rows = pd.read_parquet(assets_dir / "data" / "train.parquet").head(count)
    return [
        tokenizer.apply_chat_template(
            [dict(m) for m in messages], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for messages in rows["prompt"]
    ]


def sample_with_vllm(model_dir, prompts, dtype: str, max_tokens: int, vocab_size: int):
    """``[(prompt, response ids, log-probs)]`` from vLLM with verl's rollout mask on ids >= ``vocab_size``."""
    from verl.workers.rollout.vllm_rollout.utils import monkey_patch_compute_logits
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=str(model_dir), dtype=dtype, seed=0, enforce_eager=True, max_model_len=512)
    llm.apply_model(lambda model: monkey_patch_compute_logits(model, vocab_size))
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens, logprobs=0, seed=0)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=prompt) for prompt in prompts], params)
    samples = []
    for prompt, output in zip(prompts, outputs, strict=True):
        completion = output.outputs[0]
        ids = list(completion.token_ids)
        log_probs = [completion.logprobs[i][token].logprob for i, token in enumerate(ids)]
        samples.append((prompt, ids, log_probs))
    del llm
    return samples


def score_with_transformers(model, prompt, response, vocab_size: int | None) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits[:, :vocab_size], -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl_cpu.patches import activate

    activate()  # verl-cpu's vLLM fixes: verl's modules read vLLM's version from the 'vllm' distribution
    header = "| model | vLLM dtype | reference support | mean signed | mean abs | max abs | tokens |"
    lines = [header, "|---|---|---|---|---|---|---|"]
    for name, assets_dir in _models().items():
        model_dir = assets_dir / "model"
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        rows, vocab = len(tokenizer), reference.config.vocab_size
        prompts = _prompts(assets_dir, tokenizer, args.prompts)
        for dtype in ("float32", "bfloat16"):
            samples = sample_with_vllm(model_dir, prompts, dtype, args.max_tokens, rows)
            rollout = torch.tensor([lp for _, _, log_probs in samples for lp in log_probs])
            for support, vocab_size in ((f"tokenizer ({rows} ids)", rows), (f"all {vocab} rows", None)):
                expected = torch.cat([score_with_transformers(reference, p, r, vocab_size) for p, r, _ in samples if r])
                diff = rollout - expected
                lines.append(
                    f"| {name} | {dtype} | {support} | {diff.mean():+.2e} | {diff.abs().mean():.2e} | "
                    f"{diff.abs().max():.2e} | {len(diff)} |"
                )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
