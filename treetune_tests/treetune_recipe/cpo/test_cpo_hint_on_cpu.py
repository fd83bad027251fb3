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
"""Hint-guided batch (treetune_recipe/cpo/teacher/hint.py) on locally built tokenizers of four template families.

Expected prompts come from transformers' own ``apply_chat_template(..., tokenize=True, return_dict=False)`` on
hand-written messages, positions from verl's ``compute_position_id_with_mask``, and response alignment from verl's own
padding helpers.
"""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from transformers import PreTrainedTokenizerFast
from verl import DataProto
from verl.utils.model import compute_position_id_with_mask
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

from treetune_recipe.cpo.teacher.hint import DEFAULT_USER_TEMPLATE, HintConfig, build_hint_batch, fill_user_template
from treetune_tests.support.hint_batches import DATA_SUFFIX, PROBLEMS, make_batch, pad_id
from treetune_tests.support.tokenizer_factory import build_tokenizer

SYSTEM = "You are a careful tutor."
# A short template whose expected rendering the tests write by hand (f-strings below).
TEMPLATE = "Q: {question}\nREF: {solution}\nNow solve it; answer in \\boxed{}."


def _expected_user(question: str, solution: str) -> str:
    return f"Q: {question}\nREF: {solution}\nNow solve it; answer in \\boxed{{}}."


def _expected_prompt_ids(tokenizer, question, solution, system=SYSTEM, **template_kwargs) -> list[int]:
    user = _expected_user(question, solution)
    if tokenizer.chat_template is None:
        return tokenizer(f"{system}\n\n{user}\n\n")["input_ids"]
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return list(
        tokenizer.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True, return_dict=False, **template_kwargs
        )
    )


def _config(**overrides) -> HintConfig:
    values = {"system": SYSTEM, "user_template": TEMPLATE, "max_prompt_length": 160}
    values.update(overrides)
    return HintConfig(**values)


def _valid_prompt(hint_batch: DataProto, row: int) -> list[int]:
    width = hint_batch.batch["prompts"].shape[1]
    mask = hint_batch.batch["attention_mask"][row, :width].bool()
    return hint_batch.batch["prompts"][row][mask].tolist()


def _problem_of_row(batch: DataProto, row: int) -> dict:
    return batch.non_tensor_batch["extra_info"][row]


FAMILY_CASES = [
    pytest.param("chatml", {}, None, id="chatml"),
    pytest.param("qwen3", {"enable_thinking": True}, None, id="qwen3-thinking-on"),
    pytest.param("qwen3", {"enable_thinking": False}, None, id="qwen3-thinking-off"),
    pytest.param("qwen3", {"enable_thinking": False}, True, id="qwen3-data-off-hint-override-on"),
    pytest.param("qwen3", OmegaConf.create({"enable_thinking": False}), None, id="qwen3-data-kwargs-as-omegaconf"),
    pytest.param("llama3", {}, None, id="llama3"),
    pytest.param("plain", {}, None, id="no-chat-template"),
]


@pytest.mark.parametrize("family, data_kwargs, hint_thinking", FAMILY_CASES)
def test_hint_prompt_is_the_chat_template_rendering(family, data_kwargs, hint_thinking):
    tokenizer = build_tokenizer(family)
    batch = make_batch(tokenizer, PROBLEMS)
    hint_batch, metrics = build_hint_batch(
        batch, tokenizer, _config(enable_thinking=hint_thinking), chat_template_kwargs=data_kwargs
    )
    effective_kwargs = {key: data_kwargs[key] for key in data_kwargs}
    if hint_thinking is not None:
        effective_kwargs["enable_thinking"] = hint_thinking
    for row in range(len(batch)):
        problem = _problem_of_row(batch, row)
        expected = _expected_prompt_ids(tokenizer, problem["question"], problem["solution"], **effective_kwargs)
        assert _valid_prompt(hint_batch, row) == expected
        text = tokenizer.decode(_valid_prompt(hint_batch, row))
        assert problem["question"] in text and problem["solution"] in text
        if family == "qwen3":
            assert ("<think>\n\n</think>" in text) == (effective_kwargs["enable_thinking"] is False)
    lengths = [len(_valid_prompt(hint_batch, row)) for row in range(len(batch))]
    assert metrics["cpo/hint_prompt_len_mean"] == pytest.approx(np.mean(lengths))
    assert metrics["cpo/hint_prompt_len_max"] == max(lengths)
    assert metrics["cpo/hint_truncated_frac"] == 0.0
    assert metrics["cpo/hint_missing_frac"] == 0.0


@pytest.mark.parametrize("family", ["chatml", "llama3", "plain"])
def test_responses_masks_and_positions_follow_verl_conventions(family):
    tokenizer = build_tokenizer(family)
    batch = make_batch(tokenizer, PROBLEMS, prompt_width=64, response_width=20)
    hint_batch, _ = build_hint_batch(batch, tokenizer, _config(max_prompt_length=150))
    hint, original = hint_batch.batch, batch.batch

    # The prompt part is as wide as the longest hint prompt of the batch (max_prompt_length is only a cap).
    width = max(len(_valid_prompt(hint_batch, row)) for row in range(len(batch)))
    assert width < 150
    assert hint["prompts"].shape == (len(batch), width)
    shape = (len(batch), width + 20)
    assert hint["input_ids"].shape == hint["attention_mask"].shape == hint["position_ids"].shape == shape
    assert torch.equal(hint["responses"], original["responses"])
    assert torch.equal(hint["response_mask"], original["response_mask"])
    assert torch.equal(hint["attention_mask"][:, width:], original["attention_mask"][:, 64:])
    assert torch.equal(hint["input_ids"], torch.cat([hint["prompts"], original["responses"]], dim=-1))
    # Left padding: a run of pad ids with mask 0, then the prompt with mask 1.
    prompt_mask = hint["attention_mask"][:, :width]
    lengths = prompt_mask.sum(-1)
    expected_mask = (torch.arange(width)[None, :] >= (width - lengths)[:, None]).long()
    assert torch.equal(prompt_mask, expected_mask)
    assert torch.all(hint["prompts"][prompt_mask == 0] == pad_id(tokenizer))
    assert hint["attention_mask"].dtype == original["attention_mask"].dtype
    torch.testing.assert_close(hint["position_ids"], compute_position_id_with_mask(hint["attention_mask"]))
    assert hint_batch.meta_info["global_token_num"] == hint["attention_mask"].sum(-1).tolist()
    assert hint_batch.meta_info["temperature"] == 0.7
    assert "global_token_num" not in batch.meta_info  # the input's meta_info is not modified
    assert hint_batch.non_tensor_batch["hint_missing"].dtype == bool
    assert not hint_batch.non_tensor_batch["hint_missing"].any()


def test_response_positions_keep_their_offset_from_the_prompt_end():
    """Whatever convention the input uses past the prompt (here: counting on through padding), it is kept."""
    tokenizer = build_tokenizer("chatml")
    batch = make_batch(tokenizer, PROBLEMS, prompt_width=64, response_width=20)
    prompt_len = batch.batch["attention_mask"][:, :64].sum(-1, keepdim=True)
    batch.batch["position_ids"][:, 64:] = prompt_len + torch.arange(20)[None, :]
    hint_batch, _ = build_hint_batch(batch, tokenizer, _config(max_prompt_length=150))
    width = hint_batch.batch["prompts"].shape[1]
    hint_len = hint_batch.batch["attention_mask"][:, :width].sum(-1, keepdim=True)
    torch.testing.assert_close(hint_batch.batch["position_ids"][:, width:], hint_len + torch.arange(20)[None, :])


def test_verl_padding_helpers_align_the_hint_batch_with_the_responses(verl_pad_helpers):
    """verl's own rmpad round trip: the token before each response token is the previous response token."""
    tokenizer = build_tokenizer("qwen3")
    batch = make_batch(tokenizer, PROBLEMS, prompt_width=64, response_width=20)
    hint_batch, _ = build_hint_batch(batch, tokenizer, _config())
    td = left_right_2_no_padding(hint_batch.to_tensordict())
    shifted = no_padding_2_padding(td["input_ids"], td)
    responses, response_mask = batch.batch["responses"], batch.batch["response_mask"]
    for row in range(len(batch)):
        n = int(response_mask[row].sum())
        assert shifted[row, 0].item() == _valid_prompt(hint_batch, row)[-1]
        assert shifted[row, 1:n].tolist() == responses[row, : n - 1].tolist()


def test_one_render_and_one_tokenizer_call_per_batch_with_one_prompt_per_uid(monkeypatch):
    tokenizer = build_tokenizer("chatml")
    batch = make_batch(tokenizer, PROBLEMS, n=8)
    rendered, tokenized = [], []
    original_render = tokenizer.apply_chat_template
    original_call = PreTrainedTokenizerFast.__call__

    def counting_render(conversations, *args, **kwargs):
        rendered.append(len(conversations))
        return original_render(conversations, *args, **kwargs)

    def counting_call(self, text, *args, **kwargs):
        tokenized.append(len(text) if isinstance(text, list) else 1)
        return original_call(self, text, *args, **kwargs)

    monkeypatch.setattr(tokenizer, "apply_chat_template", counting_render)
    monkeypatch.setattr(PreTrainedTokenizerFast, "__call__", counting_call)
    build_hint_batch(batch, tokenizer, _config())
    assert rendered == [len(PROBLEMS)]
    assert tokenized == [len(PROBLEMS)]


def test_interleaved_and_shuffled_uids_get_their_own_prompt():
    tokenizer = build_tokenizer("chatml")
    plain = make_batch(tokenizer, PROBLEMS, shuffle=False)
    shuffled = make_batch(tokenizer, PROBLEMS, shuffle=True, seed=5)
    assert list(shuffled.non_tensor_batch["uid"]) != list(plain.non_tensor_batch["uid"])
    for batch in (plain, shuffled):
        hint_batch, _ = build_hint_batch(batch, tokenizer, _config())
        for row in range(len(batch)):
            problem = _problem_of_row(batch, row)
            assert _valid_prompt(hint_batch, row) == _expected_prompt_ids(
                tokenizer, problem["question"], problem["solution"]
            )


LONG_SOLUTION = (
    "".join(f"Step {k}: we multiply both sides by {k} and check that π·{k} ≤ {4 * k}. " for k in range(1, 60))
    + "So the answer is \\boxed{42}."
)


@pytest.mark.parametrize("family", ["chatml", "qwen3", "llama3", "plain"])
def test_truncation_keeps_the_end_of_the_solution_and_always_fits(family):
    tokenizer = build_tokenizer(family)
    problems = [*PROBLEMS, {"index": 44, "question": "Find the answer.", "solution": LONG_SOLUTION}]
    batch = make_batch(tokenizer, problems, n=2)
    width = 140
    hint_batch, metrics = build_hint_batch(batch, tokenizer, _config(max_prompt_length=width))
    for row in range(len(batch)):
        problem = _problem_of_row(batch, row)
        ids = _valid_prompt(hint_batch, row)
        assert len(ids) <= width
        if problem["index"] != 44:
            continue
        # Nearly all of the width is used: the cut stops within a few tokens of the limit.
        assert len(ids) >= width - 4
        text = tokenizer.decode(ids)
        assert "Find the answer." in text and "So the answer is \\boxed{42}." in text
        kept = text.split("REF: ", 1)[1].split("\nNow solve it", 1)[0]
        assert 0 < len(kept) < len(LONG_SOLUTION) and LONG_SOLUTION.endswith(kept)
        assert ids == _expected_prompt_ids(tokenizer, problem["question"], kept)
    assert metrics["cpo/hint_truncated_frac"] == pytest.approx(2 / len(batch))
    assert metrics["cpo/hint_prompt_len_max"] <= width


def test_prompt_that_cannot_fit_even_without_solution_names_the_dataset_index():
    tokenizer = build_tokenizer("chatml")
    problems = [*PROBLEMS, {"index": 4213, "question": "long question " * 80, "solution": "x = \\boxed{1}."}]
    batch = make_batch(tokenizer, problems, prompt_width=800)
    with pytest.raises(ValueError, match=r"dataset index 4213.*empty solution.*max_prompt_length=160"):
        build_hint_batch(batch, tokenizer, _config())


@pytest.mark.parametrize("bad_solution", [None, "", "   ", float("nan"), "absent"])
def test_missing_solution_is_an_error_naming_key_and_index(bad_solution):
    tokenizer = build_tokenizer("chatml")
    extra_infos = [dict(problem) for problem in PROBLEMS]
    if bad_solution == "absent":
        del extra_infos[1]["solution"]
    else:
        extra_infos[1]["solution"] = bad_solution
    batch = make_batch(tokenizer, PROBLEMS, extra_infos=extra_infos)
    with pytest.raises(ValueError, match=r"dataset index 22.*extra_info\['solution'\].*on_missing=skip"):
        build_hint_batch(batch, tokenizer, _config())


def test_skip_keeps_the_original_prompt_and_marks_the_rows():
    tokenizer = build_tokenizer("llama3")
    extra_infos = [dict(problem) for problem in PROBLEMS]
    extra_infos[0]["solution"] = None
    batch = make_batch(tokenizer, PROBLEMS, extra_infos=extra_infos)
    hint_batch, metrics = build_hint_batch(batch, tokenizer, _config(on_missing="skip"))
    missing = hint_batch.non_tensor_batch["hint_missing"]
    expected_missing = np.array([info["index"] == 11 for info in batch.non_tensor_batch["extra_info"]])
    np.testing.assert_array_equal(missing, expected_missing)
    for row in range(len(batch)):
        original_mask = batch.batch["attention_mask"][row, :96].bool()
        original_prompt = batch.batch["prompts"][row][original_mask].tolist()
        assert (_valid_prompt(hint_batch, row) == original_prompt) == bool(missing[row])
    assert metrics["cpo/hint_missing_frac"] == pytest.approx(1 / 3)
    hinted_lengths = [len(_valid_prompt(hint_batch, row)) for row in range(len(batch)) if not missing[row]]
    assert metrics["cpo/hint_prompt_len_mean"] == pytest.approx(np.mean(hinted_lengths))


def test_skip_with_every_solution_missing():
    tokenizer = build_tokenizer("chatml")
    batch = make_batch(tokenizer, PROBLEMS, extra_infos=[{"index": p["index"]} for p in PROBLEMS])
    hint_batch, metrics = build_hint_batch(batch, tokenizer, _config(on_missing="skip"))
    assert hint_batch.non_tensor_batch["hint_missing"].all()
    # The original rows, less the padding columns that no row uses.
    width = hint_batch.batch["prompts"].shape[1]
    first_column = 96 - width
    assert (
        not batch.batch["attention_mask"][:, :first_column].any()
        and batch.batch["attention_mask"][:, first_column].any()
    )
    for key in ("input_ids", "attention_mask", "position_ids"):
        torch.testing.assert_close(hint_batch.batch[key], batch.batch[key][:, first_column:], msg=key)
    assert metrics == {
        "cpo/hint_prompt_len_mean": 0.0,
        "cpo/hint_prompt_len_max": 0.0,
        "cpo/hint_truncated_frac": 0.0,
        "cpo/hint_missing_frac": 1.0,
    }


@pytest.mark.parametrize("family", ["chatml", "plain"])
def test_no_system_message(family):
    tokenizer = build_tokenizer(family)
    batch = make_batch(tokenizer, PROBLEMS)
    hint_batch, _ = build_hint_batch(batch, tokenizer, _config(system=None))
    for row in range(len(batch)):
        problem = _problem_of_row(batch, row)
        user = _expected_user(problem["question"], problem["solution"])
        if tokenizer.chat_template is None:
            expected = tokenizer(f"{user}\n\n")["input_ids"]
        else:
            messages = [{"role": "user", "content": user}]
            expected = list(
                tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
            )
        assert _valid_prompt(hint_batch, row) == expected


def test_custom_solution_key_and_question_from_raw_prompt():
    tokenizer = build_tokenizer("chatml")
    extra_infos = [{"index": p["index"], "gold": p["solution"]} for p in PROBLEMS]  # no "question" key
    batch = make_batch(tokenizer, PROBLEMS, extra_infos=extra_infos)
    hint_batch, _ = build_hint_batch(batch, tokenizer, _config(solution_key="gold"))
    for row in range(len(batch)):
        index = batch.non_tensor_batch["extra_info"][row]["index"]
        problem = next(p for p in PROBLEMS if p["index"] == index)
        expected = _expected_prompt_ids(tokenizer, problem["question"] + DATA_SUFFIX, problem["solution"])
        assert _valid_prompt(hint_batch, row) == expected


def test_no_question_anywhere_is_an_error():
    tokenizer = build_tokenizer("chatml")
    extra_infos = [{"index": p["index"], "solution": p["solution"]} for p in PROBLEMS]
    batch = make_batch(tokenizer, PROBLEMS, extra_infos=extra_infos)
    batch.non_tensor_batch.pop("raw_prompt")
    with pytest.raises(ValueError, match=r"dataset index \d+.*no question found"):
        build_hint_batch(batch, tokenizer, _config())


def test_unresolved_width_or_slow_tokenizer_is_an_error():
    tokenizer = build_tokenizer("chatml")
    batch = make_batch(tokenizer, PROBLEMS)
    with pytest.raises(ValueError, match="HintConfig.resolve"):
        build_hint_batch(batch, tokenizer, _config(max_prompt_length=None))
    with pytest.raises(TypeError, match="fast tokenizer"):
        build_hint_batch(batch, object(), _config())


def test_fill_user_template_substitutes_once_and_keeps_literal_braces():
    filled = fill_user_template("A {question} | B {solution} | \\boxed{} {other}", "q {solution}", "s {question}")
    assert filled == "A q {solution} | B s {question} | \\boxed{} {other}"


def test_default_template_renders_its_elements():
    filled = fill_user_template(DEFAULT_USER_TEMPLATE, "QUESTION-TEXT", "SOLUTION-TEXT")
    assert "QUESTION-TEXT" in filled and "SOLUTION-TEXT" in filled
    assert "\\boxed{}" in filled and "{question}" not in filled and "{solution}" not in filled
    assert filled.index("QUESTION-TEXT") < filled.index("SOLUTION-TEXT")


def test_hint_config_from_config_resolve_and_validation():
    assert HintConfig.from_config(None) == HintConfig()
    config = HintConfig.from_config(OmegaConf.create({"on_missing": "skip", "max_prompt_length_margin": 100}))
    assert config.on_missing == "skip" and config.max_prompt_length is None
    assert config.resolve(2048).max_prompt_length == 2148
    assert HintConfig(max_prompt_length=3000).resolve(2048).max_prompt_length == 3000
    assert HintConfig.from_config({"enable_thinking": False}).enable_thinking is False
    with pytest.raises(ValueError, match=r"Unknown cpo.hint key\(s\) \['solution_keys'\]"):
        HintConfig.from_config({"solution_keys": "x"})
    with pytest.raises(ValueError, match="on_missing"):
        HintConfig(on_missing="ignore")
    assert HintConfig().rescore == "needed" and HintConfig.from_config({"rescore": "all"}).rescore == "all"
    with pytest.raises(ValueError, match=r"cpo.hint.rescore must be one of needed, all, got 'some'"):
        HintConfig(rescore="some")
    with pytest.raises(ValueError, match=r"\['solution'\]"):
        HintConfig(user_template="only {question}")
    with pytest.raises(ValueError, match="max_prompt_length"):
        HintConfig(max_prompt_length=0)
    with pytest.raises(ValueError, match="margin"):
        HintConfig(max_prompt_length_margin=-1)
    with pytest.raises(ValueError, match="cpo.hint must be a mapping"):
        HintConfig.from_config(["on_missing"])


def test_chat_messages_are_the_system_and_the_filled_template():
    config = HintConfig(system="S", user_template="Q={question} A={solution} {x}")
    assert config.chat_messages("2+2", "4") == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q=2+2 A=4 {x}"},
    ]
    assert HintConfig(system=None).chat_messages("q", "s")[0]["role"] == "user"


def test_the_tiny_tokenizer_learns_the_recipes_hint_wording():
    """The recipe writes its default hint wording (``teacher.hint``); the tiny tokenizer learns a frozen copy
    (``tiny_assets.INSTRUCTION_CORPUS``), part of every tiny asset's cache key. When this fails, the recipe's wording
    changed: keep the frozen copy as it is and update this test to the new text, or change both and rebuild every tiny
    asset (and the shipped warm start)."""
    from treetune_recipe.cpo.teacher.hint import DEFAULT_SYSTEM, DEFAULT_USER_TEMPLATE
    from treetune_verl.tiny_assets import INSTRUCTION_CORPUS

    assert (DEFAULT_SYSTEM, DEFAULT_USER_TEMPLATE) == INSTRUCTION_CORPUS
    assert "{question}" in DEFAULT_USER_TEMPLATE and "{solution}" in DEFAULT_USER_TEMPLATE
