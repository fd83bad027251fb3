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
"""treetune-verl's shared library: what every recipe adds to an unmodified verl from PyPI.

Main entry points: ``patches`` (every monkey-patch of the overlay), ``verl_runtime`` (set-up imported by every Ray
process), ``preflight`` (config checks that fail before any worker starts), ``run_folder`` (one run per output
folder, resume that never silently restarts), ``rollout_health`` (stops a run whose rollout and trainer disagree on
the log-probs), ``version`` and ``verl_compat`` (the supported verl releases and the seams that moved between them),
``tiny_run`` (the tiny CPU run of the demo and the end-to-end tests), ``data`` (the RL parquet schema) and
``utils.reward_score`` (the rewards). ``constraints/`` pins each supported release's environment; verl on CPU is the
separate distribution ``verl-cpu``.
"""
