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
"""The console form of a CPU run's output (``treetune_recipe/cpo/experiments/console.py``): a step line condensed to
the key metrics, numpy 2 reprs read as numbers, failure lines kept, everything else hidden."""

from treetune_recipe.cpo.experiments.console import condense


def test_step_line_is_condensed_to_the_key_metrics():
    line = (
        "(TaskRunner pid=1) step:3 - actor/pg_loss:-0.25 - critic/score/mean:0.5 - actor/grad_norm:1.5"
        " - timing_s/step:2.0 - response_length/mean:31"
    )
    assert condense(line) == "step 3: score=0.5 pg_loss=-0.25 grad_norm=1.5 step_s=2"
    assert condense("Traceback (most recent call last):") == "Traceback (most recent call last):"
    assert condense("'trust_remote_code': False,") is None


def test_step_line_with_numpy2_reprs_is_condensed_to_the_same_numbers():
    # With numpy 2 the trainer's console prints numpy scalars as their repr.
    line = "step:2 - critic/score/mean:np.float64(-0.5) - actor/kl_loss:np.float32(1e-03) - timing_s/step:nan"
    assert condense(line) == "step 2: score=-0.5 kl_loss=0.001 step_s=nan"


def test_validation_accuracy_is_part_of_the_step_line():
    line = "step:0 - val-core/tiny_arith/acc/mean@1:np.float64(0.265625) - val-aux/x:1"
    assert condense(line) == "step 0: val_acc=0.2656"
