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
"""Put on ``PYTHONPATH``, this folder makes verl-cpu unimportable, as on a GPU node where it is not installed.

Python imports ``sitecustomize`` at start-up in every process that sees it, and this one puts a finder first on
``sys.meta_path`` that refuses the ``verl_cpu`` package. The mirror of ``treetune_tests/verl_cpu/helpers/
without_overlay``, which hides the overlay from verl-cpu.
"""

import importlib.abc
import sys


class _RefuseVerlCpu(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] == "verl_cpu":
            raise ModuleNotFoundError(f"No module named {fullname!r} (verl-cpu is hidden)", name="verl_cpu")
        return None


sys.meta_path.insert(0, _RefuseVerlCpu())
