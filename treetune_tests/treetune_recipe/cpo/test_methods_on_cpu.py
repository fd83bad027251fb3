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
"""The method registry: every method one declaration, the config built from it (defaults written once, one typed block
per method, renamed keys kept as aliases), the published run settings applied on selection with the user's override
winning, and no consumer naming a method."""

import ast
import dataclasses
import re
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from treetune_recipe.cpo import CONFIG_DIR, CONFIG_NAME
from treetune_recipe.cpo.config import (
    CPOConfig,
    apply_method_run_settings,
    check_cpo_overrides,
    config_defaults,
    translate_alias_overrides,
)
from treetune_recipe.cpo.methods.method import METHODS, Distillation, Method, ReferenceTerm
from treetune_recipe.cpo.methods.registry import all_methods, get_method
from treetune_recipe.cpo.methods.sdpo import SDPOKnobs
from treetune_recipe.cpo.trainer.preflight import check_cpo_config
from treetune_verl.preflight import PreflightError
from treetune_verl.version import verl_is

REFERENCE_WRAPPERS = (
    "naive naive_qwen3 noaccmask mi mi_accmask mi_unify mi_clamp_unify mi_clamp_unify_difficulty mi3 negonly_mi3 "
    "negonly_mi reverse_mi3 addition_mi3 mi2 negonly_seq_kl seq_kl negonly_tok_kl tok_kl"
).split()
RECIPE = Path(CONFIG_DIR).parent


def compose_cpo(*overrides):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(CONFIG_NAME, overrides=["platform=cpu", *overrides])


def test_the_registry_holds_the_18_wrappers_then_the_peers():
    names = list(all_methods())
    assert sorted(names[:18]) == sorted(REFERENCE_WRAPPERS)
    assert names[18:] == ["rlsd", "opsd", "opsd_token", "sdpo", "sdpg"]
    assert {name for name, m in METHODS.items() if m.distribution_level} == {"opsd", "sdpo", "sdpg"}
    with pytest.raises(ValueError, match="Unknown cpo.method 'sdp'. Valid names: naive, .*, sdpo"):
        get_method("sdp")


def test_sdpo_is_declared_whole_in_one_place():
    sdpo = get_method("sdpo")
    distillation = sdpo.distillation
    assert (
        distillation.token_loss.__module__ == distillation.token_weight.__module__ == "treetune_recipe.cpo.methods.sdpo"
    )
    assert (distillation.ids, sdpo.context, sdpo.published_teacher) == ("student_topk", "successful_sibling", "ema")
    assert sdpo.knobs is SDPOKnobs and distillation.topk_knob == "top_k" and sdpo.topk(SDPOKnobs()) == 100
    assert SDPOKnobs() == SDPOKnobs(alpha=0.5, top_k=100, is_clip=2.0, exclude_self=True)
    # TRL's modes: the published loss is the distillation term alone; hybrid adds the verifier's PG term.
    assert sdpo.weights(SDPOKnobs()) == (0.0, 1.0)
    assert sdpo.weights(SDPOKnobs(policy_loss_mode="hybrid", distillation_weight=0.5)) == (1.0, 0.5)
    assert sdpo.weights(SDPOKnobs(policy_loss_mode="policy_only")) == (1.0, 0.0)
    assert "actor_rollout_ref.actor.ppo_mini_batch_size=${data.train_batch_size}" in sdpo.run_settings


def test_a_declaration_that_cannot_run_is_refused():
    with pytest.raises(ValueError, match="a shaped policy term needs advantage= and only it does"):
        Method(name="x", family="cpo", summary="", policy="shaped", advantage=None)
    with pytest.raises(ValueError, match="a shaped policy term needs advantage= and only it does"):
        Method(name="x", family="cpo", summary="", policy="verifier", advantage=print)
    with pytest.raises(ValueError, match="without a policy term it needs a distillation term"):
        Method(name="x", family="opsd", summary="", policy="none")
    with pytest.raises(ValueError, match="the distillation term names no knob 'k'"):
        Method(name="x", family="opsd", summary="", distillation=Distillation(print, topk_knob="k"), knobs=SDPOKnobs)
    with pytest.raises(ValueError, match="distillation ids must be one of"):
        Method(name="x", family="opsd", summary="", distillation=Distillation(print, ids="sampled"))
    with pytest.raises(ValueError, match="the reference term names no knob 'alpha'"):
        Method(name="x", family="sdpg", summary="", reference=ReferenceTerm(print, weight_knob="alpha"))
    with pytest.raises(ValueError, match="a sibling context needs the knob exclude_self"):
        Method(name="x", family="cpo", summary="", policy="shaped", advantage=print, context="successful_sibling")
    with pytest.raises(ValueError, match="alias 'old' names no knob 'new'"):
        Method(
            name="x",
            family="sdpo",
            summary="",
            policy="shaped",
            advantage=print,
            knobs=SDPOKnobs,
            aliases={"old": "new"},
        )
    # A shaped advantage and a distillation term together are one declaration now (a hybrid).
    hybrid = Method(
        name="x", family="cpo", summary="", policy="shaped", advantage=print, distillation=Distillation(print)
    )
    assert hybrid.weights(None) == (1.0, 1.0) and hybrid.topk(None) == 0


def test_each_default_is_written_once_and_the_composed_block_is_the_dataclass():
    recipe_yaml = yaml.safe_load((CONFIG_DIR / f"{CONFIG_NAME}.yaml").read_text())
    assert "cpo" not in recipe_yaml and "cpo_defaults" in recipe_yaml["defaults"]
    composed = OmegaConf.to_container(compose_cpo().cpo, resolve=True)
    assert composed == config_defaults()
    assert CPOConfig.from_config(composed) == CPOConfig()
    assert set(composed) >= {"rlsd", "opsd", "sdpo"} and "opsd_token" not in composed  # a block per method with knobs
    assert all(
        f.metadata.get("help")
        for cls in (CPOConfig, *[m.knobs for m in METHODS.values() if m.knobs])
        for f in dataclasses.fields(cls)
        if f.init
    )


def test_a_renamed_key_is_an_alias_that_says_what_replaced_it(capsys):
    assert translate_alias_overrides(["cpo.rlsd_lambda=0.3", "+cpo.rlsd_clip=0.1", "cpo.neg_alpha=1"]) == [
        "cpo.rlsd.mix_lambda=0.3",
        "+cpo.rlsd.clip=0.1",
        "cpo.neg_alpha=1",
    ]
    assert "cpo.rlsd_lambda is now cpo.rlsd.mix_lambda" in capsys.readouterr().out
    assert CPOConfig.from_config({"method": "rlsd", "rlsd_lambda_decay_steps": 0}).rlsd.lambda_decay_steps == 0
    assert "cpo.rlsd_lambda_decay_steps is now cpo.rlsd.lambda_decay_steps" in capsys.readouterr().out
    config = compose_cpo(*check_cpo_overrides(["cpo.method=rlsd", "cpo.rlsd_lambda=0.25"]))
    assert CPOConfig.from_config(config.cpo).rlsd.mix_lambda == 0.25


def test_selecting_a_method_applies_its_published_run_settings_and_the_user_wins():
    config = compose_cpo("cpo.method=opsd", "actor_rollout_ref.rollout.top_k=5")
    applied, kept = apply_method_run_settings(config, ["cpo.method=opsd", "actor_rollout_ref.rollout.top_k=5"])
    rollout = config.actor_rollout_ref.rollout
    assert (rollout.temperature, rollout.top_p, rollout.top_k) == (1.1, 0.95, 5)  # top_k: the user's
    assert "actor_rollout_ref.rollout.top_k=20" not in applied and "actor_rollout_ref.rollout.top_p=0.95" in applied
    assert kept == ["actor_rollout_ref.rollout.top_k=20"]
    assert config.actor_rollout_ref.actor.ppo_mini_batch_size == config.data.train_batch_size
    assert config.actor_rollout_ref.actor.kl_loss_coef == 0
    rlsd = compose_cpo("cpo.method=rlsd")
    apply_method_run_settings(rlsd, [])
    assert (rlsd.actor_rollout_ref.actor.clip_ratio_high, rlsd.actor_rollout_ref.actor.ppo_mini_batch_size) == (
        0.28,
        rlsd.data.train_batch_size,
    )
    plain = compose_cpo()
    assert apply_method_run_settings(plain, []) == ([], []) and plain == compose_cpo()
    grpo = compose_cpo("algorithm.adv_estimator=grpo", "cpo.method=opsd")
    assert apply_method_run_settings(grpo, []) == ([], [])


@pytest.mark.parametrize(
    "module",
    [
        "config.py",
        "trainer/ray_trainer.py",
        "trainer/preflight.py",
        "methods/loss.py",
        "teacher/weights.py",
        "teacher/contexts.py",
        "reports/credit_dump.py",
        "main_cpo.py",
        "experiments/cpo_vs_grpo.py",
        "../../treetune_scripts/experiments/cpo_vs_grpo.py",
    ],
)
def test_the_consumers_never_name_a_method(module):
    """No string literal of the config, the trainer, the preflight, the loss or the experiment is a method's name
    (docstrings and comments aside): what they do comes from the method's declaration."""
    tree = ast.parse((RECIPE / module).read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    names = set(all_methods())
    named = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and (node.value in names or re.fullmatch(r"(cpo:)?(rlsd|opsd|opsd_token|sdpo)(_.*)?", node.value))
    ]
    # The one name allowed: the selector's default, cpo.method = seq_kl (the reference's main run).
    allowed = ["seq_kl"] if module == "config.py" else []
    assert named == allowed, f"{module} names {named}"


@pytest.mark.parametrize(("method", "top_k"), [("opsd", 0), ("opsd", 50), ("sdpo", 100)])
def test_the_launch_shape_starts_when_the_longest_teacher_row_fits_the_update_token_budget(tmp_path, method, top_k):
    """At the 8B launch shape (1024 prompts x 8 x 16384 tokens, Qwen3's 151936 ids) the top-k tensors no longer pass
    through the driver, so OPSD's published whole-vocabulary JSD starts; what limits a run is the longest teacher row
    in the update's micro-batch: the gold-solution hint's 2048 + 512 + 16384 = 18944 tokens fit the script's budget of
    20000, SDPO's sibling context (a whole response: 2048 + 16384 + 512, then the response) needs 35328."""
    from treetune_recipe.cpo.config import CPOConfig
    from treetune_recipe.cpo.trainer.preflight import check_teacher_token_budget

    (tmp_path / "config.json").write_text('{"vocab_size": 151936}')
    shape = (
        f"cpo.method={method}",
        f"cpo.{method}.top_k={top_k}",
        f"actor_rollout_ref.model.path={tmp_path}",
        "data.train_batch_size=1024",
        "actor_rollout_ref.rollout.n=8",
        "data.max_prompt_length=2048",
        "data.max_response_length=16384",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
    )
    config = compose_cpo(*shape, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20000")
    cpo_config = CPOConfig.from_config(config.cpo)
    if method == "opsd":
        check_teacher_token_budget(config, cpo_config)
        return
    with pytest.raises(PreflightError) as stopped:
        check_teacher_token_budget(config, cpo_config)
    message = str(stopped.value)
    assert "35328 tokens" in message and "ppo_max_token_len_per_gpu=35328 or more" in message and "\n" not in message
    raised = compose_cpo(*shape, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=35328")
    check_teacher_token_budget(raised, CPOConfig.from_config(raised.cpo))


def test_a_distribution_level_method_needs_the_logits_hook_of_verl_0_9():
    opsd = compose_cpo("cpo.method=opsd")
    if verl_is("0.7.1"):
        with pytest.raises(PreflightError) as stopped:
            check_cpo_config(opsd)
        assert "cpo.method=opsd reads the student's logits in the update" in str(stopped.value) and "verl 0.9" in str(
            stopped.value
        )
        assert "\n" not in str(stopped.value)
    else:
        check_cpo_config(opsd)
        with pytest.raises(PreflightError, match="use_fused_kernels=false"):
            check_cpo_config(compose_cpo("cpo.method=sdpo", "actor_rollout_ref.model.use_fused_kernels=true"))
    check_cpo_config(compose_cpo("cpo.method=opsd_token"))  # the sampled-token form runs on both releases


class _TrainerState:
    """What ``RayCPOTrainer``'s reference-pass decision reads: the run config and its ``CPOConfig``."""

    def __init__(self, config):
        from treetune_recipe.cpo.config import CPOConfig

        self.config, self.cpo_config = config, CPOConfig.from_config(config.cpo)


@pytest.mark.parametrize("method", ["rlsd", "opsd", "opsd_token", "sdpo"])
def test_no_reference_pass_runs_at_a_peers_published_settings(method):
    """Every peer publishes a KL loss of weight 0: nothing reads verl's reference log-probs, so the trainer skips the
    pass (its teacher on the reference worker is scored by passes of its own, or inside the update). Controls: the
    recipe's default KL weight, a KL penalty in the reward, and ``cpo.drift_metrics`` each keep the pass."""
    from treetune_recipe.cpo.trainer.ray_trainer import RayCPOTrainer

    def reads(*overrides):
        config = compose_cpo(f"cpo.method={method}", *overrides)
        apply_method_run_settings(config, [f"cpo.method={method}", *overrides])
        return RayCPOTrainer._reference_log_probs_read(_TrainerState(config))

    assert compose_cpo().actor_rollout_ref.actor.use_kl_loss  # the reference worker exists (it holds the teacher)
    assert not reads()
    assert reads("actor_rollout_ref.actor.kl_loss_coef=0.001")
    assert reads("algorithm.use_kl_in_reward=true")
    assert reads("cpo.drift_metrics=true")


def test_a_skipped_reference_pass_adds_no_key_and_still_moves_the_teacher(monkeypatch):
    """The skipped pass returns an empty table of the batch's rows (``fit`` unions it: no ``ref_log_prob``), after the
    teacher took the actor's weights when due; verl's pass itself never runs."""
    import torch
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from treetune_recipe.cpo.trainer.ray_trainer import RayCPOTrainer

    moved, verl_passes = [], []
    monkeypatch.setattr(RayPPOTrainer, "_compute_ref_log_prob", lambda self, batch: verl_passes.append(len(batch)))
    trainer = object.__new__(RayCPOTrainer)
    config = compose_cpo("cpo.method=sdpo")
    apply_method_run_settings(config, ["cpo.method=sdpo"])  # the published KL weight 0
    state = _TrainerState(config)
    trainer.config, trainer.cpo_config, trainer.cpo_enabled = state.config, state.cpo_config, True
    trainer.teacher = type("Teacher", (), {"before_reference_pass": lambda self, step, group: moved.append(step)})()
    trainer.global_steps, trainer.actor_rollout_wg = 3, None
    batch = DataProto.from_dict(tensors={"responses": torch.zeros(4, 2, dtype=torch.long)})
    added = trainer._compute_ref_log_prob(batch)
    assert len(added) == 4 and list(added.batch.keys()) == [] and moved == [3] and verl_passes == []
    assert "ref_log_prob" not in batch.union(added).batch.keys()
    trainer.config.actor_rollout_ref.actor.kl_loss_coef = 0.001  # control: a KL term reads it, verl's pass runs
    trainer._compute_ref_log_prob(batch)
    assert verl_passes == [4] and moved == [3, 3]
