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
lists this module. (The CPU profile, ``platform=cpu``, lists ``verl_cpu.activate`` instead, which applies the same
engine fixes on CPU; the fix for accelerators only below does nothing there.)

On import it applies the version-guarded engine fixes of :mod:`treetune_verl.patches`: the actor kept on its device
after weight sync (verl 0.7.1), and verl-cpu's FSDP-engine fixes, right on every device (a full-sequence attention
mask on the padded path, verl #6278; the trainer's log-probs normalised over the tokenizer's ids, as the vLLM
rollout's are; verl's pure-torch pad/unpad helpers where ``flash_attn`` is missing).
"""

from treetune_verl import patches

MODULE = __name__


def setup() -> None:
    """Apply the fixes every treetune Ray process needs (idempotent)."""
    patches.apply_engine_worker_fixes()


setup()
