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
"""The teacher of the hinted pass (``cpo.teacher``) and RLSD's λ schedule: resolution, validation, the start-up check
of the reference worker a teacher needs, and the worker call that refreshes the reference from the actor."""

import re

import pytest
import torch
from hydra import compose, initialize_config_dir

from treetune_recipe.cpo import CONFIG_DIR, CONFIG_NAME
from treetune_recipe.cpo.config import CPOConfig
from treetune_recipe.cpo.trainer.preflight import check_cpo_config
from treetune_verl.teacher_worker import copy_parameters


def compose_cpo(*overrides):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(CONFIG_NAME, overrides=["platform=cpu", *overrides])


@pytest.mark.parametrize(
    ("method", "teacher", "resolved"),
    [
        ("seq_kl", None, "policy"),
        ("negonly_mi3", None, "policy"),
        ("rlsd", None, "refreshed"),
        ("opsd_token", None, "initial"),
        ("opsd", None, "initial"),
        ("sdpo", None, "ema"),
        ("seq_kl", "initial", "initial"),
        ("sdpo", "initial", "initial"),
        ("rlsd", "policy", "policy"),
        ("opsd_token", "refreshed", "refreshed"),
    ],
)
def test_null_teacher_is_the_published_setting_and_an_explicit_one_wins(method, teacher, resolved):
    teacher_config = CPOConfig(method=method, teacher=teacher).teacher_config
    assert teacher_config.name == resolved
    assert teacher_config.on_reference_worker == (resolved != "policy")
    assert ("cpo.teacher" in teacher_config.describe()) == (teacher is not None)


def test_rlsd_lambda_falls_linearly_to_zero_at_the_decay_step():
    # λ_t = 0.5·max(0, 1 - t/60): worked by hand at t = 1, 30, 45, 60 and past the end.
    # The schedule is the method's (Method.schedule), applied by CPOConfig.at_step, which the trainer calls per step.
    config = CPOConfig.from_config({"method": "rlsd", "rlsd": {"mix_lambda": 0.5, "lambda_decay_steps": 60}})
    expected = {1: 0.5 * 59 / 60, 30: 0.25, 45: 0.125, 60: 0.0, 61: 0.0, 200: 0.0}
    for step, value in expected.items():
        step_config, metrics = config.at_step(step, 100)
        assert step_config.rlsd.mix_lambda == pytest.approx(value, abs=1e-12), step
        assert metrics == {"cpo/rlsd_lambda": pytest.approx(value, abs=1e-12)}
        assert config.rlsd.mix_lambda == 0.5  # the run's knobs are left as configured
    constant = CPOConfig.from_config({"method": "rlsd", "rlsd": {"mix_lambda": 0.3, "lambda_decay_steps": 0}})
    assert [constant.at_step(step, 500)[0].rlsd.mix_lambda for step in (1, 60, 500)] == [0.3, 0.3, 0.3]
    # A method without a schedule keeps its config object as is.
    plain = CPOConfig()
    assert plain.at_step(7, 100) == (plain, {})


def test_a_refreshed_teacher_is_refreshed_after_every_n_th_update():
    config = CPOConfig(teacher="refreshed", teacher_refresh_steps=20).teacher_config
    assert [step for step in range(1, 70) if config.refresh_due(step)] == [21, 41, 61]
    every_step = CPOConfig(teacher="refreshed", teacher_refresh_steps=1).teacher_config
    assert [step for step in range(1, 5) if every_step.refresh_due(step)] == [2, 3, 4]
    assert not any(CPOConfig(teacher="initial", teacher_refresh_steps=1).teacher_config.refresh_due(s) for s in (2, 3))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"teacher": "frozen"}, "Unknown cpo.teacher 'frozen'. Valid values: policy, initial, refreshed, ema"),
        ({"teacher_refresh_steps": 0}, "cpo.teacher_refresh_steps must be an integer >= 1"),
        ({"teacher_ema_rate": 0}, "cpo.teacher_ema_rate must lie in (0, 1]"),
        ({"teacher_ema_rate": 1.5}, "cpo.teacher_ema_rate must lie in (0, 1]"),
        ({"rlsd": {"lambda_decay_steps": -1}}, "cpo.rlsd.lambda_decay_steps must be an integer"),
        ({"rlsd_lambda_decay_steps": 2.5}, "cpo.rlsd.lambda_decay_steps must be an integer"),
    ],
)
def test_invalid_teacher_settings_raise_a_clear_error(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        CPOConfig.from_config(fields)


@pytest.mark.parametrize("teacher_override", ["cpo.teacher=initial", "cpo.teacher=refreshed", "cpo.method=rlsd"])
def test_a_reference_teacher_without_a_reference_worker_stops_naming_the_fix(teacher_override):
    config = compose_cpo(teacher_override, "actor_rollout_ref.actor.use_kl_loss=false")
    with pytest.raises(ValueError) as error:
        check_cpo_config(config)
    assert "actor_rollout_ref.actor.use_kl_loss=true" in str(error.value) and "cpo.teacher=policy" in str(error.value)
    # The same teacher with the reference worker on (the KL term weighted 0) passes; so does the policy teacher
    # without one.
    check_cpo_config(compose_cpo(teacher_override, "actor_rollout_ref.actor.kl_loss_coef=0"))
    check_cpo_config(compose_cpo("cpo.teacher=policy", "actor_rollout_ref.actor.use_kl_loss=false"))


@pytest.mark.parametrize("teacher", ["refreshed", "ema"])
def test_a_teacher_whose_weights_change_with_lora_stops(teacher):
    with pytest.raises(ValueError, match="with LoRA the reference is the actor without its adapter"):
        check_cpo_config(compose_cpo(f"cpo.teacher={teacher}", "actor_rollout_ref.model.lora_rank=8"))
    check_cpo_config(compose_cpo("cpo.teacher=initial", "actor_rollout_ref.model.lora_rank=8"))


def test_copy_parameters_makes_the_reference_compute_what_the_actor_computes():
    torch.manual_seed(0)
    actor, reference = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3).to(torch.float64)
    inputs = torch.randn(5, 4)
    assert not torch.allclose(actor(inputs).double(), reference(inputs.double()))
    assert copy_parameters(actor, reference) == 2
    torch.testing.assert_close(reference(inputs.double()), actor(inputs).double())
    assert reference.weight.dtype == torch.float64  # the reference keeps its own dtype


def test_copy_parameters_refuses_different_models_before_copying():
    reference = torch.nn.Linear(4, 3)
    before = reference.weight.detach().clone()
    with pytest.raises(ValueError, match="differ in shape"):
        copy_parameters(torch.nn.Linear(4, 2), reference)
    with pytest.raises(ValueError, match="different parameters"):
        copy_parameters(torch.nn.Linear(4, 3, bias=False), reference)
    torch.testing.assert_close(reference.weight, before)


def test_the_ema_teacher_skips_an_update_without_a_finite_gradient():
    """As SDPO's official code: the EMA moves only when some optimizer step of the update had a finite gradient norm
    (verl's engine skipped the others, so the actor did not change). Control: one finite norm among them moves it."""
    from verl import DataProto

    from treetune_recipe.cpo.teacher.weights import Teacher
    from treetune_recipe.cpo.trainer.ray_trainer import actor_changed

    class Group:
        rates = []

        def ema_actor_weights_into_reference(self, rate):
            self.rates.append(rate)

    def update(norms):
        return DataProto(meta_info={"metrics": {"actor/grad_norm": norms}})

    teacher = Teacher(CPOConfig.from_config({"method": "sdpo"}).teacher_config)
    assert not actor_changed(update([float("nan"), float("inf")]))
    teacher.after_update(1, Group(), actor_changed=actor_changed(update([float("nan"), float("inf")])))
    assert Group.rates == [] and teacher.weights_step is None
    assert actor_changed(update([float("nan"), 0.7])) and actor_changed(update(0.3))
    assert actor_changed(DataProto(meta_info={"metrics": {}}))  # no norm reported: assume the actor changed
    teacher.after_update(2, Group(), actor_changed=actor_changed(update([float("nan"), 0.7])))
    assert Group.rates == [0.05] and teacher.weights_step == 2
