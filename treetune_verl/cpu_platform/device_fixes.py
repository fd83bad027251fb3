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
"""Process-level fixes that a CPU run of verl needs on every release, whatever the platform layer says.

Each function is idempotent and changes one thing in this process. The CPU platform (:mod:`.platform`) applies
them on verl 0.9.1 when it is created; on verl 0.7.1 (no platform layer) :mod:`treetune_verl.patches` applies them
when no accelerator is present.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType

_ACCELERATOR_BACKENDS = ("nccl", "hccl", "flagcx")


def gloo_backend_for(backend: str | None) -> str | None:
    """Map a process-group backend string that needs an accelerator to one that works on CPU.

    ``"cpu:gloo,cpu:nccl"`` (device "cpu" with an accelerator backend), ``"cpu:gloo,cpu:gloo"`` (torch rejects the
    duplicate device) and plain ``"nccl"`` all become ``"gloo"``. Anything else is returned unchanged.

    Args:
        backend: the ``backend`` argument given to ``torch.distributed.init_process_group``.
    """
    if not backend:
        return backend
    parts = [part.strip() for part in backend.split(",") if part.strip()]
    names = [part.split(":")[-1] for part in parts]
    devices = [part.split(":")[0] for part in parts if ":" in part]
    needs_accelerator = any(name in _ACCELERATOR_BACKENDS for name in names)
    duplicate_device = len(devices) != len(set(devices))
    return "gloo" if needs_accelerator or duplicate_device else backend


def use_gloo_process_groups() -> None:
    """Make ``torch.distributed.init_process_group`` use gloo where verl asks for an accelerator backend.

    Fixes: verl builds ``backend=f"cpu:gloo,{device}:{backend}"``, which is ``"cpu:gloo,cpu:nccl"`` on verl 0.7.1
    without an accelerator and ``"cpu:gloo,cpu:gloo"`` under the CPU platform; torch refuses both.
    """
    # SYNC WARNING: verl/utils/distributed.py:initialize_global_process_group_ray (0.9.1 l.89; 0.7.1 l.82)
    # SYNC WARNING: verl/utils/distributed.py:initialize_global_process_group (0.9.1 l.63)
    import torch.distributed as dist

    original = dist.init_process_group
    if getattr(original, "_treetune_gloo", False):
        return

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = gloo_backend_for(kwargs["backend"])
        elif args and isinstance(args[0], str):
            args = (gloo_backend_for(args[0]), *args[1:])
        return original(*args, **kwargs)

    init_process_group._treetune_gloo = True
    dist.init_process_group = init_process_group


def make_pin_memory_a_no_op() -> None:
    """Make ``Tensor.pin_memory`` return the tensor itself (pinning needs an accelerator).

    Fixes: FSDP2 ref/rollout roles get ``CPUOffloadPolicy(pin_memory=True)``, and torch's ``_fsdp_param`` then calls
    ``.pin_memory()``, which raises "Cannot access accelerator device when none is available".
    """
    # SYNC WARNING: verl/workers/engine/fsdp/transformer_impl.py:FSDPEngine._build_fsdp_module (CPUOffloadPolicy with
    # pin_memory=True; 0.9.1 l.462, 0.7.1 l.371)
    import torch

    if getattr(torch.Tensor.pin_memory, "_treetune_noop", False):
        return

    def pin_memory(self, *args, **kwargs):
        return self

    pin_memory._treetune_noop = True
    torch.Tensor.pin_memory = pin_memory


def register_fsdp_engines_for_cpu(transformer_impl: ModuleType) -> None:
    """Register verl's FSDP engines (the same classes as for cuda) for device ``cpu`` in ``EngineRegistry``.

    Args:
        transformer_impl: the imported ``verl.workers.engine.fsdp.transformer_impl`` module.
    """
    # SYNC WARNING: verl/workers/engine/fsdp/transformer_impl.py:FSDPEngineWithLMHead, FSDPEngineWithValueHead
    # (registered for devices cuda and npu only; 0.9.1 l.1143/1594, 0.7.1 l.850/1136)
    from verl.workers.engine.base import EngineRegistry

    for model_type, engine_cls in (
        ("language_model", transformer_impl.FSDPEngineWithLMHead),
        ("value_model", transformer_impl.FSDPEngineWithValueHead),
    ):
        for backend in ("fsdp", "fsdp2"):
            if "cpu" not in EngineRegistry._engines.get(model_type, {}).get(backend, {}):
                EngineRegistry.register(model_type=model_type, backend=backend, device="cpu")(engine_cls)


def _cpu_mem_get_info(*args, **kwargs) -> tuple[int, int]:
    import psutil

    memory = psutil.virtual_memory()
    return memory.available, memory.total


def _zero(*args, **kwargs) -> int:
    return 0


def _nothing(*args, **kwargs) -> None:
    return None


def cuda_style_stand_ins() -> dict[str, Callable]:
    """The ``torch.cuda``-style functions verl calls on its device module that ``torch.cpu`` lacks, for the CPU.

    Memory counters report 0 (there is no device memory), ``mem_get_info`` reports host memory, RNG state is the
    CPU generator's.
    """
    import torch

    return {
        "empty_cache": _nothing,
        "ipc_collect": _nothing,
        "reset_peak_memory_stats": _nothing,
        "set_per_process_memory_fraction": _nothing,
        "memory_allocated": _zero,
        "memory_reserved": _zero,
        "max_memory_allocated": _zero,
        "max_memory_reserved": _zero,
        "mem_get_info": _cpu_mem_get_info,
        "get_rng_state": lambda *args, **kwargs: torch.get_rng_state(),
        "set_rng_state": lambda state, *args, **kwargs: torch.set_rng_state(state),
        "manual_seed": lambda seed: torch.manual_seed(seed),
        "manual_seed_all": lambda seed: torch.manual_seed(seed),
        "get_device_name": lambda *args, **kwargs: "cpu",
    }
