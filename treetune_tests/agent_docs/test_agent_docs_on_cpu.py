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
"""The agent docs (``CLAUDE.md``, ``AGENTS.md``, ``agent-docs/*.md``) pass their checker
(``python -m treetune_scripts.check_agent_docs``, also a pre-commit hook): they name only things that exist, have
front-matter and are indexed. What "exists" means for each kind of name: the module docstring of
``treetune_scripts/agent_docs/references.py``.
"""

from treetune_scripts import check_agent_docs


def test_the_agent_docs_pass_their_checker(capsys):
    status = check_agent_docs.main([])
    assert status == 0, capsys.readouterr().out
