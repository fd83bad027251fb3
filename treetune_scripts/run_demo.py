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
"""The CPU demo (``make demo``): a short RL run of the real verl trainer on the tiny assets, then its learning curve.

Steps:

1. build (or reuse) the warm-started model and its task data (``treetune_recipe.cpo.experiments.warm_start``: a small
   Qwen3 fine-tuned by verl's SFT trainer on the chained-arithmetic task; the first build takes minutes, then it is
   cached), so that the reward and the validation accuracy move within a few steps; by default (``--prompts 16``) the
   run trains on a small fixed prompt set that is also its validation set, so learning shows within minutes;
2. compose the run config and check it (``treetune_verl.preflight``): bad input stops here with one clear message;
3. run the trainer as a subprocess (default: the CPO recipe, ``treetune_recipe.cpo.main_cpo`` with ``cpo_trainer``
   and ``platform=cpu``; ``--entry-module verl.trainer.main_ppo --config-dir <verl_cpu/config> --config-name
   ppo_trainer_cpu`` runs upstream GRPO instead), streaming progress to the console and the full log to
   ``<output-dir>/train.log`` (appended to, one header line per run); metrics go to ``<output-dir>/metrics.jsonl``
   (verl's file logger; a resumed run keeps the earlier steps, a fresh one starts the file anew);
4. plot ``<output-dir>/learning_curve.png`` (reward and validation accuracy, CPO shaping magnitude, step time, the
   rollout/trainer mismatch) and
   ``<output-dir>/all_metrics.png`` (every metric), and print a summary with wall time, step times and peak memory.

Usage::

    python -m treetune_scripts.run_demo [--steps N] [--prompts N] [--output-dir DIR] [--verbose] [hydra overrides ...]

Extra ``key=value`` arguments are passed to Hydra unchanged, after the demo's own overrides (so they win).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from treetune_recipe.cpo import CONFIG_DIR, CONFIG_NAME, ENTRY_MODULE
from treetune_recipe.cpo.experiments.console import condense
from treetune_recipe.cpo.experiments.task import GREEDY_VAL_ACC_KEY, HINT_OVERRIDES, TASK_RL_OVERRIDES
from treetune_verl.metrics_history import step_times
from treetune_verl.tiny_run import METRICS_FILE, launch_training, tiny_run_overrides

DEFAULT_OUTPUT_DIR = Path("outputs/demo")
DEFAULT_ENTRY_MODULE = ENTRY_MODULE
DEFAULT_CONFIG_DIR = CONFIG_DIR
DEFAULT_CONFIG_NAME = CONFIG_NAME
# The demo always runs on the CPU backend, with the warm start's task settings; validation every 5 steps.
DEMO_OVERRIDES = ["platform=cpu", *TASK_RL_OVERRIDES, "trainer.test_freq=5"]
# By default the demo fits a small fixed prompt set (also its validation set), where RL's progress shows within its
# budget; on the whole task, 30 steps move held-out accuracy less than its noise (agent-docs/running-code.md, "The
# CPO-vs-GRPO experiment").
DEFAULT_STEPS, DEFAULT_PROMPTS = 30, 16
# The curves a researcher reads first (learning_curve.png); all_metrics.png has every metric.
KEY_CURVES = [
    "critic/score/mean",
    GREEDY_VAL_ACC_KEY,
    "actor/cpo/adv_delta_absmean",
    "cpo/gw_minus_old_absmean",
    "timing_s/step",
    "rollout_corr/kl",  # the rollout/trainer agreement the run-health guard reads (healthy: |kl| ~ 0.001)
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help=f"training steps (default {DEFAULT_STEPS})")
    parser.add_argument(
        "--prompts",
        type=int,
        default=DEFAULT_PROMPTS,
        help=f"train and validate on the first N training prompts (default {DEFAULT_PROMPTS}: learning shows within "
        "minutes); 0 = the whole task, validated on its held-out prompts",
    )
    parser.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR, help="default outputs/demo")
    parser.add_argument("--entry-module", default=DEFAULT_ENTRY_MODULE, help="Hydra main run with python -m")
    parser.add_argument("--config-dir", type=Path, default=DEFAULT_CONFIG_DIR, help="--config-path of the entry")
    parser.add_argument("--config-name", default=DEFAULT_CONFIG_NAME, help="--config-name of the entry module")
    parser.add_argument("--timeout", type=float, default=900.0, help="kill the run after this many seconds")
    parser.add_argument("--verbose", action="store_true", help="stream the trainer's full output")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (key=value), applied last")
    return parser.parse_args(argv)


def demo_start() -> Path:
    """The warm start the demo trains from (built on first use, then cached)."""
    from treetune_recipe.cpo.experiments.warm_start import (
        DEFAULT_WARM_START,
        build_warm_start,
        describe_warm_start,
        read_build_info,
    )

    print(
        "[demo] warm start (the shipped model, hash-checked; its folder is assembled once, then cached) ...", flush=True
    )
    warm_dir = build_warm_start(DEFAULT_WARM_START)
    print(f"[demo] {describe_warm_start(read_build_info(warm_dir))}")
    return warm_dir


def prompt_set_overrides(warm_dir: Path, output_dir: Path, prompts: int, steps: int) -> list[str]:
    """Train and validate on the first ``prompts`` training prompts (0: the whole task, held-out validation)."""
    if prompts < 0:
        raise SystemExit(f"[demo] --prompts must be >= 0, got {prompts}.")
    if prompts == 0:
        return []
    from treetune_recipe.cpo.experiments.warm_start import write_first_prompts

    path = write_first_prompts(warm_dir, output_dir / "prompts.parquet", prompts)
    print(f"[demo] training and validating on the first {prompts} training prompts ({path})")
    return [f"data.train_files={path}", f"data.val_files={path}", f"trainer.total_epochs={steps}"]


def compose_config(config_dir: Path, config_name: str, overrides: list[str]):
    """The config the entry module will see (``hydra.*`` overrides are dropped: they only steer Hydra itself)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base=None):
        return compose(config_name=config_name, overrides=[o for o in overrides if not o.startswith("hydra.")])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    output_dir = args.output_dir.resolve()
    output_dir.mkdir(parents=True, exist_ok=True)
    # Kept across runs: the trainer drops the steps a resume recomputes and appends (treetune_verl.run_folder).
    metrics_path = output_dir / METRICS_FILE

    assets_dir = demo_start()
    overrides = tiny_run_overrides(assets_dir, output_dir, total_training_steps=args.steps, experiment_name="demo")
    hint = HINT_OVERRIDES if args.config_name == DEFAULT_CONFIG_NAME else []
    overrides += [*DEMO_OVERRIDES, *hint, *prompt_set_overrides(assets_dir, output_dir, args.prompts, args.steps)]
    overrides += [f"hydra.run.dir={output_dir / 'hydra'}", *args.overrides]

    from treetune_recipe.cpo.config import check_cpo_overrides
    from treetune_verl.preflight import PreflightError, check_run_config

    try:
        if args.config_name == DEFAULT_CONFIG_NAME:  # an unknown cpo.* key or a refused value: one line, not Hydra's
            check_cpo_overrides(overrides)
        config = compose_config(args.config_dir, args.config_name, overrides)
        check_run_config(config)
    except PreflightError as error:
        print(f"[demo] {error}", file=sys.stderr)
        return 2

    steps = config.trainer.total_training_steps
    print(f"[demo] training: python -m {args.entry_module} --config-name {args.config_name} ({steps} steps)")

    def echo(line: str) -> None:
        shown = line if args.verbose else condense(line)
        if shown is not None:
            print(shown, flush=True)

    run = launch_training(
        overrides,
        output_dir / "train.log",
        entry_module=args.entry_module,
        config_dir=args.config_dir,
        config_name=args.config_name,
        timeout_s=args.timeout,
        env={"VERL_FILE_LOGGER_PATH": str(metrics_path)},
        echo=echo,
        cwd=output_dir,
        append_log=True,
    )
    if run.returncode != 0:
        tail = run.log_path.read_text().splitlines()[-40:]
        reason = f"timed out after {args.timeout:.0f} s" if run.timed_out else f"exit code {run.returncode}"
        print("\n".join(["[demo] training failed (" + reason + "); last lines of the log:", *tail]), file=sys.stderr)
        print(f"[demo] full log: {run.log_path}", file=sys.stderr)
        return 1

    from treetune_verl.metrics_plot import plot_metrics, summarize_metrics

    png = plot_metrics(metrics_path, output_dir / "learning_curve.png", keys=KEY_CURVES)
    plot_metrics(metrics_path, output_dir / "all_metrics.png")
    print(summarize_metrics(metrics_path))
    times = step_times(metrics_path)
    later = [seconds for step, seconds in times if step > 1]
    print(f"[demo] training wall time {run.wall_s:.1f} s (Ray start-up and worker init included)")
    if times:
        mean_later = f", later steps mean {sum(later) / len(later):.2f} s" if later else ""
        print(f"[demo] step 1 (warm-up) {times[0][1]:.2f} s{mean_later}")
    print(f"[demo] peak memory (sum of RSS over all processes of the run) {run.peak_rss_bytes / 2**30:.2f} GiB")
    print(f"[demo] metrics {metrics_path}\n[demo] learning curve {png}\n[demo] log {run.log_path}")
    print(f"[demo] total demo time {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
