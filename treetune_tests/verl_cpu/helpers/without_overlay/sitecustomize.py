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
"""Put on ``PYTHONPATH``, this folder makes the overlay unimportable: no module named ``treetune_*`` can be imported.

Python imports ``sitecustomize`` at start-up in every process that sees it (pytest and the subprocesses its tests
start), and this one puts a finder first on ``sys.meta_path`` that refuses the overlay's packages, as if only verl-cpu
and its dependencies were installed.
"""

import importlib.abc
import sys

OVERLAY_PACKAGES = ("treetune_verl", "treetune_recipe", "treetune_scripts", "treetune_tests")


class _RefuseOverlay(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in OVERLAY_PACKAGES:
            raise ModuleNotFoundError(f"No module named {fullname!r} (the overlay is hidden)", name=fullname)
        return None


sys.meta_path.insert(0, _RefuseOverlay())
