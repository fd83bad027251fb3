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
(:func:`treetune_recipe.cpo.methods.register_method`): the 18 CPO wrappers, then the peers they import (RLSD, OPSD,
SDPO), in that order. The declarations (:mod:`treetune_recipe.cpo.methods`) import no method module, so the registry
and its entries form no import circle.
"""

from __future__ import annotations

import treetune_recipe.cpo.cpo_advantage_wrappers  # noqa: F401  (registers the 18, then imports the peers)
from treetune_recipe.cpo.methods import METHODS, Method, registered_method


def get_method(name: str) -> Method:
    """The method selected by ``cpo.wrap_method=<name>``; ValueError listing the valid names otherwise."""
    return registered_method(name)


def all_methods() -> dict[str, Method]:
    """Every method, by name (the 18 CPO wrappers first, then the peers)."""
    return METHODS
