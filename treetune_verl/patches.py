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
"""Every monkey-patch of the overlay, in one place (verl on CPU has its own: ``verl_cpu.patches``).

Upstream verl is never edited. Where neither config, a registry nor subclassing can reach, a patch here replaces
one upstream symbol at runtime. Each patch:

- says what it fixes and the upstream ``file:line`` it works around (``# SYNC WARNING:`` tags; line numbers refer to
  the release the patch applies to, installed from PyPI; both releases' where it applies to both and they differ);
- is guarded by :func:`guard` (a ``verl_cpu.release_guard.ReleaseGuardedPatches``, built on first use): it refuses
  to apply, with a clear error, when the installed verl is not one of
  :data:`treetune_verl.version.SUPPORTED_VERL_VERSIONS`, because the code it replaces may have moved; a patch
  that only some releases need is listed in :data:`ONLY_ON_RELEASES` and does nothing on the others;
  ``TREETUNE_SKIP_PATCHES=<name>,...`` leaves named patches out (tests only);
- is idempotent (applying it twice changes nothing).

Patches on verl modules are applied lazily (right after the module is imported), so importing this module never
imports heavy parts of verl, nor verl-cpu: the guard and the post-import hooks are verl-cpu's, which the Ray
processes of a run need on every device (the preflight reports a missing verl-cpu before Ray starts).
"""

from __future__ import annotations

import contextlib
import functools
import os
from types import ModuleType

from treetune_verl.fault_points import pause_point
from treetune_verl.version import SUPPORTED_VERL_VERSIONS

#: Patches that only some supported releases need (upstream fixed the bug, or has the seam). A patch not listed here
#: applies on every supported release.
ONLY_ON_RELEASES: dict[str, tuple[str, ...]] = {
    "keep_actor_on_device_after_weight_sync": ("0.7.1",),  # fixed upstream by PR #4777 (verl 0.8.0)
    "request_entropy_in_actor_updates": ("0.7.1",),  # verl >= 0.8 honours actor.calculate_entropy
}
#: Comma-separated patch names left unapplied in every process that sees this variable. Never set in normal runs.
SKIP_PATCHES_ENV = "TREETUNE_SKIP_PATCHES"


@functools.cache
def guard():
    """The overlay's set of release-guarded patches (one per process): each applied once, only on the releases that
    need it, and refused on a verl release the overlay does not support."""
    from verl_cpu.release_guard import ReleaseGuardedPatches

    return ReleaseGuardedPatches(
        "treetune",
        SUPPORTED_VERL_VERSIONS,
        ONLY_ON_RELEASES,
        SKIP_PATCHES_ENV,
        fix_hint="Install a supported release (make install, or make install VERL=<release>) or, when adding a "
        "release, re-check every '# SYNC WARNING:' location in treetune_verl/patches.py and list it in "
        "treetune_verl/VERL_VERSION.",
    )


def applied_patches() -> frozenset[str]:
    """Names of the overlay's patches applied in this process (for tests and debugging)."""
    return guard().applied()


# --------------------------------------------------------------------------------------------------------------------
# Engine workers (every device)
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


def apply_engine_worker_fixes() -> None:
    """Apply, once verl's engine modules are imported in this process, the fixes they need on every device: the
    overlay's own and verl-cpu's FSDP-engine fixes (``verl_cpu.activation.apply_engine_fixes``: right on any device)."""
    from verl_cpu.activation import apply_engine_fixes

    guard().apply_on_import(
        "keep_actor_on_device_after_weight_sync",
        "verl.workers.engine_workers",
        _patch_keep_actor_on_device_after_weight_sync,
    )
    apply_engine_fixes()


# --------------------------------------------------------------------------------------------------------------------
# Seams used by recipes
# --------------------------------------------------------------------------------------------------------------------


def use_trainer_class(trainer_cls: type, **init_kwargs) -> None:
    """Make upstream ``TaskRunner.run`` build ``trainer_cls`` instead of ``RayPPOTrainer``, in this process only, with
    ``init_kwargs`` added to the arguments ``run`` passes (the recipe's checked config).

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
    guard().require_supported_verl("use_trainer_class")
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from treetune_verl.verl_compat import trainer_module

    if not (isinstance(trainer_cls, type) and issubclass(trainer_cls, RayPPOTrainer)):
        raise TypeError(f"use_trainer_class needs a subclass of RayPPOTrainer, got {trainer_cls!r}.")
    trainer_module().RayPPOTrainer = functools.partial(trainer_cls, **init_kwargs) if init_kwargs else trainer_cls


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
    if not guard().applies("request_entropy_in_actor_updates"):
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


@contextlib.contextmanager
def _files_opened_for_writing_are_appended(module: ModuleType):
    """While inside, ``open(path, "wb", ...)`` called from ``module`` opens ``path`` with ``"ab"`` instead."""

    def open_appending(file, mode="r", *args, **kwargs):
        return open(file, "ab" if mode == "wb" else mode, *args, **kwargs)

    module.open = open_appending
    try:
        yield
    finally:
        del module.open


def append_file_logger() -> None:
    """Make verl's ``file`` logger append to its metrics file instead of truncating it, and sync each record to disk,
    in this process.

    Why a patch: ``FileLogger.__init__`` opens the file with ``"wb"``, so a resumed run erased every metric logged
    before the resume. ``Tracking`` looks the class up in its module when it is built, so the module global is
    replaced with a subclass whose ``__init__`` runs upstream's while ``open(..., "wb")`` in that module means
    ``"ab"``. Steps after the resume point are dropped from the file beforehand on the driver
    (``treetune_verl.run_folder.keep_metrics_up_to``), so no step is duplicated. Call it in the process that builds
    the trainer (the TaskRunner actor), before ``fit()``.
    """
    # SYNC WARNING: verl/utils/tracking.py:FileLogger.__init__ (0.9.1 l.541, 0.7.1 l.267: open(self.filepath, "wb"))
    # SYNC WARNING: verl/utils/tracking.py:Tracking.__init__ (0.9.1 l.185-186, 0.7.1 l.178-179, builds FileLogger by
    # module global)
    guard().require_supported_verl("append_file_logger")
    import verl.utils.tracking as tracking

    if getattr(tracking.FileLogger, "_treetune_append", False):
        return

    class AppendingFileLogger(tracking.FileLogger):
        _treetune_append = True

        def __init__(self, *args, **kwargs):
            with _files_opened_for_writing_are_appended(tracking):
                super().__init__(*args, **kwargs)

        def log(self, data, step):
            pause_point("metrics_record", step)
            super().log(data, step)
            os.fsync(self.fp.fileno())  # the step's record is durable before the run goes on

    tracking.FileLogger = AppendingFileLogger
