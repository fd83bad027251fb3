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
"""The agent docs (``CLAUDE.md``, ``AGENTS.md``, ``agent-docs/*.md``) name only things that exist, have front-matter
and are indexed. What "exists" means for each kind of name: the module docstring of ``doc_checker.py`` (this folder).
"""

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def agent_docs() -> list[Path]:
    return sorted((REPO_ROOT / "agent-docs").glob("*.md"))


ALL_DOCS = [REPO_ROOT / "CLAUDE.md", REPO_ROOT / "AGENTS.md", *agent_docs()]


@pytest.mark.parametrize("doc", ALL_DOCS, ids=lambda path: path.name)
def test_every_reference_in_the_doc_exists(doc, doc_checker, context):
    assert doc.is_file(), f"{doc} is missing"
    problems = doc_checker.check_doc_text(doc.read_text(), context, name=doc.relative_to(REPO_ROOT).as_posix())
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("doc", agent_docs(), ids=lambda path: path.name)
def test_agent_doc_has_front_matter(doc, doc_checker):
    assert doc_checker.front_matter_problems(doc.read_text(), doc.name) == []


def test_every_agent_doc_is_indexed_and_agents_md_points_to_claude_md():
    index, claude = (REPO_ROOT / "agent-docs" / "README.md").read_text(), (REPO_ROOT / "CLAUDE.md").read_text()
    expected = {"README.md", "development-guide.md", "verl-framework-guide.md", "ppo-trainer-lifecycle.md"}
    expected |= {"actor-rollout-ref-worker.md", "config-system.md", "running-code.md", "testing-guide.md"}
    expected |= {"cpo-recipe.md", "sync-warnings.md"}
    assert expected <= {doc.name for doc in agent_docs()}
    for doc in agent_docs():
        if doc.name != "README.md":
            assert f"{doc.name}`" in index, f"agent-docs/README.md does not index {doc.name}"
        assert f"agent-docs/{doc.name}" in claude, f"CLAUDE.md does not index {doc.name}"
    assert "CLAUDE.md" in (REPO_ROOT / "AGENTS.md").read_text()
    assert len(claude.splitlines()) <= 130, "CLAUDE.md should stay short (about 120 lines)"
