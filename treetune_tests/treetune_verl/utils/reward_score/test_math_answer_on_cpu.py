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
"""compute_score: routes, score formats, equivalences and robustness (expectations hand-labelled in the fixture)."""

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from treetune_verl.utils.reward_score.math_answer import compute_score, resolve_route

FIXTURES = Path(__file__).resolve().parents[4] / "treetune_tests" / "fixtures"
CASES = [json.loads(line) for line in (FIXTURES / "reward_cases.jsonl").read_text(encoding="utf-8").splitlines()]
RESULT_KEYS = {"score", "acc", "pred", "route", "extraction", "verify_timeout", "parse_failed"}


def _score(case, **kwargs):
    extra_info = {"question": case["question"]} if "question" in case else {"index": 0}
    return compute_score(case["data_source"], case["response"], case["ground_truth"], extra_info, **kwargs)


@pytest.mark.parametrize("case", CASES, ids=[case["note"] for case in CASES])
def test_hand_labelled_cases(case):
    result = _score(case)
    assert set(result) == RESULT_KEYS
    assert result["acc"] is case["expected_acc"], result
    assert result["verify_timeout"] == 0


@pytest.mark.parametrize(
    "data_source, route, zero_one",
    [
        ("hendrycks_math", "math", False),
        ("hendrycks_math01", "math", True),
        ("math500", "math", False),
        ("MATH", "math", False),
        ("lighteval/MATH", "math", False),
        ("aime2024", "competition", False),
        ("aime202401", "competition", True),
        ("aime2025", "competition", False),
        ("aime202501", "competition", True),
        ("amc23", "competition", False),
        ("amc2301", "competition", True),
        ("aime2001", "competition", False),  # an AIME 2001 set, not a 0/1 twin of "aime20"
        ("gpqa", "multiple_choice", False),
        ("gpqa_diamond", "multiple_choice", False),
        ("gpqa01", "multiple_choice", True),
        ("openai/gsm8k", "generic_math", False),
        ("something01", "generic_math", False),
    ],
)
def test_routes(data_source, route, zero_one):
    assert resolve_route(data_source) == (route, zero_one)


def test_score_values_by_format():
    right, wrong = "\\boxed{5}", "\\boxed{4}"
    assert [compute_score("math500", r, "5")["score"] for r in (right, wrong)] == [1.0, -1.0]
    assert [compute_score("hendrycks_math01", r, "5")["score"] for r in (right, wrong)] == [1.0, 0.0]
    assert [compute_score("math500", r, "5", format="zero_one")["score"] for r in (right, wrong)] == [1.0, 0.0]
    assert [compute_score("amc2301", r, "5", format="plus_minus")["score"] for r in (right, wrong)] == [1.0, -1.0]
    assert all(isinstance(compute_score("gpqa", r, "B")["score"], float) for r in ("(B)", "(C)"))


def test_bad_configuration_fails_loudly():
    with pytest.raises(ValueError, match="zero_one"):
        compute_score("math500", "\\boxed{5}", "5", format="01")


def test_extra_keywords_from_verl_are_ignored():
    result = compute_score("math500", "\\boxed{5}", "5", extra_info=None, reward_router_address=None)
    assert result["acc"] is True


def test_ground_truth_lists_and_arrays_accept_any_answer():
    assert compute_score("math500", "\\boxed{3}", ["2", "3"])["acc"] is True
    assert compute_score("math500", "\\boxed{3}", np.array(["2", "3"], dtype=object))["acc"] is True
    assert compute_score("math500", "\\boxed{4}", ["2", "3"])["acc"] is False
    assert compute_score("aime2024", "\\boxed{204}", 204)["acc"] is True


def test_boxed_ground_truth_is_unboxed():
    assert compute_score("math500", "\\boxed{\\frac{1}{2}}", "so $\\boxed{0.5}$")["acc"] is True


def test_garbage_returns_with_every_key():
    garbage = "".join(chr(33 + (i * 7919) % 90) for i in range(100_000))
    for response in (garbage, garbage + "\\boxed{" + "{" * 500, "\\boxed{" + garbage[:900] + "}"):
        result = compute_score("math500", response, "5")
        assert set(result) == RESULT_KEYS and result["acc"] is False
        assert len(result["pred"]) <= 512


def test_none_and_bytes_inputs():
    assert compute_score("math500", None, "5")["acc"] is False
    assert compute_score("math500", b"\\boxed{5}", "5")["acc"] is True


def test_pathological_answer_is_cut_at_the_time_limit_and_counted():
    result = compute_score("math500", "\\boxed{2^{2^{2^{2^{10}}}}}", "1", timeout_s=0.5)
    assert result == {
        "score": -1.0,
        "acc": False,
        "pred": "2^{2^{2^{2^{10}}}}",
        "route": "math",
        "extraction": "boxed",
        "verify_timeout": 1,
        "parse_failed": 0,
    }


def test_unparseable_answer_is_counted():
    result = compute_score("math500", "\\boxed{\\foo@@}", "3")
    assert result["acc"] is False and result["parse_failed"] == 1


def test_verl_custom_reward_function_in_an_event_loop_executor():
    """The way verl 0.7.1 loads and calls it: get_custom_reward_fn, then loop.run_in_executor (a worker thread)."""
    from verl.trainer.ppo.reward import get_custom_reward_fn

    config = OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": "pkg://treetune_verl.utils.reward_score.math_answer",
                    "name": "compute_score",
                    "reward_kwargs": {"format": "zero_one"},
                }
            }
        }
    )
    reward_fn = get_custom_reward_fn(config)

    async def score_in_executor(response):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            None,
            lambda: reward_fn(data_source="math500", solution_str=response, ground_truth="(x+1)^2", extra_info={}),
        )

    async def score_both():
        return await asyncio.gather(score_in_executor("\\boxed{x^2+2x+1}"), score_in_executor("\\boxed{x^2+1}"))

    right, wrong = asyncio.run(score_both())
    assert (right["score"], right["acc"]) == (1.0, True)
    assert (wrong["score"], wrong["acc"]) == (0.0, False)
