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
"""Set-up that every Ray process of a treetune run imports, on any device.

verl imports each module listed (comma-separated) in the ``VERL_USE_EXTERNAL_MODULES`` environment variable when
``verl`` itself is imported, in the driver and in every Ray worker. ``treetune_recipe/cpo/config/cpo_trainer.yaml``
lists this module; the CPU profile (``platform=cpu``) lists :mod:`treetune_verl.cpu_backend`, which imports this one.

On import it applies the version-guarded engine fixes of :mod:`treetune_verl.patches` (the actor kept on its device
after weight sync; a full-sequence attention mask on the FSDP engine's padded path, verl #6278; the trainer's
log-probs normalised over the tokenizer's ids, as the vLLM rollout's are) and, where the
``flash_attn`` package is missing, routes verl's pad/unpad helpers to verl's own pure-torch implementation.
"""

from treetune_verl import patches

#: Module path to list in ``VERL_USE_EXTERNAL_MODULES`` on an accelerator node.
MODULE = __name__


def setup() -> None:
    """Apply the fixes every treetune Ray process needs (idempotent)."""
    patches.apply_engine_worker_fixes()
    patches.apply_trainer_vocabulary_support()
    if not patches.flash_attn_installed():
        patches.apply_pure_torch_attention_utils()


setup()
