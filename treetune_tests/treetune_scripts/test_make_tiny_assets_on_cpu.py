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
"""The tiny-asset command line (``treetune_scripts/make_tiny_assets.py``) prints the folder the builder returns."""

from treetune_scripts.make_tiny_assets import main
from treetune_verl.tiny_assets import build_tiny_assets


def test_cli_prints_the_assets_folder(capsys):
    main([])  # the default cache, which the other CPU tests fill
    assert capsys.readouterr().out.strip() == str(build_tiny_assets())
