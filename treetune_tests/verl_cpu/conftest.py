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
"""Shared fixtures of the verl-cpu tests (verl-cpu code run on the overlay's tiny assets)."""

import pytest
import torch


@torch.no_grad()
def _naive_greedy(model, prompt, steps, eos=(), vocab_size=None):
    """One prompt, no padding, no KV cache: a full forward pass for every new token (the reference decoder).

    Only ids below ``vocab_size`` (the tokenizer's length; default: every output row) are candidates.

    Returns:
        (tokens, log_probs): the greedy tokens (the EOS token kept when reached) and their log-probabilities.
    """
    sequence, tokens, log_probs = list(prompt), [], []
    for _ in range(steps):
        logits = model(torch.tensor([sequence])).logits[0, -1, :vocab_size].float()
        token = int(logits.argmax())
        tokens.append(token)
        log_probs.append(float(torch.log_softmax(logits, -1)[token]))
        sequence.append(token)
        if token in eos:
            break
    return tokens, log_probs


@pytest.fixture
def naive_greedy():
    """The reference greedy decoder ``naive_greedy(model, prompt, steps, eos=()) -> (tokens, log_probs)``."""
    return _naive_greedy
