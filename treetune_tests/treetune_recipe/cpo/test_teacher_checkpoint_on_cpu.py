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
"""A moving teacher in the checkpoint: a run resumed at any step scores with the teacher of the run it resumes.

The ``Teacher`` runs its real schedule (``before_reference_pass``, ``after_update``, ``save``, ``resume``) against a
stand-in worker group whose actor and reference are two small modules, moved by the library's own calls
(``copy_parameters``, ``save_local_shards``, ``load_local_shards``). An update moves the actor by a fixed step. The
end-to-end runs on Ray are the kill sweep's (``treetune_scripts/kill_sweep.py``); the start-up error of a damaged
teacher file is ``treetune_verl.run_folder``'s, tested with the actor's files.
"""

import json
import os

import pytest
import torch

from treetune_recipe.cpo.config import CPOConfig
from treetune_recipe.cpo.teacher.weights import TEACHER_DIR, TEACHER_STATE_FILE, Teacher
from treetune_verl.teacher_worker import copy_parameters, load_local_shards, save_local_shards, shard_file

STEPS, REFRESH_STEPS = 8, 3


def starting_model() -> torch.nn.Module:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return torch.nn.Linear(4, 3)


class StandInWorkers:
    """The fused actor/reference worker group of one process (rank 0 of 1)."""

    def __init__(self, actor: torch.nn.Module):
        self.actor, self.reference = actor, starting_model()  # verl builds the reference from the model path

    def copy_actor_weights_to_reference(self):
        return copy_parameters(self.actor, self.reference)

    def ema_actor_weights_into_reference(self, rate):
        return copy_parameters(self.actor, self.reference, rate=rate)

    def save_reference_weights(self, folder):
        return save_local_shards(self.reference, shard_file(folder, 0, 1))

    def load_reference_weights(self, folder):
        return load_local_shards(self.reference, shard_file(folder, 0, 1))


@torch.no_grad()
def update(actor: torch.nn.Module, step: int) -> None:
    """One optimizer step's worth of change, different at every step."""
    for index, param in enumerate(actor.parameters()):
        param.add_(torch.full_like(param, 0.1 * step + 0.01 * index))


def train(teacher_name: str, run_dir, *, first: int = 1, last: int = STEPS, checkpoint: bool = True):
    """Steps ``first``..``last`` as ``RayCPOTrainer`` orders the teacher's calls, from the checkpoint of ``first - 1``
    (the actor's state stands in for verl's), saving a checkpoint after every step. Returns the worker group and the
    teacher weights each step scored with, with the step's teacher metrics."""
    config = CPOConfig(teacher=teacher_name, teacher_refresh_steps=REFRESH_STEPS, teacher_checkpoint=checkpoint)
    teacher = Teacher(config.teacher_config)
    actor = starting_model()
    if first > 1:
        actor.load_state_dict(torch.load(run_dir / f"global_step_{first - 1}" / "actor.pt"))
    workers = StandInWorkers(actor)
    if first > 1 and checkpoint:
        teacher.resume(str(run_dir / f"global_step_{first - 1}"), first - 1, workers)
    scored_with = {}
    for step in range(first, last + 1):
        teacher.before_reference_pass(step, workers)
        scored_with[step] = (workers.reference.weight.detach().clone(), teacher.metrics(step))
        update(workers.actor, step)
        teacher.after_update(step, workers)
        folder = run_dir / f"global_step_{step}"
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(workers.actor.state_dict(), folder / "actor.pt")
        if checkpoint:
            teacher.save(str(folder), step, workers)
    return workers, scored_with


@pytest.mark.parametrize("teacher", ["ema", "refreshed"])
@pytest.mark.parametrize("resume_after", range(1, STEPS))
def test_a_resumed_run_scores_with_the_teacher_of_the_run_it_resumes(tmp_path, teacher, resume_after):
    straight, straight_scored = train(teacher, tmp_path / "straight")
    train(teacher, tmp_path / "resumed", last=resume_after)
    resumed, resumed_scored = train(teacher, tmp_path / "resumed", first=resume_after + 1)
    for step, (weight, metrics) in resumed_scored.items():
        torch.testing.assert_close(weight, straight_scored[step][0], rtol=0, atol=0, msg=f"step {step}")
        assert metrics == straight_scored[step][1], step  # cpo/teacher_weights_step, cpo/teacher_refreshed
    torch.testing.assert_close(resumed.reference.weight, straight.reference.weight, rtol=0, atol=0)
    # The schedule moved: the teacher changed during the run (the test would pass on a frozen one).
    assert not torch.equal(straight_scored[1][0], straight_scored[STEPS][0])


@pytest.mark.parametrize("teacher", ["ema", "refreshed"])
def test_control_without_the_teachers_state_a_resume_restarts_the_teacher(tmp_path, teacher, capsys):
    resume_after = 4  # refreshed: last refreshed before step 4, next refresh before step 7
    _, straight_scored = train(teacher, tmp_path / "straight", checkpoint=False)
    train(teacher, tmp_path / "resumed", last=resume_after, checkpoint=False)
    _, resumed_scored = train(teacher, tmp_path / "resumed", first=resume_after + 1, checkpoint=False)
    assert not torch.equal(resumed_scored[resume_after + 1][0], straight_scored[resume_after + 1][0])
    assert f"the {teacher} teacher restarts from the resumed actor's weights" in capsys.readouterr().out


def test_the_checkpoint_holds_the_weights_only_when_a_resume_needs_them(tmp_path):
    train("ema", tmp_path / "ema", last=2)
    train("refreshed", tmp_path / "refreshed", last=STEPS)

    def state(name, step):
        return json.loads((tmp_path / name / f"global_step_{step}" / TEACHER_DIR / TEACHER_STATE_FILE).read_text())

    saved = {
        (name, step): state(name, step)
        for name, last in (("ema", 2), ("refreshed", STEPS))
        for step in range(1, last + 1)
    }
    assert [saved["ema", step]["weights_saved"] for step in (1, 2)] == [True, True]
    # refreshed every 3 updates: the starting model until step 3, the actor's after step 3 (steps 4-6) and after step
    # 6 (steps 7-9); steps 3 and 6 are followed by a refresh.
    weights = [saved["refreshed", step]["weights_saved"] for step in range(1, STEPS + 1)]
    assert weights == [False, False, False, True, True, False, True, True]
    assert [saved["refreshed", step]["weights_step"] for step in range(1, STEPS + 1)] == [0, 0, 0, 3, 3, 3, 6, 6]
    for step, has_weights in zip(range(1, STEPS + 1), weights, strict=True):
        files = os.listdir(tmp_path / "refreshed" / f"global_step_{step}" / TEACHER_DIR)
        assert ("model_world_size_1_rank_0.pt" in files) == has_weights


def test_a_resume_says_which_teacher_weights_it_resumed(tmp_path, capsys):
    train("refreshed", tmp_path, last=4)
    capsys.readouterr()
    train("refreshed", tmp_path, first=5, last=5)
    printed = capsys.readouterr().out
    assert "[cpo] resumed the refreshed teacher at step 4: updates taken from the actor after step 3" in printed
    assert f"its weights from {tmp_path / 'global_step_4' / TEACHER_DIR}" in printed


def test_loading_shards_of_another_model_or_precision_changes_nothing(tmp_path):
    path = str(tmp_path / "shards.pt")
    save_local_shards(torch.nn.Linear(4, 3), path)
    for other in (torch.nn.Linear(4, 2), torch.nn.Linear(4, 3).to(torch.float64), torch.nn.Linear(4, 3, bias=False)):
        before = other.weight.detach().clone()
        with pytest.raises(ValueError, match="shards.pt"):
            load_local_shards(other, path)
        torch.testing.assert_close(other.weight, before)
