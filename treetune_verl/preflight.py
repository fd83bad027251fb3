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
"""Configuration checks that turn bad input into one clear error before verl starts any worker.

Without them, a missing file or a batch that does not split into micro-batches shows up as a traceback deep inside a
Ray worker. Every problem found is reported at once, each with the override that fixes it. On a host without
accelerator the CPU checks of ``verl_cpu.preflight`` (settings, rollout engine, platform) are added; on every host,
its comparison of verl's Ray resource needs with ``ray_kwargs.ray_init`` (a shortfall means an endless wait).

verl-cpu is imported only when those checks run, so this module, and every entry point that imports it first, loads
on a machine without verl-cpu. There the checks report its absence as one problem, before Ray starts: a CPU run needs
its platform, and a run on an accelerator needs its device-independent FSDP-engine fixes, which the overlay's Ray
workers apply on every device (:func:`treetune_verl.patches.apply_engine_worker_fixes`).

Entry points of this project (``treetune_scripts/run_demo.py``, recipe mains) call :func:`check_run_config` on the
composed config before ``ray.init``. Runs of upstream ``python -m verl.trainer.main_ppo`` on CPU get verl-cpu's own
checks inside upstream ``validate_config``.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

__all__ = ["PreflightError", "accelerator_available", "check_run_config", "collect_problems"]

_REMOTE_PREFIXES = ("hdfs://", "s3://", "gs://", "http://", "https://")
#: The install command that brings verl-cpu, named by the problem its absence raises.
VERL_CPU_INSTALL = "make install (CPU) or make install-gpu, which install it; or pip install -e treetune_verl/verl-cpu"


class PreflightError(ValueError):
    """A run configuration that cannot start here: the message lists every problem and the override that fixes it.

    Every start-up check of the overlay and its recipes raises it (verl-cpu's own checks, for upstream entry points,
    raise ``verl_cpu.preflight.PreflightError``; both are ``ValueError``)."""


def accelerator_available() -> bool:
    """True when torch sees a CUDA or Ascend NPU device."""
    import torch

    npu = getattr(torch, "npu", None)
    return torch.cuda.is_available() or bool(npu is not None and npu.is_available())


def _get(config: Any, dotted: str, default: Any = None) -> Any:
    """``config.a.b.c`` of a DictConfig or nested mapping; ``default`` when a part is missing or None."""
    node = config
    for key in dotted.split("."):
        node = node.get(key) if node is not None and hasattr(node, "get") else None
    return default if node is None else node


def _as_list(value: Any) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


def _is_local(path: str) -> bool:
    return not path.startswith(_REMOTE_PREFIXES)


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


# ---------------------------------------------------------------------------------------------------------------- files


def _check_files(config: Any) -> list[str]:
    problems = []
    model_path = _get(config, "actor_rollout_ref.model.path")
    if not model_path:
        problems.append("actor_rollout_ref.model.path is not set; pass actor_rollout_ref.model.path=<model dir>.")
    elif _is_local(model_path):
        looks_local = model_path.startswith(("/", ".", "~")) or os.path.exists(model_path)
        expanded = os.path.expanduser(model_path)
        if looks_local and not os.path.isdir(expanded):
            problems.append(
                f"actor_rollout_ref.model.path={model_path} does not exist; point it to a Hugging Face model "
                "directory (config.json, weights and tokenizer)."
            )
        elif looks_local and not os.path.isfile(os.path.join(expanded, "config.json")):
            problems.append(
                f"actor_rollout_ref.model.path={model_path} has no config.json; it must be a Hugging Face model "
                "directory (save_pretrained output)."
            )
    for key in ("data.train_files", "data.val_files"):
        files = _as_list(_get(config, key))
        if not files:
            problems.append(f"{key} is empty; pass {key}=<path to a parquet file in verl's RL format>.")
        for path in files:
            if _is_local(path) and not os.path.isfile(os.path.expanduser(path)):
                problems.append(f"{key}: {path} does not exist; build or download the dataset first.")
    for key in ("reward.custom_reward_function.path", "custom_reward_function.path"):
        path = _get(config, key)
        if not path:
            continue
        if path.startswith("pkg://"):
            module = path[len("pkg://") :].replace("/", ".")
            if not _importable(module):
                problems.append(f"{key}={path}: module {module} is not importable.")
        elif not os.path.isfile(path[len("file://") :] if path.startswith("file://") else path):
            problems.append(f"{key}={path} does not exist.")
    return problems


# -------------------------------------------------------------------------------------------------------- batch shapes

#: Advantage estimators that compare the n responses of one prompt with each other: with n = 1 every group has one
#: response, its advantage is 0 (or the raw score) and the update is meaningless.
GROUP_ESTIMATORS = ("grpo", "grpo_passk", "grpo_vectorized", "rloo", "rloo_vectorized", "opo", "cpo")


def _check_group_sampling(config: Any) -> list[str]:
    estimator = _get(config, "algorithm.adv_estimator")
    n = _get(config, "actor_rollout_ref.rollout.n", 1)
    if estimator in GROUP_ESTIMATORS and not (isinstance(n, int) and n >= 2):
        return [
            f"actor_rollout_ref.rollout.n={n} with algorithm.adv_estimator={estimator}: the estimator compares the "
            "responses of one prompt, so each prompt needs at least 2; set actor_rollout_ref.rollout.n=2 or more."
        ]
    return []


def _check_prompt_subsets(config: Any) -> list[str]:
    """A random prompt subset must be the same at every start, or a resumed run trains on other prompts."""
    # SYNC WARNING: verl/utils/dataset/rl_dataset.py:RLHFDataset._read_files_and_tokenize (max_samples with
    # data.shuffle: numpy's default_rng(data.seed), fresh entropy when the seed is None)
    if not _get(config, "data.shuffle", True) or _get(config, "data.seed") is not None:
        return []
    problems = []
    for split, what in (("train", "train on"), ("val", "validate on")):
        count = _get(config, f"data.{split}_max_samples")
        if isinstance(count, int) and count > 0:
            problems.append(
                f"data.{split}_max_samples={count} with data.seed unset: verl draws the {count} prompts at random anew "
                f"at every start, so a resumed run would {what} other prompts than the run it resumes; set "
                "data.seed=<int>."
            )
    return problems


def _check_batch_sizes(config: Any) -> list[str]:
    """Rows each worker gets must split into whole micro-batches (verl asserts it only inside the workers)."""
    # SYNC WARNING: verl/workers/engine/utils.py:prepare_micro_batches (0.9.1 l.123-127, 0.7.1 l.90-94, size %
    # micro_batch_size_per_gpu)
    # SYNC WARNING: verl/trainer/ppo/ray_trainer.py:RayPPOTrainer._update_actor (0.9.1 l.1352-1363, 0.7.1
    # l.1174-1183, mini-batch x rollout.n)
    n = _get(config, "actor_rollout_ref.rollout.n", 1)
    train_batch_size = _get(config, "data.train_batch_size")
    if not (isinstance(n, int) and n >= 1 and isinstance(train_batch_size, int)):
        return []
    processes = int(_get(config, "trainer.n_gpus_per_node", 1)) * int(_get(config, "trainer.nnodes", 1))
    dp = max(1, processes // int(_get(config, "actor_rollout_ref.actor.ulysses_sequence_parallel_size", 1)))
    rows = train_batch_size * n
    mini_batch = _get(config, "actor_rollout_ref.actor.ppo_mini_batch_size")
    splits = [("data.train_batch_size", "actor_rollout_ref.rollout.log_prob", rows)]
    if _get(config, "actor_rollout_ref.actor.use_kl_loss", False) or _get(config, "algorithm.use_kl_in_reward", False):
        splits.append(("data.train_batch_size", "actor_rollout_ref.ref.log_prob", rows))
    if isinstance(mini_batch, int):
        splits.append(("actor_rollout_ref.actor.ppo_mini_batch_size", "actor_rollout_ref.actor.ppo", mini_batch * n))
    problems = []
    for size_key, micro_prefix, size in splits:
        dynamic_key = (
            "actor_rollout_ref.actor.use_dynamic_bsz"
            if micro_prefix.endswith(".ppo")
            else (micro_prefix.rsplit(".", 1)[0] + ".log_prob_use_dynamic_bsz")
        )
        micro_key = micro_prefix + "_micro_batch_size_per_gpu"
        micro = _get(config, micro_key)
        if _get(config, dynamic_key, False) or not isinstance(micro, int) or micro <= 0:
            continue
        if size % dp or (size // dp) % micro:
            problems.append(
                f"{size_key} x actor_rollout_ref.rollout.n = {size // n} x {n} = {size} rows over {dp} worker(s) "
                f"do not split into micro-batches of {micro_key}={micro}; verl would stop with 'data size must be "
                f"divisible by ... micro_batch_size_per_gpu' after the first rollout. Choose sizes with "
                f"({size_key} x rollout.n / {dp}) % {micro_key} == 0, e.g. {micro_key}="
                f"{_largest_divisor(size // dp if size % dp == 0 else 1, micro)}, or set {dynamic_key}=true."
            )
    return problems


def _largest_divisor(value: int, at_most: int) -> int:
    return max(d for d in range(1, max(1, min(value, at_most)) + 1) if value % d == 0)


# ------------------------------------------------------------------------------------------------------------ entry


def collect_problems(config: Any, *, accelerator: bool | None = None, check_resources: bool = True) -> list[str]:
    """All problems :func:`check_run_config` would report, as a list of messages.

    Args:
        config: the composed run config (DictConfig or nested mapping).
        accelerator: whether an accelerator is present (default: detect).
        check_resources: also compare verl's resource needs with ``ray_kwargs.ray_init``.
    """
    if accelerator is None:
        accelerator = accelerator_available()
    problems = (
        _check_files(config)
        + _check_group_sampling(config)
        + _check_prompt_subsets(config)
        + _check_batch_sizes(config)
    )
    try:
        from verl_cpu import preflight as verl_cpu_preflight
    except ModuleNotFoundError as error:
        if error.name != "verl_cpu":
            raise
        needed_for = (
            "the CPU platform (this host has no accelerator)"
            if not accelerator
            else ("its FSDP-engine fixes, which the overlay's Ray workers apply on every device")
        )
        return [*problems, f"verl-cpu is not installed; this run needs {needed_for}. Install it: {VERL_CPU_INSTALL}."]
    if not accelerator:
        problems += verl_cpu_preflight.cpu_problems(config)
    if check_resources:
        problems += verl_cpu_preflight.configured_resource_problems(config)
    return problems


def check_run_config(config: Any, *, accelerator: bool | None = None, check_resources: bool = True) -> None:
    """Raise one :class:`PreflightError` listing every problem of ``config``; return silently if there is none.

    Args:
        config: the composed run config (DictConfig or nested mapping).
        accelerator: whether an accelerator is present (default: detect).
        check_resources: also compare verl's resource needs with ``ray_kwargs.ray_init`` (skip it when Ray is
            already running).
    """
    problems = collect_problems(config, accelerator=accelerator, check_resources=check_resources)
    if problems:
        lines = "\n".join(f"  - {problem}" for problem in problems)
        raise PreflightError(f"treetune preflight found {len(problems)} problem(s) in the run configuration:\n{lines}")
