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
"""The agent-docs checker as a library: the agent docs name only things that exist, have front-matter and are indexed.

``releases`` finds the files of each supported verl release, ``references`` classifies one backtick span and checks
that what it names exists (the rules are its module docstring), ``checks`` checks whole docs and the indexes. The
command line is ``python -m treetune_scripts.check_agent_docs`` (also a pre-commit hook).

It is the one library under ``treetune_scripts/`` and holds no command line: it reads every layer (it composes the
CPO recipe's config and resolves names in every package), which the shared library may not import, and it is
repository tooling, not part of a recipe.
"""
