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
"""The run-health guard (``treetune_verl.rollout_health``): decisions, metrics, config checks and the trainer mixin.

No Ray: the mixin runs on a stand-in trainer whose old-log-prob pass and actor update are plain methods.
"""

import dataclasses
import logging

import pytest
import torch
import yaml
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.utils.debug.metrics import calculate_debug_metrics

from treetune_verl.rollout_health import (
    CHECKED_METRIC,
    CONFIG_DEFAULTS_NODE,
    CONSECUTIVE_WARNINGS_METRIC,
    KL_METRIC,
    PROBS_DIFF_METRIC,
    WARNING_METRIC,
    HealthStatus,
    RolloutHealthConfig,
    RolloutHealthMixin,
    RolloutHealthMonitor,
    RolloutMismatchError,
    enforce,
    mismatch_metrics,
    truncated_sampling,
)

HEALTHY = {KL_METRIC: 0.001, PROBS_DIFF_METRIC: 0.003}
SPIKE = {KL_METRIC: 0.05, PROBS_DIFF_METRIC: 0.004}  # above warn_kl only
BROKEN = {KL_METRIC: 2.95, PROBS_DIFF_METRIC: 0.39}  # the masked-context bug on CPU
METRICS = (KL_METRIC, PROBS_DIFF_METRIC)
CAUSES = (
    "#6278",
    "position ids",
    "stale weights",
    "weight sync",
    "chat template",
    "tokenization",
    "dtype",
    "temperature",
)


def statuses(monitor, sequence):
    return [monitor.check(metrics, step).status for step, metrics in enumerate(sequence, start=1)]


# ---------------------------------------------------------------------------------------------------------- decision


def test_healthy_steps_are_ok_and_say_nothing():
    monitor = RolloutHealthMonitor()
    decisions = [monitor.check(HEALTHY, step) for step in range(1, 11)]
    assert {decision.status for decision in decisions} == {HealthStatus.OK}
    assert all(decision.message == "" and decision.consecutive_warnings == 0 for decision in decisions)


def test_one_spike_above_warn_warns_naming_step_values_thresholds_and_causes(capsys, caplog):
    monitor = RolloutHealthMonitor()
    monitor.check(HEALTHY, 1)
    decision = monitor.check(SPIKE, 2)
    assert decision.status is HealthStatus.WARN and decision.consecutive_warnings == 1
    message = decision.message
    assert "step 2" in message and "rollout_corr/kl=0.05" in message and "warn_kl=0.01" in message
    assert "training/rollout_probs_diff_mean=0.004" in message and "warn_probs_diff=0.02" in message
    for cause in CAUSES:
        assert cause in message, cause
    assert "\n" not in message

    with caplog.at_level(logging.WARNING, logger="treetune_verl.rollout_health"):
        assert enforce(decision) is decision  # a warning does not stop
    assert message in capsys.readouterr().out
    assert [record.getMessage() for record in caplog.records] == [message]


def test_a_value_above_stop_stops_with_how_to_disable_the_guard():
    monitor = RolloutHealthMonitor()
    decision = monitor.check(BROKEN, 1)
    assert decision.status is HealthStatus.STOP
    assert "step 1" in decision.message and "rollout_corr/kl above stop_kl" in decision.message
    with pytest.raises(RolloutMismatchError) as raised:
        enforce(decision)
    text = str(raised.value)
    assert "rollout_corr/kl=2.95" in text and "stop_kl=1" in text
    assert "treetune.rollout_health.enabled=false" in text and "treetune.rollout_health.stop_kl" in text
    for cause in CAUSES:
        assert cause in text, cause


@pytest.mark.parametrize("metric", [KL_METRIC, PROBS_DIFF_METRIC])
def test_each_metric_alone_can_stop(metric):
    values = {KL_METRIC: 2.0, PROBS_DIFF_METRIC: 0.3}
    assert RolloutHealthMonitor().check({metric: values[metric]}, 1).status is HealthStatus.STOP


def test_n_consecutive_warnings_stop_and_a_healthy_step_resets_the_count():
    config = RolloutHealthConfig(max_consecutive_warnings=3)
    assert statuses(RolloutHealthMonitor(config), [SPIKE, SPIKE, SPIKE]) == ["warn", "warn", "stop"]

    monitor = RolloutHealthMonitor(config)
    assert statuses(monitor, [SPIKE, SPIKE, HEALTHY, SPIKE, SPIKE]) == ["warn", "warn", "ok", "warn", "warn"]
    assert monitor.consecutive_warnings == 2
    decision = monitor.check(SPIKE, 6)
    assert decision.status is HealthStatus.STOP and decision.consecutive_warnings == 3
    assert "3 warning steps in a row (max_consecutive_warnings=3)" in decision.message


@pytest.mark.parametrize("limit", [0, None])
def test_zero_or_null_max_consecutive_warnings_never_stops_on_warnings(limit):
    monitor = RolloutHealthMonitor(RolloutHealthConfig(max_consecutive_warnings=limit))
    assert set(statuses(monitor, [SPIKE] * 20)) == {"warn"}
    assert monitor.consecutive_warnings == 20


def test_default_stops_at_the_fifth_warning_step_in_a_row():
    assert statuses(RolloutHealthMonitor(), [SPIKE] * 5) == ["warn"] * 4 + ["stop"]


def test_on_an_uncalibrated_device_warnings_never_stop_but_stop_thresholds_still_do():
    config = RolloutHealthConfig(max_consecutive_warnings=3, calibrated_devices=["cpu"])
    assert config.on_device("cpu") == config
    monitor = RolloutHealthMonitor(config.on_device("cuda"))
    assert set(statuses(monitor, [SPIKE] * 10)) == {"warn"} and monitor.consecutive_warnings == 10
    assert monitor.check(BROKEN, 11).status is HealthStatus.STOP
    assert statuses(RolloutHealthMonitor(config.on_device("cpu")), [SPIKE] * 3) == ["warn", "warn", "stop"]


@pytest.mark.parametrize("devices", ["cpu", [1], None])
def test_calibrated_devices_must_be_a_list_of_names(devices):
    with pytest.raises(ValueError, match="calibrated_devices"):
        RolloutHealthConfig(calibrated_devices=devices)


def test_disabled_guard_decides_nothing():
    monitor = RolloutHealthMonitor(RolloutHealthConfig(enabled=False))
    decisions = [monitor.check(metrics, step) for step, metrics in enumerate([BROKEN] * 10, start=1)]
    assert {decision.status for decision in decisions} == {HealthStatus.SKIPPED}
    assert all(enforce(decision) is decision for decision in decisions)  # never raises


def test_negative_kl_counts_by_its_size_and_non_finite_values_stop():
    monitor = RolloutHealthMonitor()
    assert monitor.check({KL_METRIC: -0.05}, 1).status is HealthStatus.WARN
    assert monitor.check({KL_METRIC: -3.0}, 2).status is HealthStatus.STOP
    for value in (float("nan"), float("inf")):
        decision = RolloutHealthMonitor().check({KL_METRIC: 0.0, PROBS_DIFF_METRIC: value}, 1)
        assert decision.status is HealthStatus.STOP and "is not finite" in decision.message


def test_null_threshold_is_off_and_missing_metrics_skip_the_step_keeping_the_count():
    monitor = RolloutHealthMonitor(RolloutHealthConfig(stop_kl=None, max_consecutive_warnings=2))
    assert monitor.check({KL_METRIC: 50.0}, 1).status is HealthStatus.WARN  # no stop threshold for the KL
    skipped = monitor.check({"actor/pg_loss": 1.0}, 2)
    assert skipped.status is HealthStatus.SKIPPED and skipped.consecutive_warnings == 1
    assert monitor.check({KL_METRIC: 50.0}, 3).status is HealthStatus.STOP  # second warning step in a row


def test_decision_metrics():
    monitor = RolloutHealthMonitor()
    assert monitor.check(HEALTHY, 1).metrics() == {
        CHECKED_METRIC: 1.0,
        WARNING_METRIC: 0.0,
        CONSECUTIVE_WARNINGS_METRIC: 0.0,
    }
    monitor.check(SPIKE, 2)
    assert monitor.check(SPIKE, 3).metrics() == {
        CHECKED_METRIC: 1.0,
        WARNING_METRIC: 1.0,
        CONSECUTIVE_WARNINGS_METRIC: 2.0,
    }
    assert monitor.check({}, 4).metrics()[CHECKED_METRIC] == 0.0


# ----------------------------------------------------------------------------------------------------------- metrics


def synthetic_batch(seed=0, rows=6, width=12, noise=0.3, shift=0.0, with_rollout=True) -> DataProto:
    """Rows with different response lengths: responses [B, T], response_mask [B, T], trainer and rollout log-probs.

    The rollout's log-probs are the trainer's plus ``shift`` plus Gaussian noise of scale ``noise``, at most 0.
    """
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([width, 1, 5, width - 3, 7, 2][:rows])
    response_mask = (torch.arange(width)[None, :] < lengths[:, None]).to(torch.int64)
    old_log_probs = -torch.rand(rows, width, generator=generator) * 4
    rollout_log_probs = old_log_probs + shift + noise * torch.randn(rows, width, generator=generator)
    tensors = {
        "responses": torch.randint(3, 100, (rows, width), generator=generator),
        "response_mask": response_mask,
        "old_log_probs": old_log_probs * response_mask,
    }
    if with_rollout:
        tensors["rollout_log_probs"] = (rollout_log_probs * response_mask).clamp(max=0)
    return DataProto.from_dict(tensors=tensors)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_equal_the_ones_fit_logs(seed):
    batch = synthetic_batch(seed)
    ours = mismatch_metrics(batch)
    # What RayPPOTrainer.fit logs for this batch: calculate_debug_metrics after the old-log-prob pass, and the
    # rollout_corr/ metrics of compute_rollout_correction_and_add_to_batch with verl's default rollout_correction.
    logged_diff = calculate_debug_metrics(batch)[PROBS_DIFF_METRIC]
    _, corr = compute_rollout_correction_and_add_to_batch(
        batch, OmegaConf.create({"rollout_is": None, "rollout_rs": None, "bypass_mode": False})
    )
    torch.testing.assert_close(torch.tensor(ours[KL_METRIC]), torch.tensor(corr[KL_METRIC]), rtol=0, atol=0)
    torch.testing.assert_close(torch.tensor(ours[PROBS_DIFF_METRIC]), torch.tensor(logged_diff), rtol=0, atol=0)
    # and they are what their names say, over the valid tokens only
    valid = batch.batch["response_mask"].bool()
    rollout, old = batch.batch["rollout_log_probs"][valid], batch.batch["old_log_probs"][valid]
    torch.testing.assert_close(torch.tensor(ours[KL_METRIC]), (rollout - old).mean())
    torch.testing.assert_close(torch.tensor(ours[PROBS_DIFF_METRIC]), (rollout.exp() - old.exp()).abs().mean())


def test_no_metrics_without_rollout_log_probs():
    assert mismatch_metrics(synthetic_batch(with_rollout=False)) is None


# ------------------------------------------------------------------------------------------------------------ config


#: Per-step (rollout_corr/kl, training/rollout_probs_diff_mean) of measured CPU runs (verl 0.9.1;
#: agent-docs/cpo-recipe.md, "Rollout engines on CPU"). Healthy: the demo (warm start, 30 steps; the largest |kl| and
#: probs diff of each run), and 3-step GRPO runs of the context-sensitive model at lr 1e-2 with 8 or 32 responses per
#: step, and a 2-step CPO run.
HEALTHY_RUNS = {
    "demo, hf": [(-1.59e-3, 3.4e-3)],
    "demo, vLLM fp32": [(-1.02e-3, 3.3e-3)],
    "demo, vLLM bf16": [(-1.54e-3, 3.2e-3)],
    "GRPO lr 1e-2, 8 responses, hf": [(2.7e-3, 5.8e-3), (-2.7e-3, 7.3e-3), (1e-4, 9.2e-3)],
    "GRPO lr 1e-2, 8 responses, vLLM fp32": [(3.6e-3, 6.7e-3), (0.0, 7.5e-3), (3.2e-3, 8.0e-3)],
    "GRPO lr 1e-2, 8 responses, vLLM fp32, rerun": [(3e-4, 6.39e-3), (-7.9e-3, 8.16e-3), (8.84e-3, 7.98e-3)],
    "GRPO lr 1e-2, 8 responses, vLLM bf16": [(-3.7e-3, 5.68e-3), (4.79e-3, 9.03e-3), (6.1e-4, 8.18e-3)],
    "GRPO lr 1e-2, 32 responses, vLLM fp32": [(2.53e-3, 7.31e-3), (4.1e-4, 8.16e-3), (3.6e-4, 8.54e-3)],
    "CPO lr 1e-2, vLLM fp32": [(1.55e-3, 7.17e-3), (1.34e-3, 6.68e-3)],
}
#: Broken runs, as measured (each stays broken: its last step repeats until the run would end).
BROKEN_RUNS = {
    "trainer over the padded vocabulary, 8 responses": [(2.78e-2, 1.10e-2), (3.37e-2, 1.28e-2), (4.82e-2, 1.24e-2)],
    "trainer over the padded vocabulary, 32 responses": [(4.84e-2, 1.17e-2), (3.59e-2, 1.31e-2), (4.45e-2, 1.18e-2)],
    "trainer over the padded vocabulary, 32 responses (2)": [(4.18e-2, 1.18e-2), (2.48e-2, 1.04e-2), (2.08e-2, 9.0e-3)],
    "stale rollout weights, 8 responses": [(1.73e-3, 6.25e-3), (0.873, 0.154), (2.147, 0.189)],
    "stale rollout weights, 32 responses": [(7.2e-4, 6.92e-3), (2.415, 0.211), (4.454, 0.261)],
    "trainer forward without its context (rms_norm_eps=100)": [(4.22, 0.28)],
}


@pytest.mark.parametrize("run", sorted(HEALTHY_RUNS))
def test_default_thresholds_never_warn_on_a_measured_healthy_run(run):
    assert set(statuses(RolloutHealthMonitor(), [dict(zip(METRICS, step)) for step in HEALTHY_RUNS[run]])) == {"ok"}


@pytest.mark.parametrize("run", sorted(BROKEN_RUNS))
def test_default_thresholds_stop_every_measured_broken_run(run):
    steps = [dict(zip(METRICS, step)) for step in BROKEN_RUNS[run]]
    steps += [steps[-1]] * (RolloutHealthConfig().max_consecutive_warnings - 1)
    seen = statuses(RolloutHealthMonitor(), steps)
    assert "stop" in seen, seen
    first_alarm = next(i for i, status in enumerate(seen) if status != "ok")
    assert "ok" not in seen[first_alarm:], seen  # once broken, never reported healthy again


def test_the_recipe_config_composes_the_dataclass_defaults_and_an_override_wins():
    from hydra import compose, initialize_config_dir

    import treetune_recipe.cpo.config  # noqa: F401  (registers the defaults nodes the recipe config lists)
    from treetune_recipe.cpo import CONFIG_DIR, CONFIG_NAME

    recipe = yaml.safe_load((CONFIG_DIR / f"{CONFIG_NAME}.yaml").read_text())
    assert "treetune" not in recipe and CONFIG_DEFAULTS_NODE in recipe["defaults"]  # written once, in the dataclass
    expected = dataclasses.asdict(RolloutHealthConfig())
    expected["calibrated_devices"] = list(expected["calibrated_devices"])
    override = ["treetune.rollout_health.stop_kl=0.5", "treetune.rollout_health.calibrated_devices=[cpu,cuda]"]
    for platform in ([], ["platform=cpu"]):
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            composed = compose(CONFIG_NAME, overrides=platform)
            overridden = compose(CONFIG_NAME, overrides=[*platform, *override])
        assert OmegaConf.to_container(composed.treetune.rollout_health, resolve=True) == expected, platform
        assert RolloutHealthConfig.from_run_config(composed) == RolloutHealthConfig()
        assert RolloutHealthConfig.from_run_config(overridden) == RolloutHealthConfig(
            stop_kl=0.5, calibrated_devices=("cpu", "cuda")
        )


def test_a_config_without_the_block_gets_the_defaults_and_the_block_is_read():
    assert RolloutHealthConfig.from_run_config(OmegaConf.create({"trainer": {}})) == RolloutHealthConfig()
    assert RolloutHealthConfig.from_run_config(OmegaConf.create({"treetune": {}})) == RolloutHealthConfig()
    config = OmegaConf.create({"treetune": {"rollout_health": {"stop_kl": 0.5, "max_consecutive_warnings": None}}})
    assert RolloutHealthConfig.from_run_config(config) == RolloutHealthConfig(
        stop_kl=0.5, max_consecutive_warnings=None
    )


BAD_BLOCKS = {
    "negative threshold": ({"warn_kl": -0.1}, "treetune.rollout_health.warn_kl=-0.1: a threshold must be a finite"),
    "warn above stop": ({"warn_probs_diff": 0.5}, "warn_probs_diff=0.5 is above treetune.rollout_health.stop_probs"),
    "not a number": ({"stop_kl": "high"}, "treetune.rollout_health.stop_kl must be a number or null, got 'high'"),
    "infinite": ({"stop_kl": float("inf")}, "treetune.rollout_health.stop_kl=inf"),
    "negative count": ({"max_consecutive_warnings": -1}, "max_consecutive_warnings=-1 must be an integer >= 0"),
    "fractional count": (
        {"max_consecutive_warnings": 2.5},
        "max_consecutive_warnings must be an integer or null, got 2.5",
    ),
    "enabled not a bool": ({"enabled": "yes"}, "treetune.rollout_health.enabled must be true or false"),
}


@pytest.mark.parametrize("case", BAD_BLOCKS)
def test_invalid_blocks_fail_naming_the_key_and_the_fix(case):
    block, expected = BAD_BLOCKS[case]
    with pytest.raises(ValueError, match="invalid treetune.rollout_health config") as raised:
        RolloutHealthConfig.from_run_config({"treetune": {"rollout_health": block}})
    assert expected in str(raised.value)
    assert str(raised.value).count("\n  - ") == 1


def test_an_unknown_key_fails_in_one_line_naming_the_valid_keys():
    with pytest.raises(ValueError) as raised:
        RolloutHealthConfig.from_run_config({"treetune": {"rollout_health": {"warn_kls": 0.1, "stop_kl": -1}}})
    assert str(raised.value) == (
        "Unknown treetune.rollout_health key(s) ['warn_kls']; valid keys: enabled, warn_kl, warn_probs_diff, stop_kl, "
        "stop_probs_diff, max_consecutive_warnings, calibrated_devices."
    )


def test_every_problem_is_listed_at_once():
    block = {"warn_kl": -1, "warn_probs_diff": 0.5, "max_consecutive_warnings": True}
    with pytest.raises(ValueError) as raised:
        RolloutHealthConfig.from_config(block)
    assert str(raised.value).count("\n  - ") == 3


# ------------------------------------------------------------------------------------------------------------- mixin


class StandInTrainer:
    """What the mixin needs of ``RayPPOTrainer``: config, global_steps, the old-log-prob pass, the actor update."""

    def __init__(self, config):
        self.config = config
        self.old_log_probs: torch.Tensor | None = None
        self.updates = 0

    def _compute_old_log_prob(self, batch):
        return DataProto.from_dict(tensors={"old_log_probs": self.old_log_probs}), 0.0

    def _update_actor(self, batch):
        self.updates += 1
        return DataProto.from_single_dict(data={}, meta_info={"metrics": {"actor/pg_loss": 0.5}})


class GuardedTrainer(RolloutHealthMixin, StandInTrainer):
    pass


def make_guarded(device: str = "cpu", **block) -> GuardedTrainer:
    config = {"trainer": {"device": device}}
    if block:
        config["treetune"] = {"rollout_health": block}
    return GuardedTrainer(OmegaConf.create(config))


def run_step(trainer, step, batch):
    """What fit does with the trainer: old-log-prob pass (the trainer's log-probs are the batch's), then the update."""
    trainer.global_steps = step
    trainer.old_log_probs = batch.batch["old_log_probs"]
    rollout_batch = DataProto.from_dict(tensors={k: v for k, v in batch.batch.items() if k != "old_log_probs"})
    trainer._compute_old_log_prob(rollout_batch)
    return trainer._update_actor(batch).meta_info["metrics"]


def test_mixin_checks_after_the_old_log_prob_pass_and_reports_metrics(capsys):
    trainer = make_guarded(max_consecutive_warnings=2)
    metrics = run_step(trainer, 1, synthetic_batch(noise=0.0))
    assert metrics == {"actor/pg_loss": 0.5, CHECKED_METRIC: 1.0, WARNING_METRIC: 0.0, CONSECUTIVE_WARNINGS_METRIC: 0.0}
    metrics = run_step(trainer, 2, synthetic_batch(noise=0.0, shift=0.05))
    assert metrics[WARNING_METRIC] == 1.0 and metrics[CONSECUTIVE_WARNINGS_METRIC] == 1.0
    assert "rollout health WARNING at step 2" in capsys.readouterr().out
    with pytest.raises(RolloutMismatchError, match="at step 3"):
        run_step(trainer, 3, synthetic_batch(noise=0.0, shift=0.05))
    assert trainer.updates == 2  # the stopped step never reached the update


def test_mixin_stops_a_broken_step_before_the_update():
    trainer = make_guarded()
    with pytest.raises(RolloutMismatchError, match="rollout health STOP at step 1"):
        run_step(trainer, 1, synthetic_batch(noise=0.0, shift=3.0))
    assert trainer.updates == 0


def test_mixin_checks_only_the_first_old_log_prob_pass_of_a_step():
    trainer = make_guarded(max_consecutive_warnings=2)
    batch = synthetic_batch(noise=0.0, shift=0.05)
    run_step(trainer, 1, batch)
    trainer._compute_old_log_prob(batch)  # a second call in the same step (recipe passes use score_batch instead)
    assert trainer.rollout_health.consecutive_warnings == 1


def test_mixin_skips_cleanly_without_rollout_log_probs(capsys):
    trainer = make_guarded()
    for step in (1, 2):
        metrics = run_step(trainer, step, synthetic_batch(with_rollout=False))
        assert metrics[CHECKED_METRIC] == 0.0 and metrics[WARNING_METRIC] == 0.0
    out = capsys.readouterr().out
    assert out.count("actor_rollout_ref.rollout.calculate_log_probs=true") == 1  # said once per run


def test_mixin_reports_a_step_without_old_log_prob_pass_as_unchecked(capsys):
    trainer = make_guarded()
    trainer.global_steps = 1
    metrics = trainer._update_actor(synthetic_batch())  # bypass mode: fit runs no old-log-prob pass
    assert metrics.meta_info["metrics"][CHECKED_METRIC] == 0.0
    assert "bypass_mode" in capsys.readouterr().out


def test_mixin_on_a_gpu_warns_without_stopping_and_says_why(capsys):
    trainer = make_guarded(device="cuda", max_consecutive_warnings=2)
    assert "is not in treetune.rollout_health.calibrated_devices" in capsys.readouterr().out
    assert trainer.rollout_health.config.max_consecutive_warnings is None


def test_disabled_mixin_never_stops(capsys):
    trainer = make_guarded(enabled=False)
    metrics = run_step(trainer, 1, synthetic_batch(noise=0.0, shift=3.0))
    assert metrics[CHECKED_METRIC] == 0.0 and trainer.updates == 1
    assert "treetune.rollout_health.enabled=false" in capsys.readouterr().out


def test_mixin_rejects_an_invalid_block_when_the_trainer_is_built():
    with pytest.raises(ValueError, match="stop_kl"):
        make_guarded(stop_kl=-1)


@pytest.mark.parametrize(
    ("rollout", "said"), [({"top_k": 20, "top_p": 0.95}, "top_k=20, top_p=0.95"), ({"top_p": 0.9}, "top_p=0.9")]
)
def test_truncated_sampling_is_logged_but_never_stops_and_says_why(capsys, rollout, said):
    # The rollout's log-probs are of the truncated distribution it sampled (verl's processed_logprobs), the trainer's
    # of the whole one: their mismatch is the truncation's, whatever it shows.
    config = OmegaConf.create({"trainer": {"device": "cpu"}, "actor_rollout_ref": {"rollout": rollout}})
    trainer = GuardedTrainer(config)
    assert f"the rollout samples a truncated distribution ({said})" in capsys.readouterr().out
    metrics = run_step(trainer, 1, synthetic_batch(noise=0.0, shift=3.0))  # a step the guard stops untruncated
    assert metrics[WARNING_METRIC] == 1.0 and trainer.updates == 1
    # Control: the same step without truncation (top_k -1 and top_p 1 turn it off) stops.
    untruncated = OmegaConf.create(
        {"trainer": {"device": "cpu"}, "actor_rollout_ref": {"rollout": {"top_k": -1, "top_p": 1.0}}}
    )
    assert truncated_sampling(untruncated) == ""
    with pytest.raises(RolloutMismatchError):
        run_step(GuardedTrainer(untruncated), 1, synthetic_batch(noise=0.0, shift=3.0))
