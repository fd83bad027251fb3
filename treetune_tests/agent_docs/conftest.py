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
"""Fixtures of the agent-doc tests: the checker module ``doc_checker.py`` and what the real docs are checked against."""

import importlib.util
import sys
from pathlib import Path

import pytest


def _load_doc_checker():
    spec = importlib.util.spec_from_file_location("agent_doc_checker", Path(__file__).with_name("doc_checker.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # @dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


_DOC_CHECKER = _load_doc_checker()  # one instance: its cache of release folders serves every test of this folder


@pytest.fixture(scope="session")
def doc_checker():
    return _DOC_CHECKER


@pytest.fixture(scope="session")
def context(doc_checker):
    return doc_checker.compose_context()
