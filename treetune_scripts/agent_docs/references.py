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
"""One reference of an agent doc: what kind of name it is, and whether what it names exists.

Part of the agent-docs checker (:mod:`treetune_scripts.agent_docs`; command line
``python -m treetune_scripts.check_agent_docs``). A reference to verl is checked against the files of one release
(:mod:`treetune_scripts.agent_docs.releases`, "Citing a verl release"). Config keys are checked against the composed
recipe config (installed verl) and the default release's ``ppo_trainer`` (:func:`compose_context`).

Every inline backtick span outside fenced code blocks is classified by the first rule that matches:

1. **command** – starts with ``make``, ``python -m``, ``python3 -m``, ``.venv/bin/python -m`` or ``bash`` (after
   optional ``VAR=value`` prefixes): the make target must be a rule of the Makefile, the ``-m`` module must resolve
   (third-party: its top-level package; ``verl``: in the default release),
   the ``bash`` script must exist. Lines of fenced code blocks get the same command check (and nothing else).
2. **override** – ``[+|++]key=value`` without spaces whose key starts with a config root (or ``platform``): the key
   (``key=``), its parent (``+key=`` / ``++key=``) or the option file (``platform=cpu`` ->
   ``treetune_verl/verl-cpu/verl_cpu/config/platform/cpu.yaml``, verl-cpu's group) must exist.
3. **pkg** – ``pkg://a.b``: the module or package ``a.b`` must resolve (as in rule 8).
4. **metric** – ``a/b...`` whose first segment is a metric namespace (``actor``, ``cpo``, ``timing_s``...). Metrics
   this project logs (``cpo/...``, ``actor/cpo/...``, ``timing_s/cpo_...``, ``treetune/...``; one ``{a,b}`` brace
   group is expanded)
   must appear as a string literal in the project's code; verl's own metrics and patterns (``cpo/...``, ``cpo/*``) are
   skipped (verl builds many names dynamically).
5. **skipped snippet** – any other span with whitespace or one of ``<>*{}[]()$|"',=@``: code, placeholders, globs.
6. **verl path** – ``[<release>:]verl/...``: a file or folder of that release's verl package; an optional suffix
   ``:N``/``:N-M`` must be within the file, ``:Name`` or ``:Class.method`` must be defined in it (``ast``).
7. **repo path** – contains ``/`` or ends with a known file extension: relative to the repository root, same suffix
   rules. Paths created at run time (``outputs/``, ``.cache/``, ``.venv/``, ``checkpoints/``, absolute paths) and
   the run-time file names in ``RUNTIME_FILES`` are skipped. A bare file name must exist somewhere in the repository
   (or in the default release's verl).
8. **module** – dotted name rooted at ``treetune_verl``, ``treetune_recipe``, ``treetune_scripts``, ``verl_cpu``
   (the package of the ``verl-cpu`` distribution, ``treetune_verl/verl-cpu/verl_cpu``) or ``[<release>:]verl``
   (optionally ``module:attr``): resolved statically to a source file, the rest of the name must be defined in it.
9. **config key** – dotted name rooted at a top-level key of the composed config: must exist in the composed
   ``cpo_trainer`` config with ``platform=cpu`` or in the default release's ``ppo_trainer``.
10. anything else (identifiers, values, file extensions, environment variables, Hydra's own ``hydra.*`` keys) is
    skipped.

A name that exists only in a non-default release is therefore written with its release prefix, or without backticks.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from treetune_scripts.agent_docs.releases import REPO_ROOT, split_release, verl_release_dir
from treetune_verl.version import DEFAULT_VERL_VERSION

#: The distribution verl-cpu (package ``verl_cpu``), kept in a subfolder of the repository.
VERL_CPU_ROOT = REPO_ROOT / "treetune_verl" / "verl-cpu"
#: Folder that holds each top-level package of the repository.
MODULE_ROOTS = {
    "treetune_verl": REPO_ROOT,
    "treetune_recipe": REPO_ROOT,
    "treetune_scripts": REPO_ROOT,
    "verl_cpu": VERL_CPU_ROOT,
}
#: Folder (relative to the repository root) of the Hydra group ``platform`` (``platform=<name>`` -> ``<name>.yaml``):
#: verl-cpu's, reached through ``pkg://verl_cpu.config``.
PLATFORM_GROUP_DIR = Path("treetune_verl", "verl-cpu", "verl_cpu", "config", "platform")
METRIC_NAMESPACES = {
    "actor",
    "cpo",
    "critic",
    "timing_s",
    "timing_per_token_ms",
    "training",
    "perf",
    "response_length",
    "prompt_length",
    "rollout_corr",
    "global_seqlen",
    "val-core",
    "val-aux",
    "treetune",
}
OUR_METRIC_PREFIXES = ("cpo/", "actor/cpo/", "timing_s/cpo_", "treetune/")
RUNTIME_PREFIXES = ("outputs/", ".cache/", ".venv/", "checkpoints/", "/", "~")
RUNTIME_FILES = {
    "train.log",
    "metrics.jsonl",
    "learning_curve.png",
    "train.parquet",
    "val.parquet",
    "data.pt",
    "latest_checkpointed_iteration.txt",
    "build_info.json",
    "main_cpo.log",
}
FILE_EXTENSIONS = (".py", ".md", ".yaml", ".yml", ".sh", ".toml", ".json", ".jsonl", ".txt", ".cfg", ".parquet")
SNIPPET_CHARS = set("<>*{}[]()$|\"',=@")
COMMAND_PREFIXES = ("make ", "python -m ", "python3 -m ", ".venv/bin/python -m ", "bash ")
CODE_DIRS_FOR_METRICS = ("treetune_recipe", "treetune_verl")  # treetune_verl holds verl-cpu too
_ENV_PREFIX = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)+")
_OVERRIDE = re.compile(r"^(\+{0,2})([A-Za-z_][\w.]*)=(.*)$")
_SUFFIX = re.compile(r"^(?P<path>[^:]+)(?::(?P<suffix>[\w.\-]+))?$")
_LINE_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


@dataclass(frozen=True)
class Context:
    """What references are checked against."""

    repo_root: Path
    configs: tuple  # composed DictConfigs: (cpo_trainer + platform=cpu, the default release's ppo_trainer)

    def verl_dir(self, release: str | None = None) -> Path:
        """``verl`` package folder of ``release`` (None: the default release)."""
        return verl_release_dir(release or DEFAULT_VERL_VERSION)

    @functools.cached_property
    def config_roots(self) -> set[str]:
        return {str(key) for config in self.configs for key in config.keys()}

    @functools.cached_property
    def make_targets(self) -> set[str]:
        text = (self.repo_root / "Makefile").read_text()
        return set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", text, flags=re.MULTILINE))

    @functools.cached_property
    def our_code(self) -> str:
        files = [path for folder in CODE_DIRS_FOR_METRICS for path in (self.repo_root / folder).rglob("*.py")]
        return "\n".join(path.read_text() for path in files)


def classify(span: str, config_roots: set[str]) -> str:
    """Kind of a backtick span (see the module docstring): command, override, pkg, metric, snippet, verl_path, ..."""
    if _ENV_PREFIX.sub("", span).startswith(COMMAND_PREFIXES):
        return "command"
    match = _OVERRIDE.match(span)
    if match and not any(ch.isspace() for ch in span):
        root = match.group(2).split(".")[0]
        if root in config_roots or root == "platform":
            return "override"
    if span.startswith("pkg://") and not any(ch.isspace() for ch in span):
        return "pkg"
    if "/" in span and span.split("/")[0] in METRIC_NAMESPACES and not any(ch.isspace() for ch in span):
        return "metric"
    if re.fullmatch(r"\.\w+", span):
        return "other"  # a file extension
    release, rest = split_release(span)
    if release is not None and not any(ch.isspace() for ch in rest) and not SNIPPET_CHARS & set(rest):
        return "verl_path" if rest.startswith("verl/") else "module"
    if any(ch.isspace() for ch in span) or SNIPPET_CHARS & set(span):
        return "snippet"
    if span.startswith("verl/"):
        return "verl_path"
    if "/" in span or span.split(":")[0].endswith(FILE_EXTENSIONS) or span in {"Makefile"}:
        return "repo_path"
    root = span.split(".")[0].split(":")[0]
    if "." in span and (root in MODULE_ROOTS or root == "verl"):
        return "module"
    if "." in span and root in config_roots:
        return "config_key"
    return "other"


def _symbol_defined(source: str, dotted: str) -> bool:
    """``dotted`` (``Name`` or ``Class.method``) is defined or imported at module level of ``source``."""
    body = ast.parse(source).body
    parts = dotted.split(".")
    for index, part in enumerate(parts):
        found = None
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == part:
                found = node
            elif isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == part for target in node.targets
            ):
                found = node
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == part:
                found = node
            elif isinstance(node, ast.Import | ast.ImportFrom) and index == 0:
                if any((alias.asname or alias.name.split(".")[0]) == part for alias in node.names):
                    found = node
            if found is not None:
                break
        if found is None:
            return False
        body = getattr(found, "body", [])
    return True


def _check_file_ref(base: Path, ref: str) -> str | None:
    """Problem with ``path[:N[-M]|:symbol]`` relative to ``base``, or None."""
    match = _SUFFIX.match(ref)
    if match is None:
        return "unparseable path reference"
    path = base / match.group("path")
    if not path.exists():
        return f"{path} does not exist"
    suffix = match.group("suffix")
    if suffix is None:
        return None
    if path.is_dir():
        return f"{path} is a folder; a :{suffix} suffix needs a file"
    lines = path.read_text().splitlines()
    line_range = _LINE_RANGE.match(suffix)
    if line_range:
        last = int(line_range.group(2) or line_range.group(1))
        if not 1 <= int(line_range.group(1)) <= last <= len(lines):
            return f"line {suffix} is outside {path} ({len(lines)} lines)"
        return None
    if path.suffix == ".py":
        return None if _symbol_defined("\n".join(lines), suffix) else f"{suffix} is not defined in {path}"
    return None if suffix in "\n".join(lines) else f"{suffix} does not occur in {path}"


def _module_file(module: str, context: Context, release: str | None = None) -> tuple[Path | None, str]:
    """(source file of the longest importable prefix of ``module``, the rest of the dotted name).

    ``verl`` modules are looked up in ``release`` (None: the default release).
    """
    parts = module.split(".")
    base = context.verl_dir(release).parent if parts[0] == "verl" else MODULE_ROOTS.get(parts[0], context.repo_root)
    for end in range(len(parts), 0, -1):
        stem = base.joinpath(*parts[:end])
        for candidate in (stem.with_suffix(".py"), stem / "__init__.py"):
            if candidate.is_file():
                return candidate, ".".join(parts[end:])
        if stem.is_dir() and end == len(parts):
            return stem, ""
    return None, module


def _check_module(span: str, context: Context) -> str | None:
    release, span = split_release(span)
    module, _, attr = span.partition(":")
    path, rest = _module_file(module, context, release)
    if path is None or (attr and rest):
        return f"module {module} not found"
    symbol = ".".join(part for part in (rest, attr) if part)
    if not symbol:
        return None
    if path.is_dir() or not _symbol_defined(path.read_text(), symbol):
        return f"{symbol} is not defined in {path}"
    return None


def _config_has(key: str, context: Context) -> bool:
    for config in context.configs:
        node = config
        for part in key.split("."):
            if not hasattr(node, "keys") or part not in node:
                break
            node = node._get_node(part) if hasattr(node, "_get_node") else node[part]
        else:
            return True
    return False


def _check_override(span: str, context: Context) -> str | None:
    plus, key, value = _OVERRIDE.match(span).groups()
    if key == "platform":
        option = context.repo_root / PLATFORM_GROUP_DIR / f"{value}.yaml"
        return None if option.is_file() else f"config group option {option} does not exist"
    target = key.rpartition(".")[0] if plus else key
    if target and not _config_has(target, context):
        return f"config key {target} does not exist"
    return None


def _check_metric(span: str, context: Context) -> str | None:
    if not span.startswith(OUR_METRIC_PREFIXES) or "..." in span or "*" in span:
        return None
    braces = re.search(r"\{([^{}]*)\}", span)
    names = [span]
    if braces:
        names = [span[: braces.start()] + option + span[braces.end() :] for option in braces.group(1).split(",")]
    for name in names:
        literal = name.removeprefix("actor/").removeprefix("timing_s/")
        if f'"{literal}"' not in context.our_code:
            return f"metric {name} is not logged by the project's code ({literal!r} not found)"
    return None


def _check_command(command: str, context: Context) -> str | None:
    command = _ENV_PREFIX.sub("", command.strip())
    words = command.split()
    if command.startswith("make "):
        target = words[1]
        return None if target in context.make_targets else f"make target {target} is not in the Makefile"
    if command.startswith("bash "):
        return _check_file_ref(context.repo_root, words[1])
    if " -m " in command and not words[2].startswith("-"):
        module = words[2]
        if module.split(".")[0] not in (*MODULE_ROOTS, "verl"):
            return None if importlib.util.find_spec(module.split(".")[0]) else f"module {module} not found"
        path, rest = _module_file(module, context)
        return None if path is not None and not rest else f"module {module} not found"
    return None


def _check_repo_path(span: str, context: Context) -> str | None:
    path = span.split(":")[0]
    if path.startswith(RUNTIME_PREFIXES) or path in RUNTIME_FILES:
        return None
    if "/" not in path and path != "Makefile":
        found = any(context.repo_root.glob(f"treetune_*/**/{path}")) or (context.repo_root / path).exists()
        found = found or any(context.repo_root.glob(f"agent-docs/{path}")) or any(context.verl_dir().rglob(path))
        return None if found else f"no file named {path} in the repository or in verl"
    return _check_file_ref(context.repo_root, span)


def _check_verl_path(span: str, context: Context) -> str | None:
    release, ref = split_release(span)
    problem = _check_file_ref(context.verl_dir(release).parent, ref)
    return f"{problem} (verl {release or DEFAULT_VERL_VERSION})" if problem else None


CHECKS = {
    "command": _check_command,
    "override": _check_override,
    "metric": _check_metric,
    "verl_path": _check_verl_path,
    "repo_path": _check_repo_path,
    "module": _check_module,
    "pkg": lambda span, context: _check_module(span.removeprefix("pkg://").replace("/", "."), context),
    "config_key": lambda span, context: None if _config_has(span, context) else f"config key {span} does not exist",
}


def compose_context() -> Context:
    """What the real docs are checked against: the recipe config (``platform=cpu``), the default release's
    ``ppo_trainer``."""
    from hydra import compose, initialize_config_dir

    import treetune_recipe.cpo.config  # noqa: F401  (registers the cpo block's defaults, which the recipe config lists)

    with initialize_config_dir(config_dir=str(REPO_ROOT / "treetune_recipe" / "cpo" / "config"), version_base=None):
        cpo = compose(config_name="cpo_trainer", overrides=["platform=cpu"])
    default_verl_config = verl_release_dir(DEFAULT_VERL_VERSION) / "trainer" / "config"
    with initialize_config_dir(config_dir=str(default_verl_config), version_base=None):
        ppo = compose(config_name="ppo_trainer")
    return Context(repo_root=REPO_ROOT, configs=(cpo, ppo))
