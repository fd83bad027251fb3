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
"""Small byte-level BPE tokenizers built locally (no hub), one per chat-template family.

Families (``build_tokenizer(name)``):

* ``chatml``: ``<|im_start|>role\\n...<|im_end|>\\n``; pad ``<|endoftext|>``.
* ``qwen3``: ChatML plus Qwen3-style thinking switch: with ``enable_thinking=false`` the generation header is followed
  by an empty ``<think>\\n\\n</think>\\n\\n`` block.
* ``llama3``: ``<|begin_of_text|><|start_header_id|>role<|end_header_id|>\\n\\n...<|eot_id|>``; no pad token (EOS
  ``<|eot_id|>`` is the pad fallback).
* ``plain``: no chat template; ``add_special_tokens=True`` prepends ``<s>``; no pad token (EOS ``</s>``).

The chat templates are written for these tests; they follow the public formats' shape only.
"""

import functools

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)

QWEN3_STYLE_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

LLAMA3_STYLE_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{ message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

_CORPUS = [
    "Let x be a real number such that x^2 - 5x + 6 = 0. Find the sum of all possible values of x.",
    "The roots are 2 and 3, so the sum is 5. Therefore the answer is \\boxed{5}.",
    "A rectangle has a perimeter of 24 and an area of 35. What is the length of its diagonal?",
    "We have $a+b=12$ and $ab=35$, so $a^2+b^2=(a+b)^2-2ab=144-70=74$ and the diagonal is $\\sqrt{74}$.",
    "How many positive divisors does 360 have? Since $360=2^3\\cdot 3^2\\cdot 5$, it has $4\\cdot 3\\cdot 2=24$.",
    "Compute \\frac{1}{2}+\\frac{1}{3}+\\frac{1}{6}. The common denominator is 6, giving \\frac{3+2+1}{6}=1.",
    "Solve for y: 3y + 7 = 22. Subtract 7 from both sides to get 3y = 15, then divide by 3: y = 5.",
    "The probability of rolling two sixes with two fair dice is \\left(\\frac{1}{6}\\right)^2=\\frac{1}{36}.",
    "Please reason step by step, and put your final answer within \\boxed{}.",
    "You are a helpful assistant. Problem: Solution: Rules for your reply: first person, check each step.",
]


def _train_bpe(special_tokens: list[str], vocab_size: int = 700) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return tokenizer


@functools.cache
def build_tokenizer(family: str) -> PreTrainedTokenizerFast:
    """A fresh-enough tokenizer of the given family (cached: do not mutate it outside monkeypatch)."""
    if family in ("chatml", "qwen3"):
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
        backend = _train_bpe(specials)
        backend.post_processor = processors.ByteLevel(trim_offsets=False)
        template = CHATML_TEMPLATE if family == "chatml" else QWEN3_STYLE_TEMPLATE
        return PreTrainedTokenizerFast(
            tokenizer_object=backend,
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            additional_special_tokens=specials[1:],
            chat_template=template,
        )
    if family == "llama3":
        specials = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
        backend = _train_bpe(specials)
        backend.post_processor = processors.ByteLevel(trim_offsets=False)
        return PreTrainedTokenizerFast(
            tokenizer_object=backend,
            bos_token="<|begin_of_text|>",
            eos_token="<|eot_id|>",
            additional_special_tokens=specials[1:3],
            chat_template=LLAMA3_STYLE_TEMPLATE,
        )
    if family == "plain":
        backend = _train_bpe(["<s>", "</s>"])
        backend.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", backend.token_to_id("<s>"))]
        )
        return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>")
    raise ValueError(f"Unknown tokenizer family {family!r}; use chatml, qwen3, llama3 or plain.")
