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
"""Upstream verl is never edited: every installed file of the installed release matches its wheel's RECORD hash."""

import base64
import csv
import hashlib
from importlib.metadata import distribution

from treetune_verl.version import SUPPORTED_VERL_VERSIONS, installed_verl_version


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def test_installed_verl_is_a_supported_release():
    assert installed_verl_version() in SUPPORTED_VERL_VERSIONS


def test_every_installed_verl_file_matches_its_record_hash():
    dist = distribution("verl")
    record = dist.read_text("RECORD")
    assert record, "verl was installed without a RECORD file"
    checked, mismatched = 0, []
    for path, digest, _size in csv.reader(record.splitlines()):
        if not digest or not path.startswith("verl/"):
            continue
        located = dist.locate_file(path)
        if _record_hash(located.read_bytes()) != digest:
            mismatched.append(path)
        checked += 1
    assert checked > 300, f"only {checked} verl files listed in RECORD"
    assert mismatched == [], f"edited upstream files: {mismatched}"
