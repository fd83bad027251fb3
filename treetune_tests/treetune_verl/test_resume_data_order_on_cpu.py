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
"""A resumed run draws the prompts of the run it resumes, in the same order, at every step, epoch boundaries included.

verl's own ``RayPPOTrainer._save_checkpoint`` and ``_load_checkpoint`` run on a real stateful dataloader with verl's
shuffling sampler (``create_rl_sampler``); only the workers are stand-ins (no Ray, no model). The loop of
:func:`train` is the data side of ``RayPPOTrainer.fit``: the resume, the epoch counter it derives from the resumed
step, the epoch loop and a save after every step. The control is verl's trainer without
``CompleteCheckpointsMixin``: resumed at an epoch boundary, 0.9.1 shuffles the next epoch from ``data.seed`` again
and 0.7.1 spends an epoch of its loop on the finished one, so its order differs from the straight run's.
The end-to-end check of prompts and sampled responses is in ``test_cpo_interrupted_runs_e2e_on_cpu.py``.
"""

import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from torchdata.stateful_dataloader import StatefulDataLoader

from treetune_verl.checkpoint_saves import CompleteCheckpointsMixin
from treetune_verl.version import verl_is

PROMPTS, BATCH, EPOCHS = 8, 4, 3  # two steps per epoch
STEPS = PROMPTS // BATCH * EPOCHS


def verl_sampler(seed: int, dataset):
    # SYNC WARNING: verl/trainer/ppo/utils.py:create_rl_sampler (0.7.1: verl/trainer/main_ppo.py)
    if verl_is("0.7.1"):
        from verl.trainer.main_ppo import create_rl_sampler
    else:
        from verl.trainer.ppo.utils import create_rl_sampler
    return create_rl_sampler(OmegaConf.create({"shuffle": True, "seed": seed, "sampler": None}), dataset)


class StandInWorkers:
    """The actor worker group's checkpoint calls, without a model."""

    def save_checkpoint(self, local_path, *args, **kwargs):
        os.makedirs(local_path, exist_ok=True)

    def load_checkpoint(self, *args, **kwargs):
        pass


def trainer(trainer_class, run_dir: Path, seed: int, prompts: int = PROMPTS):
    """A trainer of ``trainer_class`` as verl builds it for a (new or resumed) run: step 0, a fresh dataloader."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer  # noqa: F401  (verl's trainer module, for the classes)

    instance = object.__new__(trainer_class)
    instance.config = OmegaConf.create(
        {
            "trainer": {
                "default_local_dir": str(run_dir),
                "default_hdfs_dir": None,
                "resume_mode": "auto",
                "del_local_ckpt_after_load": False,
                "total_epochs": EPOCHS,
            },
            "actor_rollout_ref": {"actor": {"checkpoint": {"async_save": False}}},
        }
    )
    instance.actor_rollout_wg = StandInWorkers()
    instance.use_critic = False
    instance.global_steps = 0
    dataset = list(range(prompts))
    instance.train_dataloader = StatefulDataLoader(
        dataset, batch_size=BATCH, sampler=verl_sampler(seed, dataset), drop_last=True, num_workers=0
    )
    return instance


def train(instance, stop_after: int = STEPS) -> list[list[int]]:
    """The data side of ``RayPPOTrainer.fit``: the prompt ids of each step it trains, saving after every step."""
    instance._load_checkpoint()
    current_epoch = instance.global_steps // len(instance.train_dataloader)
    instance.global_steps += 1
    steps = []
    for _ in range(current_epoch, instance.config.trainer.total_epochs):
        for batch in instance.train_dataloader:
            steps.append(batch.tolist())
            instance._save_checkpoint()
            if instance.global_steps >= stop_after:
                return steps
            instance.global_steps += 1
    return steps


def straight_and_resumed(trainer_class, tmp_path: Path, resume_step: int, seed: int = 0):
    """The prompt ids of a straight run, and of a run stopped after ``resume_step`` and resumed to the end."""
    straight = train(trainer(trainer_class, tmp_path / "straight", seed))
    first = train(trainer(trainer_class, tmp_path / "resumed", seed), stop_after=resume_step)
    return straight, first + train(trainer(trainer_class, tmp_path / "resumed", seed))


def _verl_trainer():
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    return RayPPOTrainer


def treetune_trainer():
    class Trainer(CompleteCheckpointsMixin, _verl_trainer()):
        pass

    return Trainer


def upstream_trainer():
    class Trainer(_verl_trainer()):
        pass

    return Trainer


@pytest.mark.parametrize("resume_step", range(1, STEPS))
def test_a_resume_at_any_step_draws_the_straight_runs_prompts_in_order(tmp_path, resume_step):
    straight, resumed = straight_and_resumed(treetune_trainer(), tmp_path, resume_step)
    assert len(straight) == STEPS and len({tuple(sorted(step)) for step in straight}) > 1  # the epochs differ
    assert resumed == straight


@pytest.mark.parametrize("resume_step", [2, 4])
def test_control_verls_resume_at_an_epoch_boundary_changes_the_order(tmp_path, resume_step):
    straight, resumed = straight_and_resumed(upstream_trainer(), tmp_path, resume_step)
    assert resumed != straight


@pytest.mark.parametrize("resume_step", [1, 3])
def test_control_verls_resume_within_an_epoch_already_keeps_the_order(tmp_path, resume_step):
    straight, resumed = straight_and_resumed(upstream_trainer(), tmp_path, resume_step)
    assert resumed == straight


def test_control_another_seed_draws_another_order(tmp_path):
    assert train(trainer(treetune_trainer(), tmp_path / "a", seed=0)) != train(
        trainer(treetune_trainer(), tmp_path / "b", seed=1)
    )


def test_a_boundary_resume_from_a_save_with_another_batch_size_says_its_order_differs(tmp_path, capsys):
    saved = trainer(treetune_trainer(), tmp_path, seed=0)
    saved.train_dataloader = StatefulDataLoader(
        list(range(PROMPTS)), batch_size=BATCH // 2, sampler=verl_sampler(0, list(range(PROMPTS))), drop_last=True
    )
    train(saved, stop_after=2)  # half of an epoch of four steps
    resumed = trainer(treetune_trainer(), tmp_path, seed=0)  # two steps per epoch: step 2 ends one
    resumed._load_checkpoint()
    printed = capsys.readouterr().out
    assert f"its data order differs from an uninterrupted run's: {tmp_path / 'global_step_2' / 'data.pt'}" in printed
    assert "had 1 batch(es) of its epoch left" in printed
