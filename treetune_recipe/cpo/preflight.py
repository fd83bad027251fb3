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
"""Start-up checks of a CPO run, on the driver, before Ray starts: each error says which override fixes it."""

from __future__ import annotations

from treetune_recipe.cpo.config import CPOConfig
from treetune_recipe.cpo.cpo_credit_dump import CreditDumpConfig
from treetune_recipe.cpo.cpo_hint import HintConfig

CPO_ESTIMATOR = "cpo"


def cpo_is_enabled(config) -> bool:
    """CPO shaping runs only when the config asks for the ``cpo`` advantage estimator (opt-in)."""
    return config.algorithm.adv_estimator == CPO_ESTIMATOR


def check_cpo_config(config) -> None:
    """Reject configurations the CPO path cannot run with (no I/O)."""
    if not cpo_is_enabled(config):
        return
    if config.get("cpo") is None:
        raise ValueError("algorithm.adv_estimator=cpo needs the top-level `cpo:` block (use config cpo_trainer).")
    worker_impl = config.trainer.get("use_legacy_worker_impl", "auto")
    if worker_impl != "disable":
        raise ValueError(
            f"CPO runs on verl's engine workers; got trainer.use_legacy_worker_impl={worker_impl}. "
            "Set trainer.use_legacy_worker_impl=disable."
        )
    if not config.actor_rollout_ref.actor.get("calculate_entropy", False):
        raise ValueError(
            "CPO advantage wrappers read the current-policy token entropy; "
            "set actor_rollout_ref.actor.calculate_entropy=true."
        )
    cpo_config = CPOConfig.from_config(config.cpo)  # validates every cpo.* key
    HintConfig.from_config(cpo_config.hint)
    CreditDumpConfig.from_config(cpo_config.credit_dump)


def check_cpo_run(config) -> None:
    """``check_cpo_config`` plus the data files' schema (verl's RL parquet layout, every bad row listed).

    With CPO on, every training row must also carry the gold solution the hint prompt is built from (unless
    ``cpo.hint.on_missing=skip``, or the solution is read from another ``extra_info`` key, checked at build time).
    """
    from treetune_scripts.data.validate_rl_parquet import check_rl_files

    check_cpo_config(config)
    require_solution = False
    if cpo_is_enabled(config):
        hint = HintConfig.from_config(config.cpo.get("hint"))
        require_solution = hint.on_missing == "error" and hint.solution_key == "solution"
    check_rl_files(config.data.train_files, require_solution=require_solution, what="data.train_files")
    check_rl_files(config.data.val_files, require_solution=False, what="data.val_files")
