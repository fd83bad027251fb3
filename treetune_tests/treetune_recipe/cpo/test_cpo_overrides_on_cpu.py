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
"""A bad ``cpo.*`` command-line override stops the recipe's entry point and the demo in one line, before Hydra
composes and before Ray (in-process: the entry point's training and the demo's launch are stubbed out).

Without the check, ``cpo.bogus=1`` ended in Hydra's multi-line "Key 'bogus' is not in struct", ``+cpo.bogus=1``
composed and failed later, and ``cpo.teacher=x`` failed inside Hydra's job with a traceback.
"""

import sys

import pytest
import ray
from hydra import compose, initialize_config_dir

from treetune_recipe.cpo import CONFIG_DIR, CONFIG_NAME, main_cpo
from treetune_recipe.cpo.config import CPOConfig, check_cpo_overrides
from treetune_recipe.cpo.teacher.weights import TEACHERS
from treetune_scripts import run_demo
from treetune_verl.config_block import block_keys
from treetune_verl.preflight import PreflightError
from treetune_verl.tiny_assets import build_tiny_assets
from treetune_verl.tiny_run import TrainingRun, tiny_run_overrides

CPO_KEYS = ", ".join(block_keys(CPOConfig))
HINT_KEYS = ", ".join(block_keys(type(CPOConfig().hint)))
BAD = {
    "unknown key": ("cpo.bogus=1", f"cpo.bogus=1: cpo has no key 'bogus'; valid keys of cpo: {CPO_KEYS}."),
    "unknown key, appended": ("+cpo.bogus=1", f"+cpo.bogus=1: cpo has no key 'bogus'; valid keys of cpo: {CPO_KEYS}."),
    "unknown nested key": (
        "cpo.hint.bogus=1",
        f"cpo.hint.bogus=1: cpo.hint has no key 'bogus'; valid keys of cpo.hint: {HINT_KEYS}.",
    ),
    "invalid value": ("cpo.teacher=x", f"Unknown cpo.teacher 'x'. Valid values: {', '.join(TEACHERS)}."),
    "invalid nested value": ("cpo.credit_dump.steps=[0]", "cpo.credit_dump.steps must be a list of training steps"),
}
GOOD = ["platform=cpu", "cpo.method=mi3", "cpo.teacher=initial", "cpo.hint.rescore=all", "+trainer.extra=1"]


def test_valid_keys_are_the_composed_blocks_keys():
    """The check reads CPOConfig's fields: they are the keys of the recipe's cpo block, no more, no fewer."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        config = compose(CONFIG_NAME, overrides=["platform=cpu"])
    assert sorted(config.cpo) == sorted(block_keys(CPOConfig))
    assert sorted(config.cpo.hint) == sorted(block_keys(type(CPOConfig().hint)))
    assert sorted(config.cpo.credit_dump) == sorted(block_keys(type(CPOConfig().credit_dump)))


@pytest.mark.parametrize("case", BAD)
def test_a_bad_cpo_override_is_one_line_naming_the_valid_keys_or_values(case):
    override, message = BAD[case]
    with pytest.raises(PreflightError) as raised:
        check_cpo_overrides(["platform=cpu", "-m", override])
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_control_good_overrides_pass_and_compose():
    check_cpo_overrides(["--config-name", "cpo_trainer", "-m", *GOOD, "cpo.method=seq_kl,rlsd"])
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        config = compose(CONFIG_NAME, overrides=GOOD)
    assert CPOConfig.from_config(config.cpo).teacher_config.name == "initial"


@pytest.mark.parametrize("case", BAD)
def test_the_entry_point_stops_before_hydra_and_ray(monkeypatch, case):
    override, message = BAD[case]
    ran = []
    monkeypatch.setattr(main_cpo, "main", lambda: ran.append(True))
    monkeypatch.setattr(sys, "argv", ["main_cpo.py", "platform=cpu", override])
    with pytest.raises(SystemExit) as raised:
        main_cpo.cli()
    assert str(raised.value.code).startswith(f"[cpo] {message}") and "\n" not in str(raised.value.code)
    assert ran == [] and not ray.is_initialized()
    # Control: good overrides go on to Hydra's main.
    monkeypatch.setattr(sys, "argv", ["main_cpo.py", *GOOD])
    main_cpo.cli()
    assert ran == [True]


def test_a_check_that_needs_the_composed_config_stops_in_hydras_job_without_a_traceback(monkeypatch, tmp_path):
    """cpo.teacher=initial needs the reference worker: only the composed config tells (use_kl_loss)."""

    class Launched(BaseException):  # Hydra turns an Exception of its job into exit status 1
        pass

    def launched(config, task_runner_class):
        raise Launched

    for name, stub in {
        "auto_set_device": lambda config: None,
        "exit_on_sigterm": lambda: None,
        "run_ppo": launched,
    }.items():
        monkeypatch.setattr(main_cpo, name, stub)
    # As under `python -m`: Hydra finds config/ next to the file of a task function defined in __main__.
    monkeypatch.setattr(main_cpo.main.__wrapped__, "__module__", "__main__")
    base = ["main_cpo.py", f"hydra.run.dir={tmp_path / 'hydra'}", *tiny_run_overrides(build_tiny_assets(), tmp_path)]
    base += GOOD
    monkeypatch.setattr(sys, "argv", [*base, "actor_rollout_ref.actor.use_kl_loss=false"])
    with pytest.raises(SystemExit) as raised:
        main_cpo.cli()
    message = str(raised.value.code)
    assert message.startswith("[cpo] cpo.teacher resolves to 'initial'") and "\n" not in message
    assert "actor_rollout_ref.actor.use_kl_loss=true" in message and not ray.is_initialized()
    # Control: with the reference worker the same command passes every start-up check and reaches verl's run_ppo.
    monkeypatch.setattr(sys, "argv", base)
    with pytest.raises(Launched):
        main_cpo.cli()


@pytest.fixture
def demo(monkeypatch, tmp_path):
    """``run_demo.main`` on a fake warm start, stopping before any training; returns (run, launched overrides)."""
    launched = []

    def no_training(overrides, log_path, **kwargs):
        launched.append(overrides)
        log_path.write_text("")
        return TrainingRun(returncode=1, wall_s=0.0, peak_rss_bytes=0, timed_out=False, log_path=log_path)

    monkeypatch.setattr(run_demo, "demo_start", lambda: tmp_path / "warm_start")
    monkeypatch.setattr(run_demo, "launch_training", no_training)
    monkeypatch.setattr("treetune_verl.preflight.check_run_config", lambda config: None)  # no real warm start here
    return (lambda *overrides: run_demo.main(["--output-dir", str(tmp_path), "--prompts", "0", *overrides])), launched


@pytest.mark.parametrize("case", ["unknown key", "unknown key, appended", "invalid value"])
def test_the_demo_stops_in_one_line_before_launching(demo, capsys, case):
    run, launched = demo
    override, message = BAD[case]
    assert run(override) == 2
    assert capsys.readouterr().err == f"[demo] {message}\n"
    assert launched == []
    # Control: a good cpo override is passed on to the launch.
    run("cpo.method=mi3")
    assert len(launched) == 1 and launched[0][-1] == "cpo.method=mi3"
