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


def test_defaults_are_the_reference_main_run():
    cfg = CPOConfig()
    assert (cfg.wrap_method, cfg.cpo_lambda, cfg.pos_alpha, cfg.neg_alpha) == ("seq_kl", 2.0, 0.0, 1.0)
    assert (cfg.loss_position, cfg.difficulty_mode, cfg.success_value, cfg.hint) == ("all", "group", 1.0, {})
    assert all(f.metadata.get("help") for f in dataclasses.fields(CPOConfig))


def test_from_omegaconf_block_with_nested_hint_and_interpolation():
    root = OmegaConf.create(
        {
            "lam": 3,
            "cpo": {"wrap_method": "mi3", "cpo_lambda": "${lam}", "neg_alpha": 0.1, "hint": {"template": "x", "n": 2}},
        }
    )
    cfg = CPOConfig.from_config(root.cpo)
    assert cfg.wrap_method == "mi3" and cfg.neg_alpha == 0.1 and cfg.pos_alpha == 0.0
    assert cfg.cpo_lambda == 3.0 and isinstance(cfg.cpo_lambda, float)
    assert cfg.hint == {"template": "x", "n": 2} and type(cfg.hint) is dict


def test_from_dict_and_none():
    assert CPOConfig.from_config({"loss_position": "first_seq"}).loss_position == "first_seq"
    assert CPOConfig.from_config(None) == CPOConfig()


def test_pickles_by_value():
    cfg = CPOConfig(wrap_method="tok_kl", hint={"a": 1})
    assert pickle.loads(pickle.dumps(cfg)) == cfg


def test_null_alpha_is_allowed_and_disables_the_branch():
    assert CPOConfig.from_config(OmegaConf.create({"pos_alpha": None})).pos_alpha is None


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"wrap_method": "seqkl"}, r"Unknown cpo.wrap_method 'seqkl'.*naive, naive_qwen3, .*tok_kl"),
        ({"loss_position": "last"}, r"Unknown cpo.loss_position 'last'.*all, entropy, first"),
        ({"difficulty_mode": "batch"}, r"Unknown cpo.difficulty_mode 'batch'.*group, reference"),
        ({"cpo_lambda": 1.0}, r"cpo.cpo_lambda must be > 1"),
        ({"cpo_lambda": 0.5}, r"cpo.cpo_lambda must be > 1"),
        ({"rlsd_lambda": 1.5}, r"cpo.rlsd_lambda must lie in \[0, 1\]"),
        ({"rlsd_lambda": -0.1}, r"cpo.rlsd_lambda must lie in \[0, 1\]"),
        ({"rlsd_clip": 1.0}, r"cpo.rlsd_clip must lie in \[0, 1\)"),
        ({"rlsd_clip": None}, r"cpo.rlsd_clip must be a number"),
        ({"neg_alpha": float("nan")}, r"cpo.neg_alpha must be finite, got nan"),
        ({"pos_alpha": float("inf")}, r"cpo.pos_alpha must be finite, got inf"),
        ({"cpo_lambda": float("inf")}, r"cpo.cpo_lambda must be finite, got inf"),
        ({"success_value": float("-inf")}, r"cpo.success_value must be finite, got -inf"),
        ({"neg_alpha": "0.5"}, r"cpo.neg_alpha must be a number, got '0.5'"),
        ({"cpo_lambda": True}, r"cpo.cpo_lambda must be a number"),
        ({"cpo_lambda": None}, r"cpo.cpo_lambda must be a number"),
        ({"hint": [1, 2]}, r"cpo.hint must be a mapping"),
        ({"wrap_methd": "mi"}, r"Unknown cpo config key\(s\) \['wrap_methd'\]. Valid keys: wrap_method, "),
    ],
)
def test_invalid_values_raise_a_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        CPOConfig.from_config(overrides)
