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
"""Every module under ``treetune_scripts`` imports: a script's broken import is otherwise only seen when it is run."""

import importlib
import pkgutil

import pytest

import treetune_scripts

MODULES = sorted(
    info.name for info in pkgutil.walk_packages(treetune_scripts.__path__, prefix=f"{treetune_scripts.__name__}.")
)


def test_the_scripts_are_found():
    assert {"treetune_scripts.bench_cpu_gc", "treetune_scripts.experiments.cpo_vs_grpo"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_script_module_imports(module):
    importlib.import_module(module)
