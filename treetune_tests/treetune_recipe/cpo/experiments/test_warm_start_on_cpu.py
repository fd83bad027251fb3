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
"""The warm start's gate (:func:`~treetune_recipe.cpo.experiments.warm_start.check_mixed_groups`): a warm start
whose greedy accuracy would give RL too few mixed prompt groups is refused with the measured accuracy. The shipped
weights are tested in ``test_shipped_warm_start_on_cpu.py``, verl's SFT in ``test_sft_loss_on_cpu.py``."""

import pytest

from treetune_recipe.cpo.experiments.warm_start import WarmStartGateError, check_mixed_groups


def test_warm_start_gate_refuses_all_wrong_or_all_right_with_the_measured_accuracy():
    check_mixed_groups({"val_acc_plain": 0.3})
    for accuracy in (0.02, 0.9):
        with pytest.raises(WarmStartGateError, match=f"accuracy on plain prompts is {accuracy:.3f}"):
            check_mixed_groups({"val_acc_plain": accuracy, "path": "x"})


def test_the_sft_prompts_of_every_context_are_the_trainers_teacher_prompts_token_for_token():
    """The warm start learns to read each context in the exact form the trainer shows its teacher: the SFT data's
    prompt under a context equals the prompt the registry's builder writes for a row that gets that context."""
    import pandas as pd
    import torch
    from transformers import AutoTokenizer

    from treetune_recipe.cpo.experiments.task import HINT_USER_TEMPLATE
    from treetune_recipe.cpo.experiments.teacher_probe import chat_ids, pack_batch, prompt_of
    from treetune_recipe.cpo.experiments.warm_start import SFT_CONTEXTS, context_messages, sft_rows
    from treetune_recipe.cpo.teacher.contexts import get_context
    from treetune_recipe.cpo.teacher.hint import HintConfig
    from treetune_verl.tiny_assets import CONTEXT_SENSITIVE, build_tiny_assets

    assets = build_tiny_assets(config=CONTEXT_SENSITIVE)
    tokenizer = AutoTokenizer.from_pretrained(assets / "model")
    rows = pd.read_parquet(assets / "data" / "train.parquet").head(2)
    raw = [[dict(message) for message in prompt] for prompt in rows["prompt"]]
    infos = [dict(info) for info in rows["extra_info"]]
    answers = [str(reward["ground_truth"]) for reward in rows["reward_model"]]
    right = [
        tokenizer(info["solution"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for info in infos
    ]
    layout = ((0, True), (0, False), (1, True), (1, False))  # (group, right response?)
    batch = pack_batch(
        tokenizer,
        [chat_ids(tokenizer, raw[g]) for g, _ in layout],
        [right[g] if ok else right[g][:5] + [tokenizer.eos_token_id] for g, ok in layout],
        [raw[g] for g, _ in layout],
        [g for g, _ in layout],
        [infos[g] for g, _ in layout],
        [dict(rows["reward_model"].iloc[g]) for g, _ in layout],
    )
    success = torch.tensor([ok for _, ok in layout])
    hint = HintConfig(user_template=HINT_USER_TEMPLATE, max_prompt_length=512)
    for name in SFT_CONTEXTS:
        teacher, has_context, _ = get_context(name).build(batch, tokenizer=tokenizer, hint_config=hint, success=success)
        checked = 0
        for row, (group, _) in enumerate(layout):
            if has_context[row]:
                sft_prompt = chat_ids(tokenizer, context_messages(name, raw[group], infos[group], answers[group]))
                assert prompt_of(teacher, row) == sft_prompt, name
                assert sft_prompt != chat_ids(tokenizer, raw[group])  # the context is in it
                checked += 1
        assert checked >= 2, name
    # Control: another context's SFT prompt is not the sibling's teacher prompt.
    teacher, has_context, _ = get_context("successful_sibling").build(
        batch, tokenizer=tokenizer, hint_config=hint, success=success
    )
    assert prompt_of(teacher, 1) != chat_ids(tokenizer, context_messages("answer_only", raw[0], infos[0], answers[0]))
    # Each training row gives the plain prompt and one prompt per context, each ending in the gold solution.
    conversations = sft_rows(rows)
    assert len(conversations) == 2 * (1 + len(SFT_CONTEXTS))
    assert {c["messages"][-1]["content"] for c in conversations[: 1 + len(SFT_CONTEXTS)]} == {infos[0]["solution"]}
