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

The rules (what each kind of reference must name, how a verl release is cited) are the module docstrings of
:mod:`treetune_scripts.agent_docs.references` and :mod:`treetune_scripts.agent_docs.releases`; the checks themselves
are :mod:`treetune_scripts.agent_docs.checks`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from treetune_scripts.agent_docs.checks import all_docs, doc_problems, index_problems
from treetune_scripts.agent_docs.references import compose_context


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
