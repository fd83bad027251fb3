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
"""CPOConfig: defaults of the reference's main run, construction from the ``cpo:`` block, validation errors."""

import dataclasses
import pickle

import pytest
from omegaconf import OmegaConf

from treetune_recipe.cpo.config import CPOConfig
from treetune_recipe.cpo.reports.credit_dump import CreditDumpConfig
from treetune_recipe.cpo.teacher.hint import DEFAULT_USER_TEMPLATE, HintConfig


def test_every_knob_has_help_text():
    assert all(f.metadata.get("help") for f in dataclasses.fields(CPOConfig))


def test_from_omegaconf_block_with_nested_hint_and_interpolation():
    root = OmegaConf.create(
        {
            "lam": 3,
            "margin": 7,
            "cpo": {
                "method": "mi3",
                "cpo_lambda": "${lam}",
                "neg_alpha": 0.1,
                "hint": {"on_missing": "skip", "max_prompt_length_margin": "${margin}", "user_template": None},
                "credit_dump": {"steps": [2, 4]},
            },
        }
    )
    cfg = CPOConfig.from_config(root.cpo)
    assert cfg.method == "mi3" and cfg.neg_alpha == 0.1 and cfg.pos_alpha == 0.0
    assert cfg.cpo_lambda == 3.0 and isinstance(cfg.cpo_lambda, float)
    assert cfg.hint == HintConfig(on_missing="skip", max_prompt_length_margin=7)
    assert cfg.hint.user_template == DEFAULT_USER_TEMPLATE  # null = the built-in wording
    assert cfg.credit_dump == CreditDumpConfig(steps=(2, 4))


def test_from_dict_and_none():
    assert CPOConfig.from_config({"loss_position": "first_seq"}).loss_position == "first_seq"
    assert CPOConfig.from_config(None) == CPOConfig()


def test_pickles_by_value():
    cfg = CPOConfig.from_config({"method": "rlsd", "hint": {"rescore": "all"}, "credit_dump": {"steps": [1]}})
    copy = pickle.loads(pickle.dumps(cfg))
    assert copy == cfg and copy.hint.rescore == "all" and copy.teacher_config == cfg.teacher_config


def test_null_alpha_is_allowed_and_disables_the_branch():
    assert CPOConfig.from_config(OmegaConf.create({"pos_alpha": None})).pos_alpha is None


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"method": "seqkl"}, r"Unknown cpo.method 'seqkl'.*naive, naive_qwen3, .*tok_kl"),
        ({"loss_position": "last"}, r"Unknown cpo.loss_position 'last'.*all, entropy, first"),
        ({"difficulty_mode": "batch"}, r"Unknown cpo.difficulty_mode 'batch'.*group, reference"),
        ({"cpo_lambda": 1.0}, r"cpo.cpo_lambda must be > 1"),
        ({"cpo_lambda": 0.5}, r"cpo.cpo_lambda must be > 1"),
        ({"rlsd": {"mix_lambda": 1.5}}, r"cpo.rlsd.mix_lambda must lie in \[0, 1\]"),
        ({"rlsd_lambda": -0.1}, r"cpo.rlsd.mix_lambda must lie in \[0, 1\]"),  # the old key: an alias
        ({"rlsd": {"clip": 1.0}}, r"cpo.rlsd.clip must lie in \[0, 1\)"),
        ({"rlsd": {"clip": None}}, r"cpo.rlsd.clip must be a number"),
        ({"neg_alpha": float("nan")}, r"cpo.neg_alpha must be finite, got nan"),
        ({"pos_alpha": float("inf")}, r"cpo.pos_alpha must be finite, got inf"),
        ({"cpo_lambda": float("inf")}, r"cpo.cpo_lambda must be finite, got inf"),
        ({"success_value": float("-inf")}, r"cpo.success_value must be finite, got -inf"),
        ({"neg_alpha": "0.5"}, r"cpo.neg_alpha must be a number or null, got '0.5'"),
        ({"cpo_lambda": True}, r"cpo.cpo_lambda must be a number"),
        ({"cpo_lambda": None}, r"cpo.cpo_lambda must be a number"),
        ({"hint": [1, 2]}, r"cpo.hint must be a mapping"),
        (
            {"wrap_methd": "mi"},
            r"^Unknown cpo key\(s\) \['wrap_methd'\]; valid keys: rlsd, opsd, sdpo, sdpg, method, .*, "
            r"credit_dump\.$",
        ),
        (
            {"hint": {"solution_keys": "x"}},
            r"^Unknown cpo.hint key\(s\) \['solution_keys'\]; valid keys: question_key, ",
        ),
        ({"credit_dump": {"step": [1]}}, r"^Unknown cpo.credit_dump key\(s\) \['step'\]; valid keys: steps, dir, "),
        ({"credit_dump": {"steps": 3}}, r"cpo.credit_dump.steps must be a list of integers, got 3"),
        ({"teacher_config": {}}, r"^Unknown cpo key\(s\) \['teacher_config'\]"),  # derived, not a key
    ],
)
def test_invalid_values_raise_a_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message) as raised:
        CPOConfig.from_config(overrides)
    assert "\n" not in str(raised.value)


def test_a_nested_block_is_typed_not_a_dict():
    with pytest.raises(ValueError, match="cpo.hint must be a HintConfig"):
        CPOConfig(hint={"rescore": "all"})
