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
"""Check the agent docs (``CLAUDE.md``, ``AGENTS.md``, ``agent-docs/*.md``): they name only things that exist, every
agent doc has front-matter and is indexed. Prints one line per finding and exits 1 when there is any.

    python -m treetune_scripts.check_agent_docs            # every agent doc, and the indexes
    python -m treetune_scripts.check_agent_docs DOC.md ...  # only these docs (references and front-matter)

Run by the pre-commit hook ``agent-docs`` (``.pre-commit-config.yaml``) and by
``treetune_tests/agent_docs/test_agent_docs_on_cpu.py``; ``treetune_tests/agent_docs/test_doc_checker_on_cpu.py``
shows on a fake doc that it catches broken references.

**Citing a verl release.** The project supports several verl releases (``treetune_verl/VERL_VERSION``, default
first). A reference to verl is checked against the files of exactly one release, whatever release this interpreter
has installed:

- no prefix (``verl/trainer/main_ppo_v0.py:151``, ``verl.workers.utils.losses:ppo_loss``, ``pkg://verl...``,
  ``python -m verl...``): the **default release** (first line of ``VERL_VERSION``, today 0.9.1);
- a release prefix ``<release>:`` before a verl path or module (``0.7.1:verl/trainer/main_ppo.py:343``,
  ``0.7.1:verl.trainer.main_ppo:TaskRunner``): that release, which must be listed in ``VERL_VERSION``.

The files of a release are found, in this order: the installed verl when it is that release; the site-packages of
the release's own environment (``.venv`` for the default, ``.venv-verl<release>`` for another) when it holds
``verl-<release>.dist-info``; else the wheel, downloaded once with ``pip download --no-deps verl==<release>`` and
unpacked under ``.cache/verl_releases/<release>/`` (needs the package index; on a fresh CI clone the 0.9.1 tier
runs before ``.venv-verl0.7.1`` exists). Config keys are checked against the composed recipe config (installed verl)
and the default release's ``ppo_trainer``.

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

import argparse
import ast
import functools
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from treetune_verl.version import DEFAULT_VERL_VERSION, SUPPORTED_VERL_VERSIONS, installed_verl_version

REPO_ROOT = Path(__file__).resolve().parents[1]
INSTALLED_VERL_DIR = Path(importlib.util.find_spec("verl").origin).parent
RELEASES_CACHE = REPO_ROOT / ".cache" / "verl_releases"
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
_RELEASE_PREFIX = re.compile(r"^(?P<release>\d+(?:\.\d+)+):(?P<ref>verl[/.].*)$")


# ----------------------------------------------------------------------------------------------------------------------
# The files of each supported verl release
# ----------------------------------------------------------------------------------------------------------------------


class ReleaseFilesUnavailable(RuntimeError):
    """The files of a verl release cited by the docs could not be found or downloaded."""


def _site_packages_verl(venv: Path, release: str) -> Path | None:
    """``verl`` folder of ``venv`` when that environment has verl ``release`` installed."""
    for site_packages in sorted(venv.glob("lib/python*/site-packages")):
        if (site_packages / f"verl-{release}.dist-info").is_dir() and (site_packages / "verl").is_dir():
            return site_packages / "verl"
    return None


def _unpacked_wheel(release: str, cache: Path) -> Path:
    """``verl`` folder of the ``verl==release`` wheel, downloaded with pip and unpacked under ``cache`` once."""
    target = cache / release
    if (target / "verl" / "__init__.py").is_file():
        return target / "verl"
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:"]
        command += ["-d", tmp, f"verl=={release}"]
        result = subprocess.run(command, capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob(f"verl-{release}-*.whl"))
        if result.returncode != 0 or not wheels:
            raise ReleaseFilesUnavailable(
                f"The docs cite verl {release}, whose files are not installed here and could not be downloaded "
                f"({' '.join(command)} failed: {result.stderr.strip()[-500:]}). Install that release "
                f"(make install VERL={release}) or give pip access to the package index."
            )
        unpacked = Path(tmp) / "unpacked"
        with zipfile.ZipFile(wheels[0]) as wheel:
            wheel.extractall(unpacked, [name for name in wheel.namelist() if name.startswith("verl/")])
        if (target / "verl" / "__init__.py").is_file():  # another process unpacked it meanwhile
            return target / "verl"
        if target.exists():  # an incomplete earlier copy
            shutil.rmtree(target)
        os.replace(unpacked, target)
    return target / "verl"


_RELEASE_DIRS: dict[str, Path | ReleaseFilesUnavailable] = {}


def verl_release_dir(release: str) -> Path:
    """The ``verl`` package folder of a supported ``release`` (see the module docstring for the search order).

    The answer, or the failure, is kept for the session: a failed download is tried once, not once per citation.

    Raises:
        ReleaseFilesUnavailable: ``release`` is not supported, or its files are nowhere and the download failed.
    """
    if release not in _RELEASE_DIRS:
        try:
            if release not in SUPPORTED_VERL_VERSIONS:
                supported = ", ".join(SUPPORTED_VERL_VERSIONS)
                raise ReleaseFilesUnavailable(f"verl {release} is not a supported release ({supported})")
            if installed_verl_version() == release:
                _RELEASE_DIRS[release] = INSTALLED_VERL_DIR
            else:
                venv = REPO_ROOT / (".venv" if release == DEFAULT_VERL_VERSION else f".venv-verl{release}")
                _RELEASE_DIRS[release] = _site_packages_verl(venv, release) or _unpacked_wheel(release, RELEASES_CACHE)
        except ReleaseFilesUnavailable as error:
            _RELEASE_DIRS[release] = error
    found = _RELEASE_DIRS[release]
    if isinstance(found, ReleaseFilesUnavailable):
        raise found
    return found


def split_release(span: str) -> tuple[str | None, str]:
    """``("0.7.1", "verl/x.py:3")`` for ``0.7.1:verl/x.py:3``; ``(None, span)`` without a release prefix."""
    match = _RELEASE_PREFIX.match(span)
    return (match.group("release"), match.group("ref")) if match else (None, span)


# ----------------------------------------------------------------------------------------------------------------------
# The checker
# ----------------------------------------------------------------------------------------------------------------------


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


def iter_references(text: str):
    """(line number, span, is_fenced_line) for every inline span and every line of a fenced block."""
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            yield number, line, True
            continue
        for span in re.findall(r"`([^`]+)`", line):
            yield number, span.strip(), False


def check_doc_text(text: str, context: Context, name: str = "<doc>") -> list[str]:
    """Every problem of one document, as ``name:line: `span`: problem``."""
    problems = []
    for number, span, fenced in iter_references(text):
        if fenced:
            problem = _check_command(span, context) if span.strip().startswith(COMMAND_PREFIXES) else None
        else:
            kind = classify(span, context.config_roots)
            try:
                problem = CHECKS[kind](span, context) if kind in CHECKS else None
            except ReleaseFilesUnavailable as error:
                problem = str(error)
        if problem:
            problems.append(f"{name}:{number}: `{span}`: {problem}")
    return problems


def front_matter_problems(text: str, name: str) -> list[str]:
    """An agent doc starts with ``---``, YAML with a one-line ``summary`` and a non-empty ``read_when`` list, ``---``.

    Returns:
        One message per problem (empty when the front-matter is complete).
    """
    match = re.match(r"^---\n(.*?)\n---\n", text, flags=re.DOTALL)
    if match is None:
        return [f"{name}: no front-matter (--- summary/read_when --- at the top)"]
    meta = yaml.safe_load(match.group(1)) or {}
    problems = []
    if not isinstance(meta.get("summary"), str) or not meta["summary"].strip() or "\n" in meta["summary"].strip():
        problems.append(f"{name}: front-matter needs a one-line summary")
    read_when = meta.get("read_when")
    if not isinstance(read_when, list) or not read_when or not all(isinstance(x, str) and x for x in read_when):
        problems.append(f"{name}: front-matter needs a non-empty read_when list of strings")
    return problems


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


# ----------------------------------------------------------------------------------------------------------------------
# The indexes and the command line
# ----------------------------------------------------------------------------------------------------------------------

#: Agent docs that must exist (``agent-docs/<name>``).
REQUIRED_AGENT_DOCS = (
    "README.md",
    "development-guide.md",
    "verl-framework-guide.md",
    "ppo-trainer-lifecycle.md",
    "actor-rollout-ref-worker.md",
    "config-system.md",
    "running-code.md",
    "testing-guide.md",
    "cpo-recipe.md",
    "sync-warnings.md",
)
#: ``CLAUDE.md`` stays short: it is read at the start of every session.
MAX_CLAUDE_MD_LINES = 130


def agent_docs(repo_root: Path = REPO_ROOT) -> list[Path]:
    """``agent-docs/*.md``, sorted."""
    return sorted((repo_root / "agent-docs").glob("*.md"))


def all_docs(repo_root: Path = REPO_ROOT) -> list[Path]:
    """Every doc the checker reads: ``CLAUDE.md``, ``AGENTS.md`` and the agent docs."""
    return [repo_root / "CLAUDE.md", repo_root / "AGENTS.md", *agent_docs(repo_root)]


def index_problems(repo_root: Path = REPO_ROOT) -> list[str]:
    """The required agent docs exist, ``agent-docs/README.md`` and ``CLAUDE.md`` index every agent doc, ``AGENTS.md``
    points to ``CLAUDE.md``, and ``CLAUDE.md`` stays short."""
    folder = repo_root / "agent-docs"
    problems = [f"agent-docs/{name} is missing" for name in REQUIRED_AGENT_DOCS if not (folder / name).is_file()]
    index = (folder / "README.md").read_text() if (folder / "README.md").is_file() else ""
    claude = (repo_root / "CLAUDE.md").read_text()
    for doc in agent_docs(repo_root):
        if doc.name != "README.md" and f"{doc.name}`" not in index:
            problems.append(f"agent-docs/README.md does not index {doc.name}")
        if f"agent-docs/{doc.name}" not in claude:
            problems.append(f"CLAUDE.md does not index {doc.name}")
    if "CLAUDE.md" not in (repo_root / "AGENTS.md").read_text():
        problems.append("AGENTS.md does not point to CLAUDE.md")
    if len(claude.splitlines()) > MAX_CLAUDE_MD_LINES:
        problems.append(f"CLAUDE.md has {len(claude.splitlines())} lines; keep it under {MAX_CLAUDE_MD_LINES}")
    return problems


def doc_problems(doc: Path, context: Context) -> list[str]:
    """Broken references of one doc, and its missing front-matter when it is an agent doc."""
    if not doc.is_file():
        return [f"{doc} is missing"]
    path = doc.resolve()
    name = path.relative_to(REPO_ROOT).as_posix() if path.is_relative_to(REPO_ROOT) else str(doc)
    text = path.read_text()
    problems = check_doc_text(text, context, name=name)
    if path.parent == REPO_ROOT / "agent-docs":
        problems += front_matter_problems(text, name)
    return problems


def main(argv: list[str] | None = None) -> int:
    """Check the given docs (default: every doc and the indexes); print the findings. Returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("docs", nargs="*", type=Path, help="docs to check (default: every agent doc and the indexes)")
    args = parser.parse_args(argv)
    context = compose_context()
    problems = [] if args.docs else index_problems()
    for doc in args.docs or all_docs():
        problems += doc_problems(doc, context)
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
