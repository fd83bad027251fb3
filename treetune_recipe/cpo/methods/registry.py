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
"""Every method of the recipe, loaded: where the config, the preflight, the experiment and the tests look a method up.

Importing it imports the method modules, which register themselves
(:func:`treetune_recipe.cpo.methods.method.register_method`): the modules of :data:`METHOD_MODULES`, in that order. The
declarations (:mod:`treetune_recipe.cpo.methods.method`) import no method module, so the registry and its entries form
no import circle.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from treetune_recipe.cpo.methods.advantage_terms import CPORows, success_value_of
from treetune_recipe.cpo.methods.method import ADVANTAGE_WRAPPERS, METHODS, Method, registered_method

#: The method modules, each registering its methods on import, in the registry's order: CPO's 18 wrappers, then the
#: published peers. A new method is one module here.
METHOD_MODULES = ("cpo_wrappers", "rlsd", "opsd", "sdpo", "sdpg")
for _module in METHOD_MODULES:
    importlib.import_module(f"treetune_recipe.cpo.methods.{_module}")
# The registry's order is the modules' order, whichever module a caller imported first.
_rank = {f"treetune_recipe.cpo.methods.{module}": i for i, module in enumerate(METHOD_MODULES)}
_ordered = sorted(METHODS.values(), key=lambda method: _rank.get(method.module, len(_rank)))
METHODS.clear()
METHODS.update({method.name: method for method in _ordered})

#: name -> advantage wrapper of every registered method that has one (the 18 CPO wrappers and the peers' advantage
#: forms).
CPO_WRAPPERS = ADVANTAGE_WRAPPERS


def get_method(name: str) -> Method:
    """The method selected by ``cpo.method=<name>``; ValueError listing the valid names otherwise."""
    return registered_method(name)


def all_methods() -> dict[str, Method]:
    """Every method, by name, in the order of :data:`METHOD_MODULES` (the 18 CPO wrappers first, then the peers)."""
    return METHODS


def rows_reading_hint(
    name: str,
    *,
    seq_rewards: torch.Tensor,
    difficulty: torch.Tensor,
    cfg,
    advantages: torch.Tensor | None = None,
) -> torch.Tensor:
    """The rows whose shaped advantages depend on ``teacher_log_probs`` under method ``name`` and ``cfg``.

    On every other row the wrapper's output is bit-for-bit the same whatever ``teacher_log_probs`` holds there, so the
    trainer scores only these rows under the hint prompt (``cpo.hint.rescore=needed``) and gives the others
    ``teacher_log_probs = old_log_probs``. Each method declares its rule (``Method.hint_rows``); a distribution-level
    method reads every row.

    Args:
        name: a registered method name.
        seq_rewards: ``[B]`` sequence rewards (correct means r == ``cfg.success_value``, as in the wrappers).
        difficulty: ``[B]`` difficulty labels (-1, 0, +1).
        cfg: any object with ``pos_alpha``, ``neg_alpha`` (and ``cpo_lambda``, ``success_value``), as for the
            wrappers.
        advantages: ``[B, T]`` advantages, for the rules that depend on them (``rlsd``: rows with A != 0).

    Returns:
        bool ``[B]``.
    """
    method = registered_method(name)
    rows = CPORows(seq_rewards, difficulty, advantages, success_value_of(cfg))
    if method.hint_rows is None:
        return rows.every
    return method.hint_rows(rows, cfg)


def get_cpo_wrapper(name: str) -> Callable[..., torch.Tensor]:
    """The advantage wrapper of method ``name``; ValueError listing the valid names otherwise."""
    method = registered_method(name)
    if method.advantage is None:
        raise ValueError(
            f"cpo.method={name} has a distribution-level loss, not an advantage wrapper. Methods with a "
            f"wrapper: {', '.join(CPO_WRAPPERS)}."
        )
    return method.advantage
