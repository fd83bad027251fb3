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
"""The teacher of a run: every fact that depends on which teacher it is, in this module.

:class:`TeacherConfig` is the resolved teacher (``CPOConfig.teacher_config``: its name, where it comes from, its rates)
and what follows from its name alone: which worker scores it, whether the trainer changes its weights, when a
``refreshed`` one takes the actor's. :class:`Teacher` wraps it with the run's state. The trainer calls
:meth:`Teacher.before_reference_pass` before verl's reference pass of each step (a ``refreshed`` teacher takes the
actor's weights when due), :meth:`Teacher.after_update` after each actor update (an ``ema`` teacher moves towards the
actor), :meth:`Teacher.metrics` once per step, and :meth:`Teacher.save` / :meth:`Teacher.resume` with each checkpoint:
verl checkpoints the actor only, so a moving teacher's weights and schedule are saved beside it (:data:`TEACHER_DIR`)
and a resumed run scores with the teacher the uninterrupted run had. No other module compares a teacher's name.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from treetune_verl.fault_points import pause_point

#: Teachers of the hinted pass, i.e. whose distribution of the response under the hint prompt the method reads:
#: ``policy``: the rollout policy, scored by the actor (moves with the student every step; CPO's own reference);
#: ``initial``: the model the run started from, held fixed (verl's reference-policy worker, or the actor without its
#: LoRA adapter when the reference lives in the actor); ``refreshed``: the reference worker, overwritten with the
#: actor's weights after every ``teacher_refresh_steps`` steps; ``ema``: the reference worker, moved towards the actor
#: after every update, θ_T ← (1-τ)·θ_T + τ·θ, τ = ``teacher_ema_rate``.
TEACHERS = ("policy", "initial", "refreshed", "ema")
#: Teachers scored by verl's reference-policy worker (it must exist: ``actor_rollout_ref.actor.use_kl_loss=true``).
REFERENCE_TEACHERS = ("initial", "refreshed", "ema")
#: Teachers whose weights the trainer changes (overwrites or averages): the reference must be a model of its own.
CHANGING_TEACHERS = ("refreshed", "ema")
#: Folder of a checkpoint (``global_step_<N>/``) with a moving teacher's state, :data:`TEACHER_STATE_FILE`, and, when a
#: resume needs them, its weights: each rank's shards of the reference, ``model_world_size_<W>_rank_<r>.pt``.
TEACHER_DIR = "teacher"
TEACHER_STATE_FILE = "teacher_state.json"
#: The metric set to 1 for the run's teacher, one name per teacher (``cpo.teacher``).
TEACHER_METRICS = {name: f"cpo/teacher/{name}" for name in TEACHERS}


@dataclass(frozen=True)
class TeacherConfig:
    """The teacher of the hinted pass, resolved (built by ``CPOConfig`` from ``cpo.teacher``, its rate keys and the
    method's published teacher).

    Attributes:
        name: one of :data:`TEACHERS`.
        source: ``cpo.teacher`` when set, else ``published setting of <method>``.
        refresh_steps: ``refreshed``: the reference takes the actor's weights after every this many updates.
        ema_rate: ``ema``: τ of θ_T ← (1-τ)·θ_T + τ·θ after every update.
    """

    name: str
    source: str
    refresh_steps: int
    ema_rate: float

    @property
    def on_reference_worker(self) -> bool:
        """Whether verl's reference-policy worker scores this teacher (else the actor does)."""
        return self.name in REFERENCE_TEACHERS

    @property
    def changes_weights(self) -> bool:
        """Whether the trainer changes this teacher's weights (the reference worker's) during the run."""
        return self.name in CHANGING_TEACHERS

    def refresh_due(self, step: int) -> bool:
        """Whether a ``refreshed`` teacher takes the actor's weights before step ``step`` (1-based) reads it: after
        every ``refresh_steps``-th update, i.e. at steps N+1, 2N+1, ..."""
        return self.name == "refreshed" and step > 1 and (step - 1) % self.refresh_steps == 0

    def describe(self) -> str:
        """One line for the start-up log: where the teacher comes from and what scores it."""
        scorer = {
            "policy": "the actor, with the rollout policy's weights",
            "initial": "the reference worker, the starting model held fixed",
            "refreshed": f"the reference worker, given the actor's weights every {self.refresh_steps} steps",
            "ema": f"the reference worker, moved towards the actor by τ = {self.ema_rate} after every update",
        }[self.name]
        return f"{self.source}; scored by {scorer}"


class Teacher:
    """The run's teacher (see the module docstring). ``weights_step`` is the number of updates the weights it scores
    with have seen: the step before for ``policy``, 0 for ``initial``, the last refresh's for ``refreshed``, and for
    ``ema`` the last update it averaged in."""

    def __init__(self, config: TeacherConfig):
        self.config = config
        self.name = config.name
        self.weights_step: int | None = None
        self.changed_this_step = False

    @property
    def scorer(self) -> str:
        """The model ``score_batch`` scores it with: ``actor`` or ``reference``."""
        return "reference" if self.config.on_reference_worker else "actor"

    def before_reference_pass(self, step: int, actor_rollout_wg) -> None:
        """A ``refreshed`` teacher takes the actor's weights when its refresh is due at ``step``. A run resumed from a
        checkpoint without the teacher's state (``cpo.teacher_checkpoint=false``, or an older checkpoint) restarts a
        moving teacher from the resumed actor: the reference holds the starting model again."""
        if not self.config.changes_weights:
            return
        resumed = self.weights_step is None and step > 1
        if resumed:
            print(
                f"[cpo] resumed at step {step} from a checkpoint without the teacher's state: the {self.name} teacher "
                "restarts from the resumed actor's weights, so it differs from an uninterrupted run's."
            )
        if resumed or self.config.refresh_due(step):
            # SYNC WARNING: treetune_verl/teacher_worker.py relies on the fused ActorRolloutRefWorker
            actor_rollout_wg.copy_actor_weights_to_reference()
            self.weights_step = step - 1
            self.changed_this_step = True
            pause_point("teacher_update", step)
        elif self.weights_step is None:
            self.weights_step = 0

    def after_update(self, step: int, actor_rollout_wg, *, actor_changed: bool = True) -> None:
        """An ``ema`` teacher: θ_T ← (1-τ)·θ_T + τ·θ with the actor's weights after the update of ``step``, unless no
        optimizer step of that update had a finite gradient (``actor_changed=False``: the actor kept its weights), as
        SDPO's official code skips it."""
        if self.name != "ema":
            return
        if not actor_changed:
            print(f"[cpo] step {step}: no optimizer step had a finite gradient; the ema teacher is not moved.")
            return
        actor_rollout_wg.ema_actor_weights_into_reference(self.config.ema_rate)
        self.weights_step = step
        self.changed_this_step = True
        pause_point("teacher_update", step)

    def weights_needed_to_resume(self, step: int) -> bool:
        """Whether a resume after ``step`` needs this teacher's weights from the checkpoint: they differ from the
        starting model (which verl's reference holds at start-up) and the next step does not overwrite them. ``ema``:
        always, once it has averaged an update in; ``refreshed``: after a refresh, unless the next step refreshes."""
        if not self.config.changes_weights or not self.weights_step:
            return False
        return not self.config.refresh_due(step + 1)

    def save(self, folder: str, step: int, actor_rollout_wg, *, keep_weights: bool = False) -> None:
        """Write a moving teacher's state into the checkpoint ``folder`` of ``step``: :data:`TEACHER_STATE_FILE`
        (its name and ``weights_step``), and its weights when a resume needs them or ``keep_weights`` (the run's last
        checkpoint keeps the trained teacher)."""
        if not self.config.changes_weights:
            return
        teacher_dir = os.path.join(folder, TEACHER_DIR)
        os.makedirs(teacher_dir, exist_ok=True)
        weights_saved = self.weights_needed_to_resume(step) or (keep_weights and bool(self.weights_step))
        if weights_saved:
            # SYNC WARNING: treetune_verl/teacher_worker.py relies on the fused ActorRolloutRefWorker
            actor_rollout_wg.save_reference_weights(teacher_dir)
        state = {"teacher": self.name, "weights_step": int(self.weights_step or 0), "weights_saved": weights_saved}
        with open(os.path.join(teacher_dir, TEACHER_STATE_FILE), "w") as handle:
            json.dump(state, handle)

    def resume(self, folder: str, step: int, actor_rollout_wg) -> None:
        """Restore a moving teacher from the checkpoint ``folder`` of ``step``: its weights (into the reference) and
        its ``weights_step``, so a ``refreshed`` schedule goes on where it stopped. Without the state the teacher
        restarts (:meth:`before_reference_pass` says so)."""
        state_path = os.path.join(folder, TEACHER_DIR, TEACHER_STATE_FILE)
        if not self.config.changes_weights or not os.path.exists(state_path):
            return
        with open(state_path) as handle:
            state = json.load(handle)
        if state["teacher"] != self.name:
            print(f"[cpo] the checkpoint's teacher state is a {state['teacher']} teacher's, not {self.name}: unused.")
            return
        if state["weights_saved"]:
            actor_rollout_wg.load_reference_weights(os.path.join(folder, TEACHER_DIR))
            what = f"its weights from {os.path.join(folder, TEACHER_DIR)}"
        elif state["weights_step"] == 0:
            what = "the starting model (no refresh yet)"
        else:
            what = f"the actor's weights at step {step + 1}, its refresh"
        self.weights_step = int(state["weights_step"])
        # An ema teacher's last change was the resumed step's own average: the next step reports it, as it would have.
        self.changed_this_step = self.name == "ema" and self.weights_step == step
        seen = "averaged in through" if self.name == "ema" else "taken from the actor after"
        print(f"[cpo] resumed the {self.name} teacher at step {step}: updates {seen} step {self.weights_step}; {what}")

    def metrics(self, step: int) -> dict[str, float]:
        """``cpo/teacher/<name>`` = 1, ``cpo/teacher_weights_step`` (updates seen by the weights it scored with this
        step) and ``cpo/teacher_refreshed`` (1 at a step whose teacher weights changed); resets the flag."""
        weights_step = {"policy": step - 1, "initial": 0}.get(self.name, self.weights_step)
        metrics = {
            TEACHER_METRICS[self.name]: 1.0,
            "cpo/teacher_weights_step": float(weights_step or 0),
            "cpo/teacher_refreshed": float(self.changed_this_step),
        }
        self.changed_this_step = False
        return metrics
