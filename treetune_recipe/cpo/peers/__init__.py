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
"""The published privileged-context peers of CPO, one module per method family, each registering its methods on import:
RLSD (``rlsd``), OPSD (``opsd``, its JSD; ``opsd_token``, its sampled-token form) and SDPO (``sdpo``). A module
declares its methods whole (:class:`treetune_recipe.cpo.methods.Method`): formula or loss, teacher, context, knobs,
the authors' run settings and schedule. Adding a peer is one module here, its tests and its page in
``agent-docs/methods/``.
"""

# Registration order = the registry's order of the peers.
from treetune_recipe.cpo.peers import rlsd  # noqa: F401, I001
from treetune_recipe.cpo.peers import opsd  # noqa: F401, I001
from treetune_recipe.cpo.peers import sdpo  # noqa: F401, I001
