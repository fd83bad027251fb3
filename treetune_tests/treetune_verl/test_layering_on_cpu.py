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
"""Import direction of the library: code the recipes run at start-up never imports a script, the library never imports a
recipe, the overlay builds on verl-cpu and never the other way round (``verl_cpu`` is a distribution of its own), and
``treetune_verl.preflight`` imports nothing of the overlay (every entry point imports it before anything else)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VERL_CPU_PACKAGE = ROOT / "treetune_verl" / "verl-cpu" / "verl_cpu"


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


def test_the_library_never_imports_a_recipe():
    offenders = {
        str(path.relative_to(ROOT)): sorted(m for m in imported_modules(path) if m.startswith("treetune_recipe"))
        for path in (ROOT / "treetune_verl").rglob("*.py")
    }
    assert {path: mods for path, mods in offenders.items() if mods} == {}


def test_verl_cpu_imports_nothing_of_the_overlay():
    sources = sorted(VERL_CPU_PACKAGE.rglob("*.py"))
    assert VERL_CPU_PACKAGE / "patches" / "__init__.py" in sources  # the scan sees the whole package
    offenders = {
        str(path.relative_to(ROOT)): sorted(m for m in imported_modules(path) if m.split(".")[0].startswith("treetune"))
        for path in sources
    }
    assert {path: mods for path, mods in offenders.items() if mods} == {}


def test_verl_cpu_config_names_no_overlay_module():
    configs = sorted((VERL_CPU_PACKAGE / "config").rglob("*.yaml"))
    assert configs, "verl-cpu ships its Hydra profile"
    assert [str(path.relative_to(ROOT)) for path in configs if "treetune" in path.read_text()] == []


def test_preflight_imports_nothing_of_the_overlay():
    imported = imported_modules(ROOT / "treetune_verl" / "preflight.py")
    assert sorted(m for m in imported if m.startswith("treetune")) == []
    version_imports = imported_modules(ROOT / "treetune_verl" / "version.py")
    assert not [m for m in version_imports if m.startswith(("treetune_verl", "verl"))]  # a leaf: standard library


def test_every_package_init_says_what_it_holds():
    inits = [
        init
        for folder in ("treetune_verl", "treetune_recipe", "treetune_scripts")
        for init in (ROOT / folder).rglob("__init__.py")
    ]
    assert [str(init) for init in inits if not ast.get_docstring(ast.parse(init.read_text()))] == []
