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
"""Patches of torch and verl for a process without accelerator (applied by :func:`verl_cpu.activation.activate`).

Each function is idempotent and changes one thing in this process.
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
    if getattr(original, "_verl_cpu_gloo", False):
        return

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = gloo_backend_for(kwargs["backend"])
        elif args and isinstance(args[0], str):
            args = (gloo_backend_for(args[0]), *args[1:])
        return original(*args, **kwargs)

    init_process_group._verl_cpu_gloo = True
    dist.init_process_group = init_process_group


def make_pin_memory_a_no_op() -> None:
    """Make ``Tensor.pin_memory`` return the tensor itself (pinning needs an accelerator).

    Fixes: FSDP2 ref/rollout roles get ``CPUOffloadPolicy(pin_memory=True)``, and torch's ``_fsdp_param`` then calls
    ``.pin_memory()``, which raises "Cannot access accelerator device when none is available".
    """
    # SYNC WARNING: verl/workers/engine/fsdp/transformer_impl.py:FSDPEngine._build_fsdp_module (CPUOffloadPolicy with
    # pin_memory=True; 0.9.1 l.462, 0.7.1 l.371)
    import torch

    if getattr(torch.Tensor.pin_memory, "_verl_cpu_noop", False):
        return

    def pin_memory(self, *args, **kwargs):
        return self

    pin_memory._verl_cpu_noop = True
    torch.Tensor.pin_memory = pin_memory


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


def add_cuda_style_functions_to_torch_cpu() -> None:
    """Add the ``torch.cuda``-style functions verl 0.7.1 calls on ``get_torch_device()``, which is ``torch.cpu`` there.

    Only missing attributes are added; nothing torch defines is replaced. (verl 0.9.1 asks its platform for the device
    module instead: ``PlatformCPU.device_module`` carries the same stand-ins without touching ``torch.cpu``.)
    """
    # SYNC WARNING: verl/utils/memory_utils.py:aggressive_empty_cache (0.7.1 l.46, torch.cpu.memory_reserved)
    # SYNC WARNING: verl/utils/device.py:get_torch_device (0.7.1: returns torch.cpu without an accelerator)
    import torch

    for name, function in cuda_style_stand_ins().items():
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, function)


class _GcWithoutCollect(ModuleType):
    """The ``gc`` module, except that ``collect()`` does nothing (every other attribute is the real one)."""

    def __init__(self):
        super().__init__("gc")

    def __getattr__(self, name: str):
        import gc

        return getattr(gc, name)

    @staticmethod
    def collect(generation: int = 2) -> int:
        return 0


#: Modules whose module-level ``gc`` is replaced, and the upstream callers of ``gc.collect()`` in them.
NO_FULL_GC_MODULES = (
    # SYNC WARNING: verl/workers/engine/fsdp/transformer_impl.py:FSDPEngine.to (0.7.1 l.673, gc.collect() when the
    # target is get_device_name(); on CPU that is true entering and leaving every train/eval context; 0.9.1: gone)
    "verl.workers.engine.fsdp.transformer_impl",
    # SYNC WARNING: verl/utils/memory_utils.py:aggressive_empty_cache (0.9.1 l.51, 0.7.1 l.50: gc.collect() up to
    # max_retries times; the CPU device module reports itself available, so it runs on every weight sync and SFT
    # validation)
    "verl.utils.memory_utils",
)


def skip_full_gc(module: ModuleType) -> None:
    """Make verl's explicit full collections no-ops in ``module``.

    Fixes: on CPU the FSDP engine calls ``gc.collect()`` entering *and* leaving each train/eval context, and
    ``aggressive_empty_cache`` collects on every weight sync; in a process holding a Ray worker and torch each full
    collection takes ~0.3-0.4 s, a third of a tiny RL step and most of a tiny SFT step. Their purpose is to return
    accelerator memory, which does not exist here; Python's automatic generational collection keeps running, and no
    computed number changes. Only the name ``gc`` inside these verl modules is rebound: ``gc.collect()`` elsewhere
    is untouched.
    """
    import gc

    if module.__dict__.get("gc") is not gc:  # already replaced, or a release whose module no longer collects
        return
    module.gc = _GcWithoutCollect()
