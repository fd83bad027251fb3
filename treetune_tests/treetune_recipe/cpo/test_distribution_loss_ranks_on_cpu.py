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
"""Two data-parallel ranks (gloo, two CPU processes) give the loss and the gradient of one: the distribution-level
update with the teacher inside it, on the reference engine, FSDP-sharded over the ranks.

Each rank holds half of the 8 rows (verl's contiguous dispatch) in fixed micro-batches of 2; the teacher's forward runs
on every rank for every micro-batch (its FSDP collectives line up); the per-sequence mean divides by the rows of the
whole mini-batch, so the ranks' losses sum to the one-rank loss. Checked: ``actor/distill_loss`` summed over the
micro-batches, the (global) grad norm, and the updated weights. Control: one rank holding only the first rank's rows
(a rank's rows lost) differs in all three.
"""

import pytest
import torch

from treetune_tests.support.two_rank_update import ALL_ROWS, HALF_ROWS, run_updates
from treetune_verl.tiny_assets import CONTEXT_SENSITIVE, build_tiny_assets
from treetune_verl.version import installed_verl_version

pytestmark = [
    pytest.mark.skipif(not installed_verl_version().startswith("0.9."), reason="the logits hook is verl 0.9.x only"),
    pytest.mark.timeout(600),
]
METHODS = ["opsd", "sdpo"]


def assert_same_update(got: dict, expected: dict, what: str) -> None:
    names = ("distill_loss", "grad_norm")
    torch.testing.assert_close(
        torch.tensor([got["report"][n] for n in names], dtype=torch.float64),
        torch.tensor([expected["report"][n] for n in names], dtype=torch.float64),
        rtol=1e-5,
        atol=1e-7,
        msg=lambda m: f"{what}: {got['report']} vs {expected['report']}: {m}",
    )
    torch.testing.assert_close(got["weights"], expected["weights"], rtol=1e-5, atol=1e-6, msg=lambda m: f"{what}: {m}")


@pytest.fixture(scope="module")
def updates(tmp_path_factory):
    """One update per method by one rank on every row and (control) on the first rank's rows only, and by two ranks on
    every row; two spawns in all."""
    assets, out = build_tiny_assets(config=CONTEXT_SENSITIVE), tmp_path_factory.mktemp("ranks")
    one = run_updates(assets, METHODS, world=1, row_sets=[ALL_ROWS, HALF_ROWS], out_dir=out)
    two = run_updates(assets, METHODS, world=2, row_sets=[ALL_ROWS], out_dir=out)
    return one, two


@pytest.mark.parametrize("method", METHODS)
def test_two_ranks_give_the_loss_and_gradient_of_one(updates, method):
    one, two = updates
    every, half, both = one[method, len(ALL_ROWS)], one[method, len(HALF_ROWS)], two[method, len(ALL_ROWS)]
    assert every["report"]["teacher_forwards"] == 4 and both["report"]["teacher_forwards"] == 2  # one per micro-batch
    assert every["report"]["distill_loss"] > 0 and every["report"]["grad_norm"] > 0
    assert_same_update(both, every, f"{method}: two ranks vs one")
    with pytest.raises(AssertionError):  # control: a rank's rows lost
        assert_same_update(half, every, f"{method}: one rank's rows only vs all")
