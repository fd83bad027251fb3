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
"""``treetune_verl.config_block.check_field_types``: a block's value types come from its fields' annotations."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import pytest

from treetune_recipe.cpo.config import CPOConfig
from treetune_recipe.cpo.methods.sdpo import SDPOKnobs
from treetune_verl.config_block import check_field_types, dataclass_from_block, field_type_problems


@dataclass(frozen=True)
class Inner:
    steps: tuple[int, ...] = ()
    names: list[str] = field(default_factory=list)

    def __post_init__(self):
        check_field_types(self, "outer.inner")


@dataclass(frozen=True)
class Outer:
    flag: bool = False
    count: int = 1
    rate: float = 1.0
    limit: int | None = None
    label: Optional[str] = None  # noqa: UP045 (the old spelling is read too)
    anything: Any = None
    inner: Inner = field(default_factory=Inner)

    def __post_init__(self):
        check_field_types(self, "outer")


@pytest.mark.parametrize(
    "values, message",
    [
        ({"count": True}, "outer.count must be an integer, got True."),
        ({"rate": True}, "outer.rate must be a number, got True."),
        ({"flag": 1}, "outer.flag must be true or false, got 1."),
        ({"count": 1.0}, "outer.count must be an integer, got 1.0."),
        ({"rate": None}, "outer.rate must be a number, got None."),
        ({"limit": "3"}, "outer.limit must be an integer or null, got '3'."),
        ({"label": 3}, "outer.label must be a string or null, got 3."),
    ],
)
def test_a_value_that_does_not_fit_its_annotation_is_one_line_naming_the_dotted_key(values, message):
    with pytest.raises(ValueError) as raised:
        Outer(**values)
    assert str(raised.value) == message


def test_values_that_fit_are_kept_and_a_float_field_takes_an_int_as_a_float():
    built = Outer(flag=True, count=3, rate=2, limit=None, label=None, anything=object())
    assert built.flag is True and built.count == 3 and type(built.count) is int
    assert built.rate == 2.0 and type(built.rate) is float
    assert Outer(limit=4, label="x").limit == 4


def test_the_elements_of_a_list_field_are_checked_and_the_container_is_the_annotated_one():
    assert Inner(steps=[1, 2], names=("a",)) == Inner(steps=(1, 2), names=["a"])
    for values, message in [
        ({"steps": [1, True]}, "outer.inner.steps must be a list of integers, got [1, True]."),
        ({"steps": 3}, "outer.inner.steps must be a list of integers, got 3."),
        ({"names": "cpu"}, "outer.inner.names must be a list of strings, got 'cpu'."),
    ]:
        with pytest.raises(ValueError) as raised:
            Inner(**values)
        assert str(raised.value) == message


def test_a_nested_block_is_checked_by_its_own_type_and_built_from_a_mapping():
    with pytest.raises(ValueError, match=r"^outer.inner must be an Inner, got \{'steps': \[1\]\}; build the whole"):
        Outer(inner={"steps": [1]})
    assert dataclass_from_block(Outer, {"inner": {"steps": [1]}}, "outer").inner.steps == (1,)
    with pytest.raises(ValueError, match=r"^outer.inner.steps must be a list of integers, got \['1'\]\.$"):
        dataclass_from_block(Outer, {"inner": {"steps": ["1"]}}, "outer")


def test_every_wrong_key_is_listed_for_a_block_that_reports_them_all():
    built = Outer()
    object.__setattr__(built, "count", False)
    object.__setattr__(built, "rate", 3)
    assert field_type_problems(built, "outer") == {"count": "outer.count must be an integer, got False."}
    assert built.rate == 3.0 and type(built.rate) is float  # what fits is set to its annotated form


def test_a_block_built_in_python_is_refused_like_one_read_from_the_config():
    with pytest.raises(ValueError, match=r"^cpo.sdpo.top_k must be an integer, got True\.$"):
        SDPOKnobs(top_k=True)
    with pytest.raises(ValueError, match=r"^cpo.sdpo.top_k must be an integer, got True\.$"):
        CPOConfig.from_config({"sdpo": {"top_k": True}})
    assert SDPOKnobs(top_k=5, alpha=1).alpha == 1.0
    with pytest.raises(ValueError, match=r"^cpo.drift_metrics must be true or false, got 'yes'\.$"):
        CPOConfig(drift_metrics="yes")
    assert CPOConfig(drift_metrics=True, cpo_lambda=3).cpo_lambda == 3.0
