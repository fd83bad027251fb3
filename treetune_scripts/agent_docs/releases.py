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
"""The files of each supported verl release, against which the agent docs' verl references are checked.

Part of the agent-docs checker (:mod:`treetune_scripts.agent_docs`; command line
``python -m treetune_scripts.check_agent_docs``).

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
runs before ``.venv-verl0.7.1`` exists).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from treetune_verl.version import DEFAULT_VERL_VERSION, SUPPORTED_VERL_VERSIONS, installed_verl_version

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALLED_VERL_DIR = Path(importlib.util.find_spec("verl").origin).parent
RELEASES_CACHE = REPO_ROOT / ".cache" / "verl_releases"
_RELEASE_PREFIX = re.compile(r"^(?P<release>\d+(?:\.\d+)+):(?P<ref>verl[/.].*)$")


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
