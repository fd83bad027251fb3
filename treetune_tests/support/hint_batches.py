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
"""Rollout batches shaped like verl's at ``RayPPOTrainer._update_actor``, for the hint-batch and trainer tests.

:func:`make_batch` lays out n interleaved rollouts per prompt (left-padded chat prompts of the data's plain form,
right-padded random responses, verl's position ids, and ``uid``, ``extra_info``, ``raw_prompt`` and ``reward_model``
as verl's dataset keeps them, the answer being the solution's last ``\boxed{}``), optionally reordered as
``balance_batch`` does; :data:`PROBLEMS` are three problems with hand-written solutions.
"""

import uuid

import numpy as np
import torch
from verl import DataProto
from verl.utils.model import compute_position_id_with_mask

from treetune_verl.data.rl_schema import final_answer_from_solution

#: The instruction the data's plain prompts end with.
DATA_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."

#: Three problems with hand-written solutions (``index``, ``question``, ``solution``: the ``extra_info`` of a row).
PROBLEMS = [
    {"index": 11, "question": "Solve 3y + 7 = 22.", "solution": "3y = 15, so y = \\boxed{5}."},
    {"index": 22, "question": "What is {x} if x^2 = 49 and x > 0?", "solution": "x = \\sqrt{49} = \\boxed{7}."},
    {"index": 33, "question": "Compute 1/2 + 1/3 + 1/6.", "solution": "Common denominator 6: (3+2+1)/6 = \\boxed{1}."},
]


def pad_id(tokenizer) -> int:
    """The id that pads a batch: the tokenizer's pad token, else its EOS."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def make_batch(tokenizer, problems, n=4, prompt_width=96, response_width=24, seed=0, shuffle=True, extra_infos=None):
    """A batch shaped like verl's at ``_update_actor``: n interleaved rollouts per prompt, optionally reordered."""
    generator = torch.Generator().manual_seed(seed)
    rows_prompt, rows_response, rows_extra, rows_raw, rows_uid, rows_reward = [], [], [], [], [], []
    for k, problem in enumerate(problems):
        messages = [{"role": "user", "content": problem["question"] + DATA_SUFFIX}]
        if tokenizer.chat_template is None:
            prompt_ids = tokenizer(messages[0]["content"])["input_ids"]
        else:
            prompt_ids = list(
                tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
            )
        assert len(prompt_ids) <= prompt_width
        extra = extra_infos[k] if extra_infos is not None else dict(problem)
        uid = str(uuid.UUID(int=k + 1))
        reward_model = {"style": "rule", "ground_truth": final_answer_from_solution(problem.get("solution"))}
        for _ in range(n):
            length = int(torch.randint(1, response_width + 1, (1,), generator=generator))
            rows_response.append(torch.randint(3, len(tokenizer) - 1, (length,), generator=generator).tolist())
            rows_prompt.append(prompt_ids)
            rows_extra.append(extra)
            rows_raw.append(messages)
            rows_uid.append(uid)
            rows_reward.append(reward_model)
    num_rows, pad = len(rows_prompt), pad_id(tokenizer)
    prompts = torch.full((num_rows, prompt_width), pad)
    responses = torch.full((num_rows, response_width), pad)
    attention = torch.zeros((num_rows, prompt_width + response_width), dtype=torch.long)
    for i, (prompt_ids, response_ids) in enumerate(zip(rows_prompt, rows_response)):
        prompts[i, prompt_width - len(prompt_ids) :] = torch.tensor(prompt_ids)
        responses[i, : len(response_ids)] = torch.tensor(response_ids)
        attention[i, prompt_width - len(prompt_ids) : prompt_width + len(response_ids)] = 1
    order = torch.randperm(num_rows, generator=generator) if shuffle else torch.arange(num_rows)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": attention[:, prompt_width:].clone(),
        "input_ids": torch.cat([prompts, responses], dim=-1),
        "attention_mask": attention,
        "position_ids": compute_position_id_with_mask(attention),
    }
    non_tensors = {"uid": rows_uid, "extra_info": rows_extra, "raw_prompt": rows_raw, "reward_model": rows_reward}
    tensors = {key: value[order] for key, value in tensors.items()}
    non_tensors = {
        key: np.array(value + [None], dtype=object)[:-1][order.numpy()] for key, value in non_tensors.items()
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info={"temperature": 0.7})
