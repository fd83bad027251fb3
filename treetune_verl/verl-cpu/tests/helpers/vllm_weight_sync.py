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
"""A weight sync into vLLM CPU layers, run the way verl's plain ``update_weights_from_ipc`` runs it.

Run as a script: ``python vllm_weight_sync.py [--amx] [--unpatched]``. It builds two of vLLM's linear layers on the
CPU, loads and packs initial weights as vLLM's loader does, then syncs new weights through a stand-in for verl's
worker extension: ``model.load_weights`` on the live model, then vLLM's whole-model ``process_weights_after_loading``
(verl 0.9.1's two model calls, in its order). The stand-in is wrapped by verl-cpu's layerwise reload patch unless
``--unpatched``. ``--amx`` makes vLLM take the path of a CPU with AMX tiles. Prints the largest difference between the
layers' output and the output of the synced weights (and of the initial ones), or the sync's exception.
"""

import argparse
import socket
from types import SimpleNamespace

import torch

WIDTH = 8


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class TwoLinears(torch.nn.Module):
    """Two of vLLM's unquantised linear layers; ``load_weights`` loads through each parameter's weight loader."""

    def __init__(self):
        from vllm.model_executor.layers.linear import ReplicatedLinear

        super().__init__()
        self.first = ReplicatedLinear(WIDTH, WIDTH, bias=False, disable_tp=True)
        self.second = ReplicatedLinear(WIDTH, WIDTH, bias=True, disable_tp=True)

    def forward(self, x):
        return self.second(torch.relu(self.first(x)[0]))[0]

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        for name, tensor in weights:
            params[name].weight_loader(params[name], tensor)


def reference(weights: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    hidden = torch.relu(x @ weights["first.weight"].T)
    return hidden @ weights["second.weight"].T + weights["second.bias"]


def random_weights(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shapes = {"first.weight": (WIDTH, WIDTH), "second.weight": (WIDTH, WIDTH), "second.bias": (WIDTH,)}
    return {name: torch.randn(shape, generator=generator) for name, shape in shapes.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--amx", action="store_true")
    parser.add_argument("--unpatched", action="store_true")
    args = parser.parse_args()
    if args.amx:
        torch.cpu._is_amx_tile_supported = lambda: True

    from verl_cpu.patches.vllm import reload_weights_layerwise
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.model_loader.reload import record_metadata_for_reloading
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    vllm_config = VllmConfig()
    model_config = SimpleNamespace(quantization=None, dtype=torch.float32)  # what the passes read of a model's config
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(1, 0, f"tcp://127.0.0.1:{free_port()}", 0, backend="gloo")
        initialize_model_parallel(1, 1)
        model = TwoLinears()
    record_metadata_for_reloading(model)
    initial = random_weights(seed=0)
    model.load_weights(initial.items())
    process_weights_after_loading(model, model_config, torch.device("cpu"))
    synced = random_weights(seed=1)

    class VerlPlainSync:
        """verl's worker extension reduced to its plain sync: load into the live model, then the whole-model pass."""

        _is_qat_model = _is_modelopt_qat = False
        model_runner = SimpleNamespace(vllm_config=vllm_config)

        def _iter_all_models(self):
            yield model

        def _iter_all_models_with_config(self):
            yield model, model_config

        def update_weights_from_ipc(self, peft_config=None, base_sync_done=False, use_shm=False):
            from vllm.model_executor.model_loader.utils import process_weights_after_loading

            model.load_weights(synced.items())
            process_weights_after_loading(model, model_config, torch.device("cpu"))

    if not args.unpatched:
        verl_utils = SimpleNamespace(vLLMColocateWorkerExtension=VerlPlainSync, is_quantized_model=lambda config: False)
        reload_weights_layerwise(verl_utils)
    try:
        VerlPlainSync().update_weights_from_ipc()
    except Exception as error:  # reported to the test, which runs this script
        print(f"sync failed: {type(error).__name__}: {error}")
        return
    x = torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        output = model(x)
    for name, weights in (("synced", synced), ("initial", initial)):
        print(f"max abs difference to the {name} weights: {(output - reference(weights, x)).abs().max().item():.3e}")


if __name__ == "__main__":
    main()
