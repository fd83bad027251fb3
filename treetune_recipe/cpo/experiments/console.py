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
"""The console form of a CPU run's output (the demo, each experiment run): one short line per training step.

:func:`condense` keeps the metrics a researcher watches (score, losses, the CPO shaping magnitude, step time and the
task's greedy validation accuracy :data:`~treetune_recipe.cpo.experiments.task.GREEDY_VAL_ACC_KEY`) and the lines
that report a failure; the full output goes to the run's log.
"""

from __future__ import annotations

import re

from treetune_recipe.cpo.experiments.task import GREEDY_VAL_ACC_KEY

_STEP_LINE = re.compile(r"step:(\d+) - (.*)")
# A console value is a plain number or, with numpy 2, its repr (``np.float64(0.25)``).
_VALUE = re.compile(r"(?:np\.\w+\()?([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?nan|[-+]?inf)\)?")
_STEP_SUMMARY_KEYS = {
    "score": "critic/score/mean",
    "pg_loss": "actor/pg_loss",
    "kl_loss": "actor/kl_loss",
    "grad_norm": "actor/grad_norm",
    "cpo_adv_shift": "actor/cpo/adv_delta_absmean",
    "hint_logratio": "cpo/gw_minus_old_absmean",
    "step_s": "timing_s/step",
    "val_acc": GREEDY_VAL_ACC_KEY,
}
_ALWAYS_SHOWN = ("Error", "Traceback", "preflight", "Exception", "Final validation")


def condense(line: str) -> str | None:
    """The console form of one trainer output line: a one-line step summary, a kept line, or None (hidden)."""
    match = _STEP_LINE.search(line)
    if match:
        metrics = dict(part.split(":", 1) for part in match.group(2).split(" - ") if ":" in part)
        values = {key: _VALUE.fullmatch(metrics[key].strip()) for key in _STEP_SUMMARY_KEYS.values() if key in metrics}
        cells = [f"{label}={float(values[key][1]):.4g}" for label, key in _STEP_SUMMARY_KEYS.items() if values.get(key)]
        return f"step {match.group(1)}: " + " ".join(cells)
    if any(marker in line for marker in _ALWAYS_SHOWN):
        return line
    return None
