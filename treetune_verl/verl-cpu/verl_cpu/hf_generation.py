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
"""Batched token-in/token-out decoding with a Hugging Face causal LM (no Ray, no verl).

This is the engine of the ``hf`` rollout server. It follows the sampling semantics of verl's vLLM server:

- ``temperature == 0`` (or ``do_sample=False``) is greedy decoding;
- otherwise logits are divided by the temperature, then top-k (``top_k <= 0`` disables), then top-p
  (``top_p >= 1`` disables) keep the most likely tokens, and the next token is drawn from the renormalised rest;
- the log-prob of a generated token is taken from that processed distribution (vLLM's ``processed_logprobs``, verl's
  default ``rollout.logprobs_mode``); for greedy decoding it is the log-softmax of the raw logits;
- only the tokenizer's ids are candidates: the rows of a padded output layer beyond them (``vocab_size``) are left
  out, as verl's vLLM server masks them, so every sampled id decodes and the distribution is the trainer's;
- a row stops after its first end-of-sequence token (which is kept in its output) or after its own ``max_tokens``.

Prompts of different lengths are left-padded into one batch; each row gets its own position ids, so padding does
not change what a row generates. Each row samples from its own ``torch.Generator`` (one per row, given by the
caller), so the draws of a row do not depend on which other rows share its batch, in what order, or when they finish:
a prompt decoded with its generator seeded ``s`` gives the same tokens alone or in any batch, up to the rare flip of a
draw that falls within float rounding of a boundary of the row's distribution (its logits can differ in the last bits
with the padded width and batch size of the CPU kernels).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_SUPPORTED_SAMPLING_KEYS = frozenset(
    {"temperature", "top_p", "top_k", "repetition_penalty", "logprobs", "max_tokens", "max_new_tokens", "do_sample"}
)


@dataclass(frozen=True)
class SamplingSettings:
    """Sampling parameters shared by every row of one decoding batch.

    Attributes:
        temperature: softmax temperature; 0 means greedy.
        top_p: nucleus threshold in (0, 1]; 1 disables it.
        top_k: number of most likely tokens kept; <= 0 disables it.
        repetition_penalty: HF/vLLM-style penalty (> 1 discourages tokens seen in prompt or output); 1 disables it.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    repetition_penalty: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @classmethod
    def from_params(cls, params: dict) -> SamplingSettings:
        """Build settings from verl's ``sampling_params`` dict (the keys the agent loop sends).

        Raises:
            ValueError: on a key this backend does not implement or an out-of-range value.
        """
        unknown = sorted(set(params) - _SUPPORTED_SAMPLING_KEYS)
        if unknown:
            raise ValueError(
                f"The hf rollout server does not support the sampling parameter(s) {unknown}; "
                f"supported: {sorted(_SUPPORTED_SAMPLING_KEYS)}."
            )
        temperature = float(params.get("temperature", 1.0))
        if params.get("do_sample") is False:
            temperature = 0.0
        settings = cls(
            temperature=temperature,
            top_p=float(params.get("top_p", 1.0)),
            top_k=int(params.get("top_k", -1)),
            repetition_penalty=float(params.get("repetition_penalty", 1.0)),
        )
        if settings.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {settings.temperature}.")
        if not 0 < settings.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {settings.top_p}.")
        if settings.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {settings.repetition_penalty}.")
        return settings


def resolve_max_tokens(
    params: dict, prompt_len: int, *, max_model_len: int, prompt_length: int, response_length: int
) -> int:
    """Number of tokens a request may generate, by the rule of verl's vLLM server.

    ``max_tokens`` (or SGLang-style ``max_new_tokens``) from ``params`` if given, else
    ``min(response_length, prompt_length + response_length - prompt_len)``; then clamped to
    ``[0, max_model_len - prompt_len]``. The two keys are removed from ``params``.

    Args:
        params: the request's sampling params (modified in place).
        prompt_len: number of prompt tokens.
        max_model_len: context size of the server.
        prompt_length: ``rollout.prompt_length``.
        response_length: ``rollout.response_length``.

    Raises:
        ValueError: if the prompt alone is longer than ``max_model_len``.
    """
    room = max_model_len - prompt_len
    if room < 0:
        raise ValueError(f"Prompt length ({prompt_len}) exceeds the model's maximum context length ({max_model_len}).")
    if "max_tokens" in params:
        max_tokens = params.pop("max_tokens")
        params.pop("max_new_tokens", None)
    elif "max_new_tokens" in params:
        max_tokens = params.pop("max_new_tokens")
    else:
        max_tokens = min(response_length, prompt_length + response_length - prompt_len)
    return max(0, min(int(max_tokens), room))


def process_logits(logits: torch.Tensor, settings: SamplingSettings, seen_tokens: torch.Tensor | None) -> torch.Tensor:
    """Apply repetition penalty, temperature, top-k and top-p to next-token logits.

    Args:
        logits: (batch, vocab) raw next-token logits, float32.
        settings: sampling settings of the batch.
        seen_tokens: (batch, vocab) bool, tokens already in each row (used only by the repetition penalty).

    Returns:
        (batch, vocab) processed logits; removed tokens are ``-inf``. For greedy settings only the repetition
        penalty is applied.
    """
    scores = logits
    if settings.repetition_penalty != 1.0 and seen_tokens is not None:
        penalised = torch.where(scores > 0, scores / settings.repetition_penalty, scores * settings.repetition_penalty)
        scores = torch.where(seen_tokens, penalised, scores)
    if settings.greedy:
        return scores
    scores = scores / settings.temperature
    vocab = scores.shape[-1]
    if 0 < settings.top_k < vocab:
        kth_best = torch.topk(scores, settings.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth_best, float("-inf"))
    if settings.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        sorted_probs = sorted_scores.softmax(dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = mass_before >= settings.top_p  # keeps the smallest prefix whose mass reaches top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores


def choose_next_tokens(
    scores: torch.Tensor, settings: SamplingSettings, generators: list[torch.Generator] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the next token of every row and its log-prob under ``scores``.

    Sampling draws row ``i``'s token with ``generators[i]`` only (one ``torch.multinomial`` call per row), so a row's
    token depends on its own scores and generator state, never on the other rows. Greedy decoding draws nothing.

    Args:
        scores: (batch, vocab) processed logits from :func:`process_logits`.
        settings: sampling settings of the batch.
        generators: one torch RNG per row (``batch`` of them, on the device of ``scores``), each used for one
            draw; None samples every row from torch's default RNG.

    Returns:
        tokens: (batch,) int64 chosen token ids.
        log_probs: (batch,) float32 ``log_softmax(scores)`` at the chosen tokens.

    Raises:
        ValueError: if ``generators`` does not hold one generator per row.
    """
    batch = scores.shape[0]
    if generators is not None and len(generators) != batch:
        raise ValueError(f"{batch} rows but {len(generators)} generators; pass one generator per row.")
    log_probs = torch.log_softmax(scores, dim=-1)
    if settings.greedy:
        tokens = scores.argmax(dim=-1)
    else:
        probs = log_probs.exp()
        row_generators = generators if generators is not None else [None] * batch
        tokens = torch.zeros(batch, dtype=torch.long, device=scores.device)
        for row, generator in enumerate(row_generators):
            tokens[row] = torch.multinomial(probs[row], num_samples=1, generator=generator)[0]
    return tokens, log_probs.gather(-1, tokens[:, None]).squeeze(-1)


@dataclass
class Generation:
    """Output of one row: generated token ids (end-of-sequence token included) and their log-probs."""

    token_ids: list[int]
    log_probs: list[float]
    hit_eos: bool


@torch.no_grad()
def decode_batch(
    model: torch.nn.Module,
    prompts: list[list[int]],
    max_new_tokens: list[int],
    settings: SamplingSettings,
    *,
    eos_token_ids: list[int],
    pad_token_id: int,
    vocab_size: int | None = None,
    generators: list[torch.Generator] | None = None,
) -> list[Generation]:
    """Generate continuations for a batch of prompts with a KV cache.

    Args:
        model: a Hugging Face causal LM in eval mode (called with ``input_ids, attention_mask, position_ids,
            past_key_values, use_cache``).
        prompts: token ids per row, any lengths >= 1.
        max_new_tokens: per-row limit on generated tokens (0 allowed).
        settings: sampling settings shared by the batch.
        eos_token_ids: tokens that end a row (kept in its output).
        pad_token_id: id used for left padding and for rows that already finished.
        vocab_size: sample among ids below it only (the tokenizer's length); default: every row of the output layer.
        generators: one torch RNG per prompt (on the model's device); row ``i`` samples with ``generators[i]`` only,
            one draw per decoding step until every row has finished (a finished row still draws from its own
            generator, and the token is discarded), so what a row generates does not depend on the other rows.
            None samples from torch's default RNG. Unused by greedy decoding.

    Returns:
        One :class:`Generation` per prompt, in order.

    Raises:
        ValueError: on mismatched lengths of ``prompts``, ``max_new_tokens`` and ``generators``, or an empty prompt.
    """
    if len(prompts) != len(max_new_tokens):
        raise ValueError(f"{len(prompts)} prompts but {len(max_new_tokens)} max_new_tokens values.")
    if generators is not None and len(generators) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(generators)} generators; pass one generator per prompt.")
    if any(len(prompt) == 0 for prompt in prompts):
        raise ValueError("Every prompt needs at least one token.")
    device = next(model.parameters()).device
    batch = len(prompts)
    width = max(len(prompt) for prompt in prompts)
    input_ids = torch.full((batch, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        attention_mask[row, width - len(prompt) :] = 1
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)

    limits = torch.tensor(max_new_tokens, dtype=torch.long, device=device)
    eos = torch.tensor(sorted(set(eos_token_ids)), dtype=torch.long, device=device)
    finished = limits <= 0
    lengths = torch.zeros(batch, dtype=torch.long, device=device)
    hit_eos = torch.zeros(batch, dtype=torch.bool, device=device)
    steps = int(limits.max().item()) if batch else 0
    tokens_out = torch.full((batch, max(steps, 1)), pad_token_id, dtype=torch.long, device=device)
    log_probs_out = torch.zeros((batch, max(steps, 1)), dtype=torch.float32, device=device)

    vocab = model.get_output_embeddings().weight.shape[0]
    if vocab_size is not None:
        vocab = min(vocab, vocab_size)
    seen = None
    if settings.repetition_penalty != 1.0:
        seen = torch.zeros((batch, vocab), dtype=torch.bool, device=device)
        seen.scatter_(1, input_ids, attention_mask.bool())

    step_ids, step_positions, past = input_ids, position_ids, None
    for step in range(steps):
        if bool(finished.all()):
            break
        output = model(
            input_ids=step_ids,
            attention_mask=attention_mask,
            position_ids=step_positions,
            past_key_values=past,
            use_cache=True,
        )
        past = output.past_key_values
        logits = output.logits[:, -1, :vocab].float()
        scores = process_logits(logits, settings, seen)
        next_tokens, next_log_probs = choose_next_tokens(scores, settings, generators)
        next_tokens = torch.where(finished, torch.full_like(next_tokens, pad_token_id), next_tokens)
        active = ~finished
        tokens_out[:, step] = next_tokens
        log_probs_out[:, step] = torch.where(active, next_log_probs, torch.zeros_like(next_log_probs))
        lengths += active.long()
        ended_by_eos = active & torch.isin(next_tokens, eos)
        hit_eos |= ended_by_eos
        finished = finished | ended_by_eos | (lengths >= limits)
        if seen is not None:
            seen[torch.arange(batch, device=device), next_tokens] |= active
        step_ids = next_tokens[:, None]
        step_positions = step_positions[:, -1:] + 1
        attention_mask = torch.cat([attention_mask, torch.ones((batch, 1), dtype=torch.long, device=device)], dim=1)

    results = []
    for row in range(batch):
        n = int(lengths[row])
        results.append(
            Generation(
                token_ids=tokens_out[row, :n].tolist(),
                log_probs=log_probs_out[row, :n].tolist(),
                hit_eos=bool(hit_eos[row]),
            )
        )
    return results
