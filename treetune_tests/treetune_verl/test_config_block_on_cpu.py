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
"""``treetune_verl.config_block``: one parser for every typed config block, and the check of command-line overrides."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from omegaconf import OmegaConf

from treetune_verl.config_block import block_keys, check_block_overrides, dataclass_from_block
from treetune_verl.preflight import PreflightError


@dataclass(frozen=True)
class Inner:
    mode: str = "a"
    steps: tuple[int, ...] = ()

    def __post_init__(self):
        if self.mode not in ("a", "b"):
            raise ValueError(f"Unknown outer.inner.mode {self.mode!r}. Valid values: a, b.")
        object.__setattr__(self, "steps", tuple(self.steps))


@dataclass
class Outer:
    rate: float = 1.0
    name: str | None = None
    inner: Inner = field(default_factory=Inner)
    derived: int = field(init=False, default=0)

    def __post_init__(self):
        if not isinstance(self.rate, int | float) or self.rate <= 0:
            raise ValueError(f"outer.rate must be a number > 0, got {self.rate!r}.")


def test_a_block_builds_its_nested_blocks_and_takes_defaults_for_what_it_leaves_out():
    root = OmegaConf.create({"r": 0.5, "outer": {"rate": "${r}", "inner": {"mode": "b", "steps": [1, 2]}}})
    built = dataclass_from_block(Outer, root.outer, "outer")
    assert built == Outer(rate=0.5, inner=Inner(mode="b", steps=(1, 2)))
    assert type(built.inner) is Inner and built.inner.steps == (1, 2)
    assert dataclass_from_block(Outer, None, "outer") == Outer()
    assert dataclass_from_block(Outer, {"inner": None}, "outer") == Outer()
    assert dataclass_from_block(Outer, built, "outer") is built
    assert block_keys(Outer) == ["rate", "name", "inner"]  # init=False fields are no keys


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"rat": 2.0}, "Unknown outer key(s) ['rat']; valid keys: rate, name, inner."),
        ({"inner": {"mod": "a"}}, "Unknown outer.inner key(s) ['mod']; valid keys: mode, steps."),
        ({"derived": 3}, "Unknown outer key(s) ['derived']; valid keys: rate, name, inner."),
        ([1, 2], "outer must be a mapping of its keys (rate, name, inner), got [1, 2]."),
        ({"inner": "b"}, "outer.inner must be a mapping of its keys (mode, steps), got 'b'."),
        ({"inner": {"mode": "c"}}, "Unknown outer.inner.mode 'c'. Valid values: a, b."),
        ({"rate": 0}, "outer.rate must be a number > 0, got 0."),
    ],
)
def test_a_bad_block_fails_in_one_line_naming_the_block_and_its_valid_keys(block, message):
    with pytest.raises(ValueError) as raised:
        dataclass_from_block(Outer, block, "outer")
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("outer.bogus=1", "outer.bogus=1: outer has no key 'bogus'; valid keys of outer: rate, name, inner."),
        ("+outer.bogus=1", "+outer.bogus=1: outer has no key 'bogus'; valid keys of outer: rate, name, inner."),
        ("++outer.inner.x=1", "++outer.inner.x=1: outer.inner has no key 'x'; valid keys of outer.inner: mode, steps."),
        ("~outer.derived", "~outer.derived: outer has no key 'derived'; valid keys of outer: rate, name, inner."),
        ("outer.rate.x=1", "outer.rate.x=1: outer.rate is a value, not a block of keys."),
        ("outer.inner.mode=c", "Unknown outer.inner.mode 'c'. Valid values: a, b."),
        ("outer.rate=-1", "outer.rate must be a number > 0, got -1."),
    ],
)
def test_a_bad_override_stops_in_one_line_before_composition(override, message):
    with pytest.raises(PreflightError) as raised:
        check_block_overrides(["trainer.x=1", override], "outer", Outer)
    assert str(raised.value) == message and "\n" not in str(raised.value)


def test_good_overrides_and_what_only_the_composed_config_can_tell_pass():
    check_block_overrides([], "outer", Outer)
    check_block_overrides(["other.bogus=1", "+outerx=2", "outer=3"], "outer", Outer)  # not keys of the block
    check_block_overrides(
        ["outer.rate=2", "outer.name=null", "outer.inner.steps=[1,2]", "+outer.inner.mode=b", "~outer.name"],
        "outer",
        Outer,
    )
    # Sweeps and interpolations are checked once composed (each job's own preflight); their keys are checked now.
    check_block_overrides(["outer.inner.mode=a,c", "outer.rate=${x}"], "outer", Outer)
    with pytest.raises(PreflightError, match="has no key 'mod'"):
        check_block_overrides(["outer.inner.mod=a,b"], "outer", Outer)
    # A later override of the same key wins, as in Hydra.
    check_block_overrides(["outer.rate=-1", "outer.rate=1"], "outer", Outer)
    with pytest.raises(PreflightError, match="got -1"):
        check_block_overrides(["outer.rate=1", "outer.rate=-1"], "outer", Outer)
