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
"""Command-line scripts, one per job, each run as ``python -m treetune_scripts.<name>``.

``run_demo`` (the CPU demo), ``make_tiny_assets`` (builds the tiny assets of :mod:`treetune_verl.tiny_assets` and
prints their folder), ``plot_metrics`` and ``credit_report`` (a run's curves and token-credit page), the ``bench_*``
benchmarks, ``check_license_header``, ``gpu_install`` (the GPU-node install and its resolver check) and
``run_upstream_cpu_tests`` (verl's own CPU tests with and without verl-cpu). Data preparation is in
:mod:`treetune_scripts.data`, the CPU experiments in :mod:`treetune_scripts.experiments`.

A script parses its arguments and calls a library; code that another script or a test needs lives in the library
(``treetune_verl``, e.g. :mod:`treetune_verl.metrics_plot`, :mod:`treetune_verl.data.records`) or, when it knows a
recipe, with the recipe (e.g. :mod:`treetune_recipe.cpo.experiments`, :mod:`treetune_recipe.cpo.reports.credit_report`).
The agent-docs checker reads every layer (it composes the recipe's config), so its library sits on top, in
:mod:`treetune_scripts.agent_docs`, which holds no command line.
"""
