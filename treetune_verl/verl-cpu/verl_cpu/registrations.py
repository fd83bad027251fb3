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
"""Entries verl-cpu adds to verl's registries once active (:func:`verl_cpu.activation.activate`): nothing that exists
changes; each entry is looked up only by its name (device ``cpu``, rollout ``hf``).

Each entry is added right after the registry's module is imported, so activating stays light (it runs inside
``import verl``).
"""

from __future__ import annotations

from types import ModuleType

from verl_cpu.import_hooks import run_after_import

FSDP_ENGINE_MODULE = "verl.workers.engine.fsdp.transformer_impl"
#: ``actor_rollout_ref.rollout.name`` of the HF-transformers rollout.
HF_ROLLOUT_NAME = "hf"
_HF_ADAPTER_PATH = "verl_cpu.hf_server.HFServerAdapter"


def _register_fsdp_engines(transformer_impl: ModuleType) -> None:
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


def register_fsdp_engines_for_cpu() -> None:
    """Register verl's FSDP engines (the classes it registers for cuda) for device ``cpu`` in ``EngineRegistry``."""
    run_after_import(FSDP_ENGINE_MODULE, _register_fsdp_engines)


def _load_hf_replica():
    from verl_cpu.hf_server import HFReplica

    return HFReplica


def _register_rollout_class(module: ModuleType) -> None:
    # SYNC WARNING: verl/workers/rollout/base.py:_ROLLOUT_REGISTRY (0.9.1 l.89-93, 0.7.1 l.83-87, {(name, mode):
    # "module.Class"})
    module._ROLLOUT_REGISTRY[(HF_ROLLOUT_NAME, "async")] = _HF_ADAPTER_PATH


def _register_replica(module: ModuleType) -> None:
    module.RolloutReplicaRegistry.register(HF_ROLLOUT_NAME, _load_hf_replica)


def register_hf_rollout() -> None:
    """Make ``actor_rollout_ref.rollout.name=hf`` resolvable by verl (idempotent)."""
    run_after_import("verl.workers.rollout.base", _register_rollout_class)
    run_after_import("verl.workers.rollout.replica", _register_replica)
