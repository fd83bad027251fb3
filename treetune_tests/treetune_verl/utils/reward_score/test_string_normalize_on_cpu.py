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
"""The normalised string rule (expected values worked out by hand from the module's rules)."""

import pytest

from treetune_verl.utils.reward_score.string_normalize import normalize_answer, strings_equivalent


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),
        ("\\tfrac12", "\\frac{1}{2}"),
        ("\\frac1{2}", "\\frac{1}{2}"),
        ("3/4", "\\frac{3}{4}"),
        ("\\sqrt2/2", "\\frac{\\sqrt{2}}{2}"),
        ("10\\text{ cm}", "10"),
        ("\\text{(B)}", "{(B)}"),  # the unit rule would leave nothing, so only `\text` is deleted
        ("50\\%", "50"),
        ("90^\\circ", "90"),
        ("\\$5.00", "5"),
        ("x = 3", "3"),
        ("k=\\left( 1, 2 \\right)", "(1,2)"),
        ("1,000,000", "1000000"),
        ("1,2", "1,2"),
        (".5", "0.5"),
        ("2.0", "2"),
        ("\\langle 1, 2 \\rangle", "\\langle1,2\\rangle"),
        ("1 and 2", "12"),
        ("3.", "3"),
        ("", ""),
        (None, ""),
    ],
)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


def test_strings_equivalent_needs_a_non_empty_answer():
    assert strings_equivalent("\\dfrac12", "\\frac{1}{2}")
    assert not strings_equivalent("", "")
    assert not strings_equivalent("0.5", "\\frac{1}{2}")  # numeric equivalence is math-verify's job
