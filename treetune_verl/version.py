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
"""The verl releases this overlay supports (single source of truth: ``VERL_VERSION``, one per line, default first)."""

from functools import cache
from importlib import resources

SUPPORTED_VERL_VERSIONS: tuple[str, ...] = tuple(
    line.strip()
    for line in resources.files("treetune_verl").joinpath("VERL_VERSION").read_text().splitlines()
    if line.strip() and not line.startswith("#")
)
#: The release ``make install`` sets up; the others are selected with ``make ... VERL=<release>``.
DEFAULT_VERL_VERSION: str = SUPPORTED_VERL_VERSIONS[0]


@cache
def installed_verl_version() -> str:
    """Version of the verl package importable in this interpreter."""
    from importlib.metadata import version

    return version("verl")


def verl_is(*releases: str) -> bool:
    """True when the installed verl is one of ``releases`` (e.g. ``verl_is("0.7.1")``)."""
    return installed_verl_version() in releases
