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
"""Run-health guard: stop a run whose rollout and trainer disagree on the log-probs of the tokens they share.

verl logs two mismatch metrics at every step, computed on the same response tokens from the rollout server's
log-probs (``rollout_log_probs``, recorded while sampling) and the trainer's (``old_log_probs``, the actor's
old-log-prob pass):

- ``rollout_corr/kl`` (:data:`KL_METRIC`): masked mean of ``rollout_log_probs - old_log_probs`` over the valid
  tokens, a direct estimate of KL(rollout || trainer) in nats per token;
- ``training/rollout_probs_diff_mean`` (:data:`PROBS_DIFF_METRIC`): mean of ``|exp(old) - exp(rollout)|`` over the
  same tokens.

A healthy CPU run gives a KL of about 1e-8 on verl 0.9.1, where verl-cpu's profile has the trainer compute in fp32
like the rollout, and about 0.001 with a probs diff of a few thousandths on verl 0.7.1, whose trainer autocasts to
bf16. Runs that trained on wrong log-probs because of the upstream attention-mask bug (verl issue #6278, fixed here
by the ``no_padding_attention_mask`` patch) showed about 3 nats and 0.4, every step, and nothing read them. This
module reads them:

- :class:`RolloutHealthConfig` is the ``treetune.rollout_health`` block (thresholds; an invalid value fails at
  start-up, on the driver before Ray, in ``treetune_recipe.cpo.trainer.preflight.check_cpo_run``, and again when the
  trainer is built);
- :class:`RolloutHealthMonitor` is the pure decision: fed one metric dict per step, it answers ok / warn / stop
  (a value above a stop threshold, a non-finite value, or ``max_consecutive_warnings`` warning steps in a row);
- :class:`RolloutHealthMixin` plugs it into a ``RayPPOTrainer`` subclass (before it in the bases, like
  ``treetune_verl.checkpoint_saves.CompleteCheckpointsMixin``): it computes both metrics with verl's own functions
  (:func:`mismatch_metrics`, so they equal the logged values), prints and logs one line per warning step, raises
  :class:`RolloutMismatchError` on a stop, and adds ``treetune/rollout_health/*`` to the step's actor metrics.

**Where the check runs.** ``RayPPOTrainer.fit`` computes the two metrics into a local dict that no method can read,
so the mixin recomputes them from the batch. It does so in ``_compute_old_log_prob``, right after the old-log-prob
pass returns, rather than in ``_update_actor`` (the other seam that sees both log-probs), because there

1. it runs as early as the two log-probs exist: before the reference pass, the critic update (which ``fit`` runs
   *before* ``_update_actor``, so a guard there would let a broken step train the critic), the advantages and
   CPO's hinted pass; a broken step costs one rollout and one forward pass, and trains nothing;
2. it sees the ``response_mask`` verl's own metrics use: ``compute_rollout_correction_and_add_to_batch`` (rejection
   sampling, ``algorithm.rollout_correction.rollout_rs``) narrows the mask before ``_update_actor``, after the
   metrics were computed, so numbers computed there would differ from the logged ones;
3. it is skipped by ``fit`` exactly when the check is meaningless: in bypass mode
   (``algorithm.rollout_correction.bypass_mode=true``) ``old_log_probs`` *are* the rollout's log-probs;
4. it also runs during critic warm-up steps, which never call ``_update_actor``.

``fit`` calls ``_compute_old_log_prob`` once per step; a recipe's extra passes go through
``treetune_verl.rescoring.score_batch`` instead (CPO's hinted pass and credit dump do), and should one call it
again, only the first call of each ``global_steps`` is checked. ``_update_actor`` (both its CPO and its plain path in
``RayCPOTrainer`` end in the mixin's) only reports the step's verdict as metrics. A stop raises inside ``fit`` in the
TaskRunner actor; Ray re-raises it in the driver (``ray.get`` in verl's ``run_ppo``), whose Hydra main prints it and
exits with status 1.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from treetune_verl.config_block import dataclass_from_block, field_type_problems

logger = logging.getLogger(__name__)

#: verl's metric of KL(rollout || trainer), nats per token (``rollout_corr/`` metrics of ``fit``).
KL_METRIC = "rollout_corr/kl"
#: verl's mean absolute difference of the token probabilities (``calculate_debug_metrics``).
PROBS_DIFF_METRIC = "training/rollout_probs_diff_mean"
#: Where the block lives in the run config.
CONFIG_KEY = "treetune.rollout_health"
#: Metrics the mixin adds to each step's actor metrics.
CHECKED_METRIC = "treetune/rollout_health/checked"
WARNING_METRIC = "treetune/rollout_health/warning"
CONSECUTIVE_WARNINGS_METRIC = "treetune/rollout_health/consecutive_warnings"

LIKELY_CAUSES = (
    "the attention mask or position ids of the trainer's forward (e.g. verl issue #6278 with "
    "actor_rollout_ref.model.use_remove_padding=false)",
    "stale weights in the rollout server (weight sync from trainer to rollout)",
    "a chat template or tokenization that differs between rollout and trainer",
    "a dtype mismatch (bf16/fp16 vs fp32)",
    "a rollout temperature not applied to the trainer's log-probs",
)


class RolloutMismatchError(RuntimeError):
    """The rollout's and the trainer's log-probs of the same tokens disagree beyond the guard's stop thresholds."""


# ----------------------------------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class RolloutHealthConfig:
    """The ``treetune.rollout_health`` block.

    The field defaults below are the project's defaults, written once: a config without the block gets them, and the
    recipe's Hydra config composes them from the ``rollout_health_defaults`` node that :func:`register_config_defaults`
    stores from this dataclass. A metric crosses a threshold when its absolute value is strictly above it; a null
    threshold is off.

    Attributes:
        enabled: run the guard at all (false: never check; verl still logs the metrics).
        warn_kl: warn above this ``|rollout_corr/kl|`` (nats per token; healthy runs ~0.001, the masked-context bug
            ~3).
        warn_probs_diff: warn above this ``training/rollout_probs_diff_mean`` (healthy ~0.003, the bug ~0.4).
        stop_kl: stop at once above this ``|rollout_corr/kl|``.
        stop_probs_diff: stop at once above this ``training/rollout_probs_diff_mean``.
        max_consecutive_warnings: stop at the N-th warning step in a row (a healthy step resets the count); 0 or
            null = never.
        calibrated_devices: the ``trainer.device`` values whose rollout engines the warn thresholds were measured on
            (CPU: the ``hf`` rollout and vLLM's CPU build). On any other device a warning never stops a run, since
            the normal mismatch of its engines (bf16 vLLM or SGLang on a GPU) was never measured here: warning steps
            are counted and logged, and only ``stop_kl`` / ``stop_probs_diff`` stop the run.
    """

    enabled: bool = True
    warn_kl: float | None = 0.01
    warn_probs_diff: float | None = 0.02
    stop_kl: float | None = 1.0
    stop_probs_diff: float | None = 0.2
    max_consecutive_warnings: int | None = 5
    calibrated_devices: tuple[str, ...] = ("cpu",)

    def __post_init__(self):
        wrong_types = field_type_problems(self, CONFIG_KEY)
        # A value of the wrong type is reported once, by its type: its range is not checked (None).
        values = {
            field_.name: None if field_.name in wrong_types else getattr(self, field_.name) for field_ in fields(self)
        }
        problems = [*wrong_types.values(), *_value_problems(values)]
        if problems:
            raise ValueError(_format_problems(problems))

    def on_device(self, device: str) -> RolloutHealthConfig:
        """The thresholds in force on ``device``: without a calibration there, warnings never stop the run."""
        if device in self.calibrated_devices:
            return self
        return replace(self, max_consecutive_warnings=None)

    @classmethod
    def from_config(cls, block: Mapping[str, Any] | None) -> RolloutHealthConfig:
        """Build from the ``treetune.rollout_health`` block (DictConfig, mapping, or None: all defaults).

        Raises:
            ValueError: one line on unknown keys (naming the valid ones), else listing every invalid value.
        """
        return dataclass_from_block(cls, block, CONFIG_KEY)

    @classmethod
    def from_run_config(cls, config: Any) -> RolloutHealthConfig:
        """The block of a whole run config, read with ``config.get``: a config without it gets the defaults."""
        return cls.from_config(_run_config_block(config))


_DEFAULTS = {field_.name: field_.default for field_ in fields(RolloutHealthConfig)}
#: The Hydra ConfigStore node of the block's defaults (:func:`register_config_defaults`).
CONFIG_DEFAULTS_NODE = "rollout_health_defaults"


def config_defaults() -> dict[str, Any]:
    """The block's defaults as plain config values (a tuple as a list), as a composed config holds them."""
    return {name: list(value) if isinstance(value, tuple) else value for name, value in _DEFAULTS.items()}


def register_config_defaults() -> None:
    """Store the block's defaults in Hydra's ConfigStore as :data:`CONFIG_DEFAULTS_NODE`, at
    ``treetune.rollout_health``, for a config to list in its defaults (``cpo_trainer.yaml`` does;
    ``treetune_recipe.cpo.config.register_config_defaults`` calls this)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=CONFIG_DEFAULTS_NODE, node={"treetune": {"rollout_health": config_defaults()}})


def _value_problems(values: Mapping[str, Any]) -> list[str]:
    """Every value out of range in a complete set of the block's values, each of its annotated type or None."""
    problems = []
    for name in ("warn_kl", "warn_probs_diff", "stop_kl", "stop_probs_diff"):
        value = values[name]
        if value is not None and not (math.isfinite(value) and value >= 0):
            problems.append(
                f"{CONFIG_KEY}.{name}={value!r}: a threshold must be a finite number >= 0 (or null to turn it off); "
                f"e.g. {CONFIG_KEY}.{name}={_DEFAULTS[name]}."
            )
    for metric in ("kl", "probs_diff"):
        warn, stop = values[f"warn_{metric}"], values[f"stop_{metric}"]
        if _is_finite(warn) and _is_finite(stop) and warn > stop:
            problems.append(
                f"{CONFIG_KEY}.warn_{metric}={warn} is above {CONFIG_KEY}.stop_{metric}={stop}: the run would stop "
                f"without ever warning. Set warn_{metric} <= stop_{metric} (defaults {_DEFAULTS[f'warn_{metric}']} "
                f"and {_DEFAULTS[f'stop_{metric}']})."
            )
    limit = values["max_consecutive_warnings"]
    if limit is not None and limit < 0:
        problems.append(
            f"{CONFIG_KEY}.max_consecutive_warnings={limit!r} must be an integer >= 0 (0 or null: never stop on "
            f"warnings alone); e.g. {CONFIG_KEY}.max_consecutive_warnings={_DEFAULTS['max_consecutive_warnings']}."
        )
    return problems


def _run_config_block(config: Any) -> Any:
    treetune = config.get("treetune") if config is not None else None
    return treetune.get("rollout_health") if treetune is not None else None


def _is_finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _format_problems(problems: list[str]) -> str:
    return f"invalid {CONFIG_KEY} config:\n" + "\n".join(f"  - {problem}" for problem in problems)


# --------------------------------------------------------------------------------------------------------- decision


class HealthStatus(str, enum.Enum):
    """Verdict of one step."""

    OK = "ok"
    WARN = "warn"
    STOP = "stop"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class HealthDecision:
    """What :meth:`RolloutHealthMonitor.check` decided for one step.

    Attributes:
        status: ok / warn / stop, or skipped (guard disabled, or neither metric available).
        step: the training step (``global_steps``).
        kl: the step's ``rollout_corr/kl`` (None when not available).
        probs_diff: the step's ``training/rollout_probs_diff_mean`` (None when not available).
        consecutive_warnings: warning steps in a row, this one included (0 after a healthy step).
        message: the line to print (warn, stop) or why the step was skipped; empty when ok.
    """

    status: HealthStatus
    step: int | None
    kl: float | None = None
    probs_diff: float | None = None
    consecutive_warnings: int = 0
    message: str = ""

    def metrics(self) -> dict[str, float]:
        """The ``treetune/rollout_health/*`` metrics of this step."""
        return {
            CHECKED_METRIC: float(self.status is not HealthStatus.SKIPPED),
            WARNING_METRIC: float(self.status in (HealthStatus.WARN, HealthStatus.STOP)),
            CONSECUTIVE_WARNINGS_METRIC: float(self.consecutive_warnings),
        }


class RolloutHealthMonitor:
    """Decides, step after step, whether the rollout-vs-trainer mismatch metrics are healthy.

    Pure apart from its counter of consecutive warning steps: no logging, no exception (see :func:`enforce`).

    Args:
        config: thresholds.
    """

    def __init__(self, config: RolloutHealthConfig | None = None):
        self.config = config if config is not None else RolloutHealthConfig()
        self.consecutive_warnings = 0

    def check(self, metrics: Mapping[str, float], step: int | None = None) -> HealthDecision:
        """The verdict of one step from its metrics (:data:`KL_METRIC`, :data:`PROBS_DIFF_METRIC`; others ignored).

        A value above a stop threshold, or a non-finite value, stops; a value above a warn threshold warns, and the
        ``max_consecutive_warnings``-th warning step in a row stops; a step with no value above any warn threshold
        resets the count. A metric missing from ``metrics`` is not checked; with neither, the step is skipped (the
        count is kept).
        """
        config = self.config
        kl, probs_diff = _as_float(metrics.get(KL_METRIC)), _as_float(metrics.get(PROBS_DIFF_METRIC))
        if not config.enabled:
            return HealthDecision(HealthStatus.SKIPPED, step, kl, probs_diff, self.consecutive_warnings, "disabled")
        if kl is None and probs_diff is None:
            return HealthDecision(
                HealthStatus.SKIPPED,
                step,
                consecutive_warnings=self.consecutive_warnings,
                message=f"no {KL_METRIC} or {PROBS_DIFF_METRIC} (no rollout log-probs)",
            )
        readings = [
            (KL_METRIC, kl, "warn_kl", "stop_kl"),
            (PROBS_DIFF_METRIC, probs_diff, "warn_probs_diff", "stop_probs_diff"),
        ]
        shown, stops, warned = [], [], False
        for name, value, warn_key, stop_key in readings:
            if value is None:
                continue
            warn, stop = getattr(config, warn_key), getattr(config, stop_key)
            limits = [f"{key}={limit:g}" for key, limit in ((warn_key, warn), (stop_key, stop)) if limit is not None]
            shown.append(f"{name}={value:.4g} ({', '.join(limits) or 'no thresholds'})")
            if not math.isfinite(value):
                stops.append(f"{name} is not finite")
            elif stop is not None and abs(value) > stop:
                stops.append(f"{name} above {stop_key}")
            warned = warned or not math.isfinite(value) or (warn is not None and abs(value) > warn)
        if not stops and not warned:
            self.consecutive_warnings = 0
            return HealthDecision(HealthStatus.OK, step, kl, probs_diff, 0)

        self.consecutive_warnings += 1
        count, limit = self.consecutive_warnings, config.max_consecutive_warnings or 0
        if limit and count >= limit:
            stops.append(f"{count} warning steps in a row (max_consecutive_warnings={limit})")
        streak = f"warning step {count} in a row" + (f", the run stops at {limit}" if limit else "")
        where = f"step {step}" if step is not None else "this step"
        level = "STOP" if stops else "WARNING"
        message = (
            f"[treetune] rollout health {level} at {where}: the rollout's and the trainer's log-probs of the same "
            f"tokens disagree: {'; '.join(shown)}; {streak}."
        )
        if stops:
            message += f" Stopping on: {'; '.join(stops)}."
        message += f" Likely causes: {'; '.join(LIKELY_CAUSES)}."
        if not stops:
            return HealthDecision(HealthStatus.WARN, step, kl, probs_diff, count, message)
        message += (
            " The run stops before any update of this step. If the mismatch is expected, raise the thresholds "
            f"({CONFIG_KEY}.stop_kl, .stop_probs_diff, .max_consecutive_warnings; null, or 0 for the count, turns "
            f"one off) or disable the guard with {CONFIG_KEY}.enabled=false."
        )
        return HealthDecision(HealthStatus.STOP, step, kl, probs_diff, count, message)


def _as_float(value: Any) -> float | None:
    if value is None:
        return None
    return float(value)


def enforce(decision: HealthDecision) -> HealthDecision:
    """Act on a decision: print and log a warning, or print, log and raise :class:`RolloutMismatchError` on stop.

    Returns:
        ``decision`` (ok, warn and skipped steps).
    """
    if decision.status is HealthStatus.WARN:
        print(decision.message, flush=True)
        logger.warning(decision.message)
    elif decision.status is HealthStatus.STOP:
        print(decision.message, flush=True)
        logger.error(decision.message)
        raise RolloutMismatchError(decision.message)
    return decision


# ---------------------------------------------------------------------------------------------------------- metrics


def mismatch_metrics(batch) -> dict[str, float] | None:
    """:data:`KL_METRIC` and :data:`PROBS_DIFF_METRIC` of a batch, computed by verl's own functions.

    Args:
        batch: a ``DataProto`` with ``rollout_log_probs`` ``[B, T]``, ``old_log_probs`` ``[B, T]``,
            ``response_mask`` ``[B, T]`` and ``responses`` ``[B, T]``.

    Returns:
        ``{KL_METRIC: ..., PROBS_DIFF_METRIC: ...}`` equal to what ``fit`` logs for that batch, or None when the batch
        has no ``rollout_log_probs`` or no valid response token.
    """
    tensors = batch.batch
    if "rollout_log_probs" not in tensors.keys() or not bool(tensors["response_mask"].any()):
        return None
    # SYNC WARNING: verl/trainer/ppo/rollout_corr_helper.py:compute_rollout_corr_metrics_from_logprobs (0.9.1
    # l.1070-1106, 0.7.1 l.1000-1036, compute_offpolicy_metrics with the rollout_corr/ prefix; fit logs the same values
    # through compute_rollout_correction_and_add_to_batch, verl/trainer/ppo/ray_trainer.py 0.9.1 l.1647-1660, 0.7.1
    # l.1466-1479, with the response_mask before rejection sampling)
    # SYNC WARNING: verl/utils/debug/metrics.py:calculate_debug_metrics (0.9.1 l.63-121, 0.7.1 l.63-109, what fit logs
    # as training/rollout_probs_diff_* at verl/trainer/ppo/ray_trainer.py 0.9.1 l.1610-1615, 0.7.1 l.1428-1433, on the
    # batch with old_log_probs)
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_corr_metrics_from_logprobs
    from verl.utils.debug.metrics import calculate_debug_metrics

    corr = compute_rollout_corr_metrics_from_logprobs(
        log_prob=tensors["old_log_probs"],
        rollout_log_prob=tensors["rollout_log_probs"],
        response_mask=tensors["response_mask"],
    )
    debug = calculate_debug_metrics(batch)
    return {KL_METRIC: float(corr[KL_METRIC]), PROBS_DIFF_METRIC: float(debug[PROBS_DIFF_METRIC])}


# ------------------------------------------------------------------------------------------------------------ mixin


def truncated_sampling(config: Any) -> str:
    """``"top_k=20, top_p=0.95"`` when the run's rollout samples with top-k or top-p truncation, else ``""``."""
    rollout = ((config.get("actor_rollout_ref") or {}).get("rollout")) or {}
    top_k, top_p = rollout.get("top_k", -1), rollout.get("top_p", 1.0)
    parts = []
    if top_k is not None and int(top_k) > 0:
        parts.append(f"top_k={int(top_k)}")
    if top_p is not None and float(top_p) < 1.0:
        parts.append(f"top_p={float(top_p)}")
    return ", ".join(parts)


class RolloutHealthMixin:
    """Mix into a ``RayPPOTrainer`` subclass (before it): every step's rollout-vs-trainer mismatch is checked.

    The check runs right after the step's old-log-prob pass (see the module docstring for why there) and stops the
    run with :class:`RolloutMismatchError` before any update of that step; ``_update_actor`` adds the step's
    ``treetune/rollout_health/*`` metrics. Reads ``treetune.rollout_health`` with ``config.get``: a config without
    the block gets :class:`RolloutHealthConfig`'s defaults.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        configured = RolloutHealthConfig.from_run_config(self.config)
        device = (self.config.get("trainer") or {}).get("device", "cuda")
        in_force = configured.on_device(device)
        truncation = truncated_sampling(self.config)
        if truncation and configured.enabled:
            # The rollout's log-probs are of the truncated distribution it sampled from (verl's processed_logprobs),
            # the trainer's of the whole one: the mismatch measures the truncation, by design of the sampling.
            in_force = replace(in_force, stop_kl=None, stop_probs_diff=None, max_consecutive_warnings=None)
        self.rollout_health = RolloutHealthMonitor(in_force)
        self._rollout_health_decision: HealthDecision | None = None
        self._rollout_health_notices: set[str] = set()
        if not configured.enabled:
            self._rollout_health_notice(f"the rollout-health guard is off ({CONFIG_KEY}.enabled=false).")
        elif truncation:
            self._rollout_health_notice(
                f"the rollout samples a truncated distribution ({truncation}): its log-probs are of that distribution, "
                "the trainer's of the whole one, so rollout_corr/* and training/rollout_probs_diff_* measure the "
                "truncation as well as any bug; the guard logs them but never stops this run. A run of the same "
                "model without truncation (top_k=-1, top_p=1) checks the numerics."
            )
        elif configured.max_consecutive_warnings and device not in configured.calibrated_devices:
            self._rollout_health_notice(
                f"trainer.device={device} is not in {CONFIG_KEY}.calibrated_devices: warning steps are logged but "
                "never stop the run; only stop_kl and stop_probs_diff do. Measure this engine's normal mismatch, then "
                f"add the device ({CONFIG_KEY}.calibrated_devices=[cpu,{device}]) to stop after "
                f"max_consecutive_warnings={configured.max_consecutive_warnings} warning steps."
            )

    def _compute_old_log_prob(self, batch):
        # SYNC WARNING: verl/trainer/ppo/ray_trainer.py:RayPPOTrainer._compute_old_log_prob (0.9.1 l.1290-1325, 0.7.1
        # l.1132-1161, returns (DataProto with old_log_probs [B, T], mfu)); fit calls it once per step (0.9.1 l.1586,
        # 0.7.1 l.1404), after the rollout and before the ref pass, critic update, advantages and _update_actor; not at
        # all in bypass mode (0.9.1 l.1575, 0.7.1 l.1393).
        output = super()._compute_old_log_prob(batch)
        step = getattr(self, "global_steps", None)
        previous = self._rollout_health_decision
        if previous is None or previous.step != step:
            self._rollout_health_decision = self._check_rollout_health(batch, output[0], step)
        return output

    def _check_rollout_health(self, batch, old_log_prob, step) -> HealthDecision:
        """Decide on one step (and act: warn, or raise :class:`RolloutMismatchError`)."""
        if not self.rollout_health.config.enabled:
            return self.rollout_health.check({}, step)
        from verl import DataProto

        tensors = batch.batch
        if "rollout_log_probs" not in tensors.keys():
            self._rollout_health_notice(
                "the rollout-health guard checks nothing: the batch has no rollout_log_probs; set "
                "actor_rollout_ref.rollout.calculate_log_probs=true to have it."
            )
            return self.rollout_health.check({}, step)
        view = DataProto.from_dict(
            tensors={
                "rollout_log_probs": tensors["rollout_log_probs"],
                "old_log_probs": old_log_prob.batch["old_log_probs"].to(tensors["rollout_log_probs"].device),
                "response_mask": tensors["response_mask"],
                "responses": tensors["responses"],
            }
        )
        return enforce(self.rollout_health.check(mismatch_metrics(view) or {}, step))

    def _update_actor(self, batch):
        # SYNC WARNING: verl/trainer/ppo/ray_trainer.py:RayPPOTrainer._update_actor (0.9.1 l.1327-1376, 0.7.1
        # l.1163-1198) returns the step's actor metrics in meta_info["metrics"]; fit reduces and logs them (0.9.1
        # l.1718-1719, 0.7.1 l.1535-1536).
        actor_output = super()._update_actor(batch)
        step = getattr(self, "global_steps", None)
        decision = self._rollout_health_decision
        if decision is None or decision.step != step:
            self._rollout_health_notice(
                "the rollout-health guard checks nothing: no old-log-prob pass ran before the actor update (e.g. "
                "algorithm.rollout_correction.bypass_mode=true, which uses the rollout's log-probs as old_log_probs)."
            )
            decision = HealthDecision(
                HealthStatus.SKIPPED, step, consecutive_warnings=self.rollout_health.consecutive_warnings
            )
        actor_output.meta_info.setdefault("metrics", {}).update(decision.metrics())
        return actor_output

    def _rollout_health_notice(self, text: str) -> None:
        """Print ``text`` once per run."""
        if text not in self._rollout_health_notices:
            self._rollout_health_notices.add(text)
            print(f"[treetune] {text}", flush=True)
