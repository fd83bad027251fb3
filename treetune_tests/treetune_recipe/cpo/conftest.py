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
"""Fixtures shared by the CPO recipe tests."""

import pytest

from treetune_verl.tiny_assets import CONTEXT_SENSITIVE, build_tiny_assets


@pytest.fixture
def verl_pad_helpers():
    """verl's pad/unpad helpers as every treetune Ray process has them (:mod:`treetune_verl.verl_runtime`):
    flash-attn's where it is installed, else verl's own pure-torch ones (process-wide, as in a run)."""
    import treetune_verl.verl_runtime  # noqa: F401  (applies the swap on import)


@pytest.fixture(scope="module")
def context_sensitive_assets_dir():
    """The context-sensitive tiny assets (``CONTEXT_SENSITIVE``: log-probs that move by nats with the context), for
    the end-to-end runs whose numbers are checked."""
    return build_tiny_assets(config=CONTEXT_SENSITIVE)
