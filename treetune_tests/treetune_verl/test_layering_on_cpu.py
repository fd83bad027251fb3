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
"""Import direction of the library: code the recipes run at start-up never imports a script, and
``treetune_verl.preflight`` never imports ``treetune_verl.patches`` (patches import preflight, one way only)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    return modules


@pytest.mark.parametrize("folder", ["treetune_verl", "treetune_recipe"])
def test_library_and_recipes_never_import_scripts(folder):
    offenders = {
        str(path.relative_to(ROOT)): sorted(m for m in imported_modules(path) if m.startswith("treetune_scripts"))
        for path in (ROOT / folder).rglob("*.py")
    }
    assert {path: mods for path, mods in offenders.items() if mods} == {}


def test_preflight_imports_nothing_of_the_project_but_the_version_leaf():
    imported = imported_modules(ROOT / "treetune_verl" / "preflight.py")
    assert sorted(m for m in imported if m.startswith("treetune_verl")) == ["treetune_verl.version"]
    version_imports = imported_modules(ROOT / "treetune_verl" / "version.py")
    assert not [m for m in version_imports if m.startswith(("treetune_verl", "verl"))]  # a leaf: standard library


def test_every_package_init_says_what_it_holds():
    inits = [
        init
        for folder in ("treetune_verl", "treetune_recipe", "treetune_scripts")
        for init in (ROOT / folder).rglob("__init__.py")
    ]
    assert [str(init) for init in inits if not ast.get_docstring(ast.parse(init.read_text()))] == []
