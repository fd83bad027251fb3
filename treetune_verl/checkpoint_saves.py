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
"""The trainer's side of complete checkpoints: :class:`CompleteCheckpointsMixin`, mixed into a ``RayPPOTrainer``
subclass, ends every checkpoint save by marking its folder complete
(``treetune_verl.run_folder.mark_checkpoint_complete``, which a resume verifies), stops the run with one line when a
save runs out of disk, and makes the step's write boundaries pause points for the kill tests
(``treetune_verl.fault_points``). The driver's side (lock, resume point) is :mod:`treetune_verl.run_folder`.
"""

from __future__ import annotations

import errno
import os

from treetune_verl.fault_points import pause_point
from treetune_verl.run_folder import RunFolderError, mark_checkpoint_complete


class CheckpointSaveError(RunFolderError):
    """A checkpoint save failed (e.g. a full disk); the folder is not marked complete."""


def _is_disk_full(error: BaseException | None) -> OSError | None:
    """The ``ENOSPC`` error in ``error``'s chain (a Ray task error carries the worker's as ``cause``), if any."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return error
        error = getattr(error, "cause", None) or error.__cause__ or error.__context__
    return None


class CompleteCheckpointsMixin:
    """Mix into a ``RayPPOTrainer`` subclass (before it): every checkpoint save ends by marking its folder complete,
    a save that runs out of disk stops the run with one line, and the step's write boundaries are pause points
    (``treetune_verl.fault_points``) for the kill tests."""

    def _save_checkpoint(self):
        # SYNC WARNING: verl/trainer/ppo/ray_trainer.py:RayPPOTrainer._save_checkpoint (folder global_step_N under
        # trainer.default_local_dir; writes latest_checkpointed_iteration.txt last)
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        try:
            result = super()._save_checkpoint()
            pause_point("checkpoint_saved", self.global_steps)
            mark_checkpoint_complete(folder, self.global_steps)
        except Exception as error:
            disk_full = _is_disk_full(error)
            if disk_full is None:
                raise
            raise CheckpointSaveError(
                f"no space left on the device while saving {folder} ({disk_full.filename or 'a checkpoint file'}): "
                "it is not marked complete, so a resume uses the checkpoint before it. Free space, or lower "
                "trainer.max_actor_ckpt_to_keep, then run the same command again."
            ) from error
        pause_point("checkpoint_complete", self.global_steps)
        return result

    def _validate(self, *args, **kwargs):
        pause_point("validation", self.global_steps)
        return super()._validate(*args, **kwargs)

    def _update_actor(self, batch):
        pause_point("update", self.global_steps)
        return super()._update_actor(batch)
