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
save runs out of disk, makes the step's write boundaries pause points for the kill tests
(``treetune_verl.fault_points``), lets a recipe add state of its own to a checkpoint (a moving teacher's weights),
and resumes the data order of the run it continues, at an epoch boundary too
(:func:`finish_saved_epoch`). The driver's side (lock, resume point) is :mod:`treetune_verl.run_folder`.
"""

from __future__ import annotations

import errno
import os

from treetune_verl.fault_points import pause_point
from treetune_verl.run_folder import RunFolderError, mark_checkpoint_complete

#: The file of a checkpoint folder that holds the train dataloader's state (its sampler's shuffle included).
# SYNC WARNING: verl/trainer/ppo/ray_trainer.py:RayPPOTrainer._save_checkpoint (dataloader state in data.pt)
DATA_STATE_FILE = "data.pt"


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


def finish_saved_epoch(dataloader, data_state_path: str) -> int:
    """Restore ``dataloader`` to the end of the epoch its state file was saved at, so that its next epoch draws the
    shuffle an uninterrupted run draws next.

    A checkpoint saved at the last step of an epoch holds the dataloader with every batch of that epoch taken. Its
    sampler (verl's ``create_rl_sampler``: torchdata's stateful ``RandomSampler``) stores the generator state it
    shuffled the epoch with; restoring it shuffles that epoch again, which leaves the generator where an uninterrupted
    run's next epoch starts. Iterating the restored loader to its end does that and yields no batch: the next
    ``iter(dataloader)`` is a new epoch with that shuffle.

    Args:
        dataloader: the trainer's train dataloader (a torchdata ``StatefulDataLoader``), not yet iterated.
        data_state_path: the checkpoint's :data:`DATA_STATE_FILE`.

    Returns:
        How many batches of the saved epoch were left (0 when the saved state is the end of an epoch, as it is
        whenever the dataset and the batch size are those of the save); those batches are skipped.
    """
    import torch

    dataloader.load_state_dict(torch.load(data_state_path, weights_only=False))
    return sum(1 for _ in dataloader)


class CompleteCheckpointsMixin:
    """Mix into a ``RayPPOTrainer`` subclass (before it): every checkpoint save ends by marking its folder complete,
    a save that runs out of disk stops the run with one line, the step's write boundaries are pause points
    (``treetune_verl.fault_points``) for the kill tests, and a resume draws the prompts of the run it continues, in
    the same order, from any step (:meth:`_load_checkpoint`)."""

    def _save_checkpoint(self):
        # SYNC WARNING: verl/trainer/ppo/ray_trainer.py:RayPPOTrainer._save_checkpoint (folder global_step_N under
        # trainer.default_local_dir; writes latest_checkpointed_iteration.txt last)
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        try:
            result = super()._save_checkpoint()
            self._save_extra_checkpoint_state(folder)
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

    def _load_checkpoint(self):
        """verl's resume, then, when the resumed step ends an epoch, the sampler state of that epoch's end.

        Within an epoch verl restores the dataloader from the checkpoint, and the order goes on as in an
        uninterrupted run. At an epoch boundary it does not: 0.9.1 skips the restore, so the next epoch is shuffled
        from ``data.seed`` again and repeats the first epoch's order; 0.7.1 restores the finished epoch, which the
        fit loop then spends as an epoch with no batch (the run ends an epoch early when ``trainer.total_epochs``
        binds). Both come back to the uninterrupted order here (:func:`finish_saved_epoch`).
        """
        # SYNC WARNING: verl/trainer/ppo/ray_trainer.py:RayPPOTrainer._load_checkpoint (0.9.1 skips data.pt when
        # global_steps is a multiple of len(train_dataloader); 0.7.1 loads it; the folder is global_step_<N> under
        # default_local_dir, or resume_from_path) and RayPPOTrainer.fit (epoch = global_steps // len(dataloader))
        result = super()._load_checkpoint()
        if self.global_steps == 0:
            return result
        trainer = self.config.trainer
        if trainer.resume_mode == "resume_path":
            folder = os.path.abspath(trainer.resume_from_path)
        else:
            folder = os.path.abspath(os.path.join(trainer.default_local_dir, f"global_step_{self.global_steps}"))
        self._load_extra_checkpoint_state(folder)
        self._continue_data_order(os.path.join(folder, DATA_STATE_FILE))
        return result

    def _continue_data_order(self, data_state: str) -> None:
        """When the resumed step ends an epoch, restore that epoch's end from ``data_state`` (verl restores it
        within an epoch itself) and say so."""
        steps_per_epoch = len(self.train_dataloader)
        if steps_per_epoch == 0 or self.global_steps % steps_per_epoch or not os.path.exists(data_state):
            return  # within an epoch, or no data state (verl has said that the data starts from scratch)
        skipped = finish_saved_epoch(self.train_dataloader, data_state)
        epoch = self.global_steps // steps_per_epoch
        if skipped:
            print(
                f"[run_folder] warning: step {self.global_steps} ends epoch {epoch} of {steps_per_epoch} steps, but "
                f"the saved dataloader had {skipped} batch(es) of its epoch left (the dataset or data.train_batch_size "
                f"changed since the save); they are skipped and its data order differs from an uninterrupted run's: "
                f"{data_state}"
            )
        else:
            print(
                f"[run_folder] step {self.global_steps} ends epoch {epoch}: epoch {epoch + 1} is shuffled as in an "
                f"uninterrupted run (sampler state of {data_state})"
            )

    def _save_extra_checkpoint_state(self, folder: str) -> None:
        """What a recipe adds to the checkpoint ``folder`` after verl's save and before the folder is marked complete
        (so the marker lists its files, and a resume verifies them). Nothing here."""

    def _load_extra_checkpoint_state(self, folder: str) -> None:
        """Read back what :meth:`_save_extra_checkpoint_state` wrote, after verl's resume from ``folder``. Nothing
        here."""

    def _validate(self, *args, **kwargs):
        pause_point("validation", self.global_steps)
        return super()._validate(*args, **kwargs)

    def _update_actor(self, batch):
        pause_point("update", self.global_steps)
        return super()._update_actor(batch)
