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
"""The overlay's own patches (``treetune_verl/patches.py``): their release guard, the trainer-class and entropy seams
of the recipes, and the appending file logger. They apply on every device. verl-cpu's patches are tested with
verl-cpu (``treetune_verl/verl-cpu/tests``); the engine-worker fix with :mod:`treetune_verl.verl_runtime`."""

import json

import pytest
import torch
import verl_cpu.release_guard as release_guard
from verl_cpu.release_guard import UnsupportedVerlError

from treetune_verl import patches
from treetune_verl.version import SUPPORTED_VERL_VERSIONS

UNSUPPORTED = "0.8.0"


@pytest.fixture
def installed_verl(monkeypatch):
    """``installed_verl(release)`` makes the release guard see ``release`` as the installed verl (for this test)."""

    def pretend(release: str) -> None:
        monkeypatch.setattr(release_guard, "installed_verl_version", lambda: release)

    return pretend


@pytest.fixture
def patch_bookkeeping(monkeypatch):
    """The overlay's record of applied and skipped patches, restored after the test (test patch names vanish)."""
    monkeypatch.setattr(patches.guard(), "_applied", set(patches.guard()._applied))
    monkeypatch.setattr(patches.guard(), "_skipped", set(patches.guard()._skipped))
    return patches.guard()


@pytest.fixture
def tracking(monkeypatch, tmp_path):
    """``verl.utils.tracking`` with its ``FileLogger`` restored after the test, writing to ``tmp_path``."""
    import verl.utils.tracking as tracking

    monkeypatch.setattr(tracking, "FileLogger", tracking.FileLogger)
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)
    monkeypatch.setenv("VERL_FILE_LOGGER_ROOT", str(tmp_path / "root"))
    return tracking


# ------------------------------------------------------------------------------------------------------ release guard


def test_an_unsupported_verl_is_refused_naming_the_patch_and_the_releases(installed_verl, patch_bookkeeping):
    installed_verl(UNSUPPORTED)
    applied = []
    with pytest.raises(UnsupportedVerlError) as error:
        patch_bookkeeping.apply("a_test_patch", lambda: applied.append(True))
    message = str(error.value)
    assert f"'a_test_patch' was written for {', '.join(f'verl=={r}' for r in SUPPORTED_VERL_VERSIONS)}" in message
    assert f"but verl=={UNSUPPORTED} is installed" in message
    assert "treetune_verl/VERL_VERSION" in message  # the overlay's fix, not verl-cpu's
    assert applied == [] and "a_test_patch" not in patches.applied_patches()


def test_the_seams_refuse_an_unsupported_verl_before_changing_anything(installed_verl, tracking):
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    original_logger = tracking.FileLogger
    installed_verl(UNSUPPORTED)

    class MyTrainer(RayPPOTrainer):
        pass

    with pytest.raises(UnsupportedVerlError, match="'use_trainer_class'"):
        patches.use_trainer_class(MyTrainer)
    with pytest.raises(UnsupportedVerlError, match="'append_file_logger'"):
        patches.append_file_logger()
    assert tracking.FileLogger is original_logger


@pytest.mark.parametrize("release", SUPPORTED_VERL_VERSIONS)
def test_a_patch_for_one_release_is_skipped_on_the_others(installed_verl, patch_bookkeeping, monkeypatch, release):
    installed_verl(release)
    monkeypatch.setitem(patch_bookkeeping.only_on, "a_071_test_patch", ("0.7.1",))
    applied = []
    patch_bookkeeping.apply("a_071_test_patch", lambda: applied.append("0.7.1 only"))
    patch_bookkeeping.apply("an_everywhere_test_patch", lambda: applied.append("everywhere"))
    patch_bookkeeping.apply("an_everywhere_test_patch", lambda: applied.append("everywhere"))  # once per process
    assert applied == (["0.7.1 only", "everywhere"] if release == "0.7.1" else ["everywhere"])
    assert ("a_071_test_patch" in patches.applied_patches()) == (release == "0.7.1")


@pytest.mark.parametrize("release", SUPPORTED_VERL_VERSIONS)
def test_the_fixes_upstream_made_after_071_are_patched_on_071_only(installed_verl, release):
    installed_verl(release)
    # verl PR #4777 (0.8.0) keeps the actor on its device; verl >= 0.8 honours actor.calculate_entropy
    assert patches.guard().applies("keep_actor_on_device_after_weight_sync") == (release == "0.7.1")
    assert patches.guard().applies("request_entropy_in_actor_updates") == (release == "0.7.1")
    assert patches.guard().applies("append_file_logger")  # FileLogger still truncates on every release


def test_a_patch_named_in_the_overlays_skip_variable_is_left_out_with_a_warning(patch_bookkeeping, monkeypatch, capsys):
    from verl_cpu.activation import SKIP_PATCHES_ENV as VERL_CPU_SKIP_PATCHES_ENV

    applied = []
    monkeypatch.setenv(VERL_CPU_SKIP_PATCHES_ENV, "a_test_patch")  # verl-cpu's variable does not reach the overlay
    patch_bookkeeping.apply("a_test_patch", lambda: applied.append("first"))
    monkeypatch.setenv(patches.SKIP_PATCHES_ENV, "another_test_patch, a_third_test_patch")
    patch_bookkeeping.apply("a_third_test_patch", lambda: applied.append("third"))
    assert applied == ["first"]
    assert patches.applied_patches() >= {"a_test_patch"} and "a_third_test_patch" not in patches.applied_patches()
    assert f"patch 'a_third_test_patch' skipped ({patches.SKIP_PATCHES_ENV})" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------ seams for recipes


def test_use_trainer_class_rebinds_the_class_task_runner_run_builds(monkeypatch):
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from treetune_verl.verl_compat import trainer_module

    main_ppo = trainer_module()  # 0.9.1: main_ppo_v0; 0.7.1: main_ppo
    monkeypatch.setattr(main_ppo, "RayPPOTrainer", RayPPOTrainer)  # restored after the test

    class MyTrainer(RayPPOTrainer):
        pass

    patches.use_trainer_class(MyTrainer)
    assert main_ppo.RayPPOTrainer is MyTrainer
    with pytest.raises(TypeError, match="subclass of RayPPOTrainer"):
        patches.use_trainer_class(dict)
    assert main_ppo.RayPPOTrainer is MyTrainer  # a refused class leaves the last one in place


def test_use_trainer_class_hands_the_trainer_extra_arguments(monkeypatch):
    """The recipe hands its trainer the config object the driver checked; ``run`` passes only verl's arguments."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from treetune_verl.verl_compat import trainer_module

    main_ppo = trainer_module()
    monkeypatch.setattr(main_ppo, "RayPPOTrainer", RayPPOTrainer)

    class MyTrainer(RayPPOTrainer):
        def __init__(self, config, checked=None):
            self.config, self.checked = config, checked

    checked = object()
    patches.use_trainer_class(MyTrainer, checked=checked)
    built = main_ppo.RayPPOTrainer(config="the run's config")
    assert isinstance(built, MyTrainer) and built.checked is checked and built.config == "the run's config"
    patches.use_trainer_class(MyTrainer)  # control: without arguments the class itself, as before
    assert main_ppo.RayPPOTrainer is MyTrainer and main_ppo.RayPPOTrainer(config=None).checked is None


class _FakeWorkerGroup:
    def __init__(self):
        self.received = []

    def update_actor(self, data):
        self.received.append(data)
        return "metrics"


def _batch(calculate_entropy: bool):
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    batch = TensorDict({"x": torch.zeros(2, 1)}, batch_size=[2])
    tu.assign_non_tensor(batch, calculate_entropy=calculate_entropy, epochs=1)
    return batch


def test_request_entropy_sets_the_flag_on_every_update_of_that_worker_group_on_071(installed_verl):
    from verl.utils import tensordict_utils as tu

    installed_verl("0.7.1")
    group, other = _FakeWorkerGroup(), _FakeWorkerGroup()
    patches.request_entropy_in_actor_updates(group)
    patches.request_entropy_in_actor_updates(group)  # idempotent: wrapped once
    assert group.update_actor.__wrapped__ == _FakeWorkerGroup.update_actor.__get__(group)
    assert group.update_actor(_batch(calculate_entropy=False)) == "metrics"
    assert tu.get(group.received[0], "calculate_entropy") is True
    assert tu.get(group.received[0], "epochs") == 1  # the rest of the batch is untouched
    legacy_batch = object()
    group.update_actor(legacy_batch)  # legacy workers (DataProto) are passed through unchanged
    assert group.received[1] is legacy_batch
    other.update_actor(_batch(calculate_entropy=False))  # only that instance is wrapped
    assert tu.get(other.received[0], "calculate_entropy") is False


def test_request_entropy_changes_nothing_where_verl_honours_calculate_entropy(installed_verl):
    from verl.utils import tensordict_utils as tu

    installed_verl("0.9.1")
    group = _FakeWorkerGroup()
    unwrapped = group.update_actor
    patches.request_entropy_in_actor_updates(group)
    assert group.update_actor == unwrapped
    group.update_actor(_batch(calculate_entropy=False))
    assert tu.get(group.received[0], "calculate_entropy") is False


# ---------------------------------------------------------------------------------------------- appending file logger


def _log_steps(tracking, steps) -> None:
    """What one (resumed) run does with its metrics file: build verl's ``Tracking``, log ``steps``, finish."""
    tracker = tracking.Tracking(project_name="p", experiment_name="e", default_backend=["file"])
    for step in steps:
        tracker.log(data={"x": float(step)}, step=step)
    tracker.logger["file"].finish()


def _logged(path):
    return [(record["step"], record["data"]["x"]) for record in map(json.loads, path.read_text().splitlines())]


def test_upstream_file_logger_truncates_its_file(tracking, tmp_path, monkeypatch):
    # The control: when this fails, verl appends by itself and append_file_logger can go.
    path = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    _log_steps(tracking, [1, 2])
    _log_steps(tracking, [3])
    assert _logged(path) == [(3, 3.0)]


def test_a_resumed_run_keeps_the_earlier_lines_and_appends(tracking, tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    patches.append_file_logger()
    _log_steps(tracking, [1, 2])
    earlier = path.read_bytes()
    _log_steps(tracking, [3])  # first resume
    _log_steps(tracking, [4, 5])  # second resume
    assert path.read_bytes().startswith(earlier)
    assert _logged(path) == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 5.0)]


def test_a_fresh_appending_logger_creates_an_empty_file(tracking, tmp_path, monkeypatch):
    patches.append_file_logger()
    logger = tracking.FileLogger(project_name="p", experiment_name="fresh")  # VERL_FILE_LOGGER_ROOT/p/fresh.jsonl
    logger.finish()
    path = tmp_path / "root" / "p" / "fresh.jsonl"
    assert path.read_bytes() == b""
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "new.jsonl"))
    _log_steps(tracking, [7])
    assert _logged(tmp_path / "new.jsonl") == [(7, 7.0)]


def test_the_logger_is_replaced_once_and_open_is_left_alone_outside_its_init(tracking, tmp_path, monkeypatch):
    upstream = tracking.FileLogger
    patches.append_file_logger()
    appending = tracking.FileLogger
    patches.append_file_logger()
    assert tracking.FileLogger is appending and appending.__bases__ == (upstream,)
    # A logger whose file cannot be opened fails as upstream's does, and leaves no "open" behind in the module.
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "missing_dir" / "metrics.jsonl"))
    with pytest.raises(FileNotFoundError):
        tracking.FileLogger(project_name="p", experiment_name="e")
    assert "open" not in vars(tracking)  # the module's other code opens files as upstream wrote it
