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
"""The checks of the agent docs (``CLAUDE.md``, ``AGENTS.md``, ``agent-docs/*.md``): every reference of a doc names
something that exists (:mod:`treetune_scripts.agent_docs.references`), every agent doc has front-matter, and the
indexes list every agent doc.

Part of the agent-docs checker (:mod:`treetune_scripts.agent_docs`; command line
``python -m treetune_scripts.check_agent_docs``).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from treetune_scripts.agent_docs.references import CHECKS, COMMAND_PREFIXES, Context, classify
from treetune_scripts.agent_docs.releases import REPO_ROOT, ReleaseFilesUnavailable


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
            problem = CHECKS["command"](span, context) if span.strip().startswith(COMMAND_PREFIXES) else None
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
