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
"""Patches of verl's FSDP engine that a CPU run needs (applied by :func:`verl_cpu.activation.activate`).

Each is also right on an accelerator where the same condition holds (no flash-attn, the padded path, a vLLM
rollout): a project may apply them there with :func:`verl_cpu.activation.apply_engine_fixes`.
"""

from __future__ import annotations

import functools
from types import ModuleType


def use_pure_torch_attention_utils(module: ModuleType) -> None:
    """Route verl's pad/unpad helpers to its own pure-torch implementation (flash-attn is CUDA only).

    Fixes: the engine workers always call ``left_right_2_no_padding``, which reaches
    ``attention_utils._get_attention_functions``, which imports ``flash_attn.bert_padding`` (CUDA only).
    verl ships an equivalent pure-torch module (``verl.utils.npu_flash_attn_utils``, needs einops).
    """
    # SYNC WARNING: verl/utils/attention_utils.py:_get_attention_functions (l.20-34)
    # SYNC WARNING: verl/workers/utils/padding.py:left_right_2_no_padding (l.53, caller)
    if getattr(module._get_attention_functions, "_verl_cpu_pure_torch", False):
        return

    def _get_attention_functions():
        from verl.utils.npu_flash_attn_utils import index_first_axis, pad_input, rearrange, unpad_input

        return index_first_axis, pad_input, rearrange, unpad_input

    _get_attention_functions._verl_cpu_pure_torch = True
    module._get_attention_functions = _get_attention_functions


def full_sequence_attention_mask(input_ids):
    """Padded attention mask ``[B, S_max]`` of a jagged ``input_ids`` batch: ones over each row's whole sequence.

    Rows are right-padded to the longest one (as ``torch.nested.to_padded_tensor`` pads them), so row ``i`` is
    ``lengths[i]`` ones followed by zeros.
    """
    import torch

    lengths = input_ids.offsets().diff()
    width = int(lengths.max())
    positions = torch.arange(width, device=lengths.device)
    return (positions[None, :] < lengths[:, None]).to(torch.int32)


def mask_whole_sequence_on_padded_path(module: ModuleType) -> None:
    """Give the FSDP engine's padded path (``use_remove_padding=false``) an attention mask over the whole sequence.

    Fixes: ``FSDPEngineWithLMHead.prepare_model_inputs`` builds the padded batch's attention mask from the lengths of
    ``loss_mask``, which ``left_right_2_no_padding`` sets to the *response* mask. A row of P prompt and R response
    tokens gets R ones and then zeros, so every token after position R is scored with most of its context masked out:
    the old, ref and hinted log-probs and the actor update's own log-probs are all wrong (several nats on a model whose
    outputs depend on their context). Upstream issue #6278, fixed in verl 0.8.0 by PR #6345, which builds the mask
    from ``input_ids``; this wrapper does the same after the original method ran.
    """
    # SYNC WARNING: verl/workers/engine/fsdp/transformer_impl.py:FSDPEngineWithLMHead.prepare_model_inputs
    # (l.938-977, no-remove-padding branch: attention_mask from loss_mask lengths, l.967)
    # SYNC WARNING: verl/workers/utils/padding.py:left_right_2_no_padding (l.71, loss_mask = response_mask)
    engine_cls = module.FSDPEngineWithLMHead
    original = engine_cls.prepare_model_inputs
    if getattr(original, "_verl_cpu_full_mask", False):
        return
    from verl.utils import tensordict_utils as tu

    @functools.wraps(original)
    def prepare_model_inputs(self, micro_batch):
        model_inputs, output_args = original(self, micro_batch)
        if not tu.get_non_tensor_data(data=micro_batch, key="use_remove_padding", default=True):
            model_inputs["attention_mask"] = full_sequence_attention_mask(micro_batch["input_ids"])
        return model_inputs, output_args

    prepare_model_inputs._verl_cpu_full_mask = True
    engine_cls.prepare_model_inputs = prepare_model_inputs


def padding_logit(dtype) -> float:
    """The logit given to a masked output row: far below any real logit, yet finite after verl divides the logits by
    a sampling temperature (down to 1e-3; 0.1 for fp16), so that the entropy ``sum p * logit`` stays finite where
    ``-inf`` would give ``0 * inf``. Its probability is exactly 0 after the softmax."""
    import torch

    lowest = torch.finfo(dtype).min
    return lowest / 1e4 if torch.finfo(dtype).max > 1e30 else lowest / 10


def mask_padded_vocabulary(logits, vocab_size: int):
    """``logits`` with every column at or above ``vocab_size`` set to :func:`padding_logit` (a new tensor), or
    ``logits`` itself when it has no such column."""
    import torch

    if logits.shape[-1] <= vocab_size:
        return logits
    padding = torch.arange(logits.shape[-1], device=logits.device) >= vocab_size
    return logits.masked_fill(padding, padding_logit(logits.dtype))


def mask_padded_vocabulary_in_trainer(module: ModuleType) -> None:
    """Make the FSDP engine's log-probs and entropy normalise over the tokenizer's ids, as verl's vLLM rollout does.

    Fixes: verl's vLLM server sets every logit at or above ``len(tokenizer)`` to ``-inf`` before sampling
    (``monkey_patch_compute_logits``), so the rollout samples from, and reports log-probs of, a distribution over the
    tokenizer's ids. The trainer's log-softmax runs over all ``config.vocab_size`` rows of the output layer, which
    checkpoints pad (Qwen3: 151936 rows for 151669 tokens). Where the model puts mass m on the padding rows, every
    trainer log-prob is lower by -log(1 - m) than the rollout's: trainer and rollout work on different supports, and
    the policy trained is not the one sampled. The wrapper masks the same tail of ``output.logits`` (see
    :func:`padding_logit`) before the original method computes log-probs and entropy. The fused-kernel path
    (``use_fused_kernels``) never materialises the logits and is left as it is.
    """
    # SYNC WARNING: verl/workers/engine/fsdp/transformer_impl.py:FSDPEngineWithLMHead.prepare_model_outputs (0.9.1
    # l.1332, 0.7.1 l.992: log-probs and entropy from output.logits)
    # SYNC WARNING: verl/workers/rollout/vllm_rollout/vllm_async_server.py (0.9.1 l.500-506, 0.7.1 l.458-460:
    # vocab_size=len(tokenizer)) and verl/workers/rollout/vllm_rollout/utils.py:monkey_patch_compute_logits (0.9.1
    # l.106-126, 0.7.1 l.90: the rollout's mask)
    engine_cls = module.FSDPEngineWithLMHead
    original = engine_cls.prepare_model_outputs
    if getattr(original, "_verl_cpu_vocab_support", False):
        return

    @functools.wraps(original)
    def prepare_model_outputs(self, output, *args, **kwargs):
        tokenizer = getattr(self.model_config, "tokenizer", None)
        logits = getattr(output, "logits", None)
        if tokenizer is not None and logits is not None:
            output.logits = mask_padded_vocabulary(logits, len(tokenizer))
        return original(self, output, *args, **kwargs)

    prepare_model_outputs._verl_cpu_vocab_support = True
    engine_cls.prepare_model_outputs = prepare_model_outputs
