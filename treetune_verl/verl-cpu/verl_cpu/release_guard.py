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
"""Which verl releases a patch was written for, and applying each patch once per process.

A patch replaces an upstream symbol at runtime; the code it replaces may move in any other release. So every patch
has a name, is applied at most once per process, refuses to apply (:class:`UnsupportedVerlError`) when the installed
verl is not one of the releases it was written against, and can be limited to some of them (a bug fixed upstream
later). :class:`ReleaseGuardedPatches` holds these rules for one set of patches; ``verl_cpu.activation`` has one, and
a project building on verl-cpu can create its own with its own releases and names.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from functools import cache
from types import ModuleType

from verl_cpu.import_hooks import run_after_import

#: The verl releases verl-cpu is written and tested against (the first is the one its README installs).
SUPPORTED_VERL_RELEASES: tuple[str, ...] = ("0.9.1", "0.7.1")


@cache
def installed_verl_version() -> str:
    """Version of the verl distribution installed in this interpreter."""
    from importlib.metadata import version

    return version("verl")


def verl_is(*releases: str) -> bool:
    """True when the installed verl is one of ``releases`` (e.g. ``verl_is("0.7.1")``)."""
    return installed_verl_version() in releases


class UnsupportedVerlError(RuntimeError):
    """The installed verl is not one of the releases a patch was written against."""


class ReleaseGuardedPatches:
    """A named set of patches, each applied at most once per process and only on the releases it was written for.

    Args:
        owner: who applies the patches (in messages), e.g. ``"verl-cpu"``.
        supported: the verl releases every patch of the set was checked against.
        only_on: patch name -> the releases that need it (a name not listed applies on every supported release).
        skip_env: environment variable holding comma-separated patch names to leave unapplied (to reproduce the
            upstream behaviour a patch works around; never set in normal runs).
        fix_hint: the sentence that tells a user what to do about an unsupported release.
    """

    def __init__(
        self,
        owner: str,
        supported: tuple[str, ...],
        only_on: Mapping[str, tuple[str, ...]],
        skip_env: str,
        fix_hint: str,
    ):
        self.owner = owner
        self.supported = supported
        self.only_on = dict(only_on)
        self.skip_env = skip_env
        self.fix_hint = fix_hint
        self._applied: set[str] = set()
        self._skipped: set[str] = set()
        self._lock = threading.RLock()

    def require_supported_verl(self, name: str) -> None:
        """Raise :class:`UnsupportedVerlError` naming patch ``name`` unless the installed verl is supported."""
        installed = installed_verl_version()
        if installed not in self.supported:
            releases = ", ".join(f"verl=={release}" for release in self.supported)
            raise UnsupportedVerlError(
                f"{self.owner} patch {name!r} was written for {releases}, but verl=={installed} is installed. "
                f"{self.fix_hint}"
            )

    def applies(self, name: str) -> bool:
        """True when patch ``name`` is needed by the installed (supported) release."""
        self.require_supported_verl(name)
        releases = self.only_on.get(name)
        return releases is None or installed_verl_version() in releases

    def skipped_by_env(self) -> frozenset[str]:
        """Patch names listed in the skip variable."""
        return frozenset(name.strip() for name in os.environ.get(self.skip_env, "").split(",") if name.strip())

    def apply(self, name: str, patch: Callable[[], None]) -> None:
        """Run ``patch`` unless patch ``name`` was applied (or skipped) already, is listed in the skip variable (a
        warning names it), or is not needed on the installed release."""
        with self._lock:
            if name in self._applied or name in self._skipped:
                return
            if name in self.skipped_by_env():
                print(f"[{self.owner}] WARNING: patch {name!r} skipped ({self.skip_env}); upstream behaviour is kept.")
                self._skipped.add(name)
                return
            if not self.applies(name):
                return
            patch()
            self._applied.add(name)

    def apply_on_import(self, name: str, module_name: str, patch: Callable[[ModuleType], None]) -> None:
        """Check the release now; apply ``patch(module)`` as :meth:`apply` does right after ``module_name`` is
        imported in this process, or at once if it already is."""
        self.require_supported_verl(name)
        run_after_import(module_name, lambda module: self.apply(name, lambda: patch(module)))

    def applied(self) -> frozenset[str]:
        """Names of the patches of this set applied in this process."""
        return frozenset(self._applied)
