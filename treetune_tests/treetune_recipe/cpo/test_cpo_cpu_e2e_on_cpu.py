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
"""End to end on CPU: the CPO recipe (``python -m treetune_recipe.cpo.main_cpo platform=cpu``) with real Ray and the
real trainer of the installed verl release (0.9.1 in ``.venv``, 0.7.1 in ``.venv-verl0.7.1``) on the tiny assets,
checked from each run's own outputs (exit status, logged metrics, checkpoints, the credit dump). Start-up errors of
bad configs are checked through the same entry point (each check itself is tested in process, without Ray). The
two-step CPO run and the refreshed-teacher run (the reference worker: starting model, then the actor's copy) are also
marked ``both_releases``: CI runs them on both releases, the other tests on the default release only.

The two-step CPO run trains the context-sensitive tiny model (log-probs that move by nats with the context) on two
data-parallel workers with batch balancing, so its numbers check the whole pipeline: the rollout's log-probs against the
trainer's (``rollout_corr/kl``, weight sync included), and the old and hinted log-probs of the credit dump (hinted pass
padded for DP, balanced and scattered back) against fp32 transformers, each with a corrupted-input control. It runs
as a multi-node GPU run does: ``trainer.nnodes=2``, attached to a two-node Ray cluster started on this machine
(``treetune_tests/support/ray_cluster.py``), whose actor table then tells on which node each worker ran.
"""

import json
import math
import subprocess
import sys

import pytest
from safetensors.torch import load_file

from treetune_recipe.cpo import ENTRY_MODULE
from treetune_tests.support import fp32_reference as REFERENCE
from treetune_tests.support.cpo_runs import ROLLOUT_KL_MAX, RUN_TIMEOUT_S, run_cpo
from treetune_tests.support.ray_cluster import attach_env, attach_overrides, cluster_record, two_node_cluster
from treetune_tests.support.runs import step_rollouts
from treetune_verl.rollout_health import CHECKED_METRIC, WARNING_METRIC
from treetune_verl.tiny_assets import build_tiny_assets
from treetune_verl.tiny_run import tiny_run_overrides
from treetune_verl.version import verl_is

# Metrics the trainer logs on the driver, and the ones the CPO loss returns from the workers.
DRIVER_METRICS = (
    "cpo/gw_minus_old_absmean",
    "cpo/log_ratio_mean/wrong",
    "cpo/mi_mean/wrong",
    "cpo/hint_prompt_len_mean",
    "cpo/group_all_wrong_frac",
)
LOSS_METRICS = ("actor/cpo/adv_delta_absmean", "actor/cpo/adv_delta_absmean/wrong", "actor/cpo/changed_token_frac")


@pytest.fixture(scope="module")
def assets_dir():
    """The near-uniform tiny model: for plumbing and start-up checks, where context cannot matter."""
    return build_tiny_assets()


def rescored_dump(model, dump: dict, vocab_size: int, corruption: str | None = None):
    """fp32 transformers' ``(old, hinted)`` log-probs of every dumped row over the tokenizer's ``vocab_size`` ids:
    lists of ``[R]`` tensors."""
    import torch

    old, hinted = [], []
    with torch.no_grad():
        for row in dump["rows"]:
            response = torch.tensor(row["token_ids"])
            for prompt_key, scores in (("prompt_ids", old), ("hint_prompt_ids", hinted)):
                prompt = torch.tensor(row[prompt_key])
                scores.append(REFERENCE.score_row(model, prompt, response, corruption, vocab_size)[0])
    return old, hinted


def as_matrix(rows):
    """Right-padded ``[N, max R]`` float32 matrix of ragged per-row values."""
    import torch

    return torch.nn.utils.rnn.pad_sequence([torch.as_tensor(row, dtype=torch.float32) for row in rows], True)


def dumped_scores(dump: dict):
    """``(old, hinted, mask)`` matrices of a credit dump's rows."""
    rows = dump["rows"]
    mask = as_matrix([[1.0] * len(row["token_ids"]) for row in rows])
    return (
        as_matrix([row["old_log_probs"] for row in rows]),
        as_matrix([row["teacher_log_probs"] for row in rows]),
        mask,
    )


#: Seed of the two-step run: another than the teacher runs', so its rollouts are their seed control.
TWO_STEP_SEED = 1


@pytest.fixture(scope="module")
def two_step_run(context_sensitive_assets_dir, tmp_path_factory):
    """The two-step CPO run (policy teacher, two data-parallel trainer ranks, one on each node of a two-node Ray
    cluster on this machine); returns (run, metrics, run folder, what the cluster recorded)."""
    run_dir = tmp_path_factory.mktemp("two_step")
    with two_node_cluster() as address:
        run, metrics = run_cpo(
            context_sensitive_assets_dir,
            run_dir,
            steps=2,
            extra=[
                "actor_rollout_ref.actor.optim.lr=1e-2",  # a visible weight change after two steps
                f"data.seed={TWO_STEP_SEED}",
                f"++actor_rollout_ref.rollout.engine_kwargs.hf.seed={TWO_STEP_SEED}",
                *([f"trainer.rollout_data_dir={run_dir / 'rollouts'}"] if not verl_is("0.7.1") else []),
                "trainer.save_freq=1",  # the weights of each step, for the teacher check of step 2
                "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]",
                # About half the responses count as correct (the tiny model never answers right), so the steps have
                # correct responses, whose hinted log-probs seq_kl (alpha+ = 0) never reads.
                "reward.custom_reward_function.name=compute_score_half_correct",
                # Two data-parallel trainer ranks, one per node (verl balances the batch over them by default).
                *attach_overrides(),
                "trainer.balance_batch=true",
                # Steps 1 and 2 score every row under the hint and dump old and hinted log-probs with token ids.
                "cpo.credit_dump.steps=[1,2]",
                f"cpo.credit_dump.dir={run_dir / 'credit'}",
            ],
            env=attach_env(address),
        )
        record = cluster_record(address)
    return run, metrics, run_dir, record


@pytest.mark.e2e
@pytest.mark.both_releases
@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_cpo_two_steps_shape_advantages_with_the_hint_prompt(two_step_run, context_sensitive_assets_dir):
    import torch

    assets_dir, steps = context_sensitive_assets_dir, 2
    run, metrics, run_dir, _ = two_step_run  # finished_run_metrics checked that steps 1..2 were logged
    assert "rollout health" not in run.log_path.read_text()  # no guard warning
    for step, values in metrics.items():
        for key in (
            *DRIVER_METRICS,
            *LOSS_METRICS,
            "timing_s/cpo_hint_batch",
            "actor/pg_loss",
            "actor/kl_loss",
            "actor/grad_norm",
        ):
            assert key in values and math.isfinite(values[key]), (step, key)
        # The hint prompt really changes the response log-probs: teacher_log_probs != old_log_probs on some tokens.
        assert values["cpo/gw_minus_old_absmean"] > 1e-3, step
        assert values["cpo/hint_missing_frac"] == 0 and values["cpo/hint_truncated_frac"] == 0
        assert 0 < values["cpo/success_frac"] < 1, step
        assert values["actor/cpo/adv_delta_absmean/wrong"] > 0, step
        assert values["actor/cpo/changed_token_frac"] > 0, step
        # The trainer's log-probs are the rollout's (same weights, same tokens): the run is healthy, and the run-health
        # guard checked the step and did not warn.
        assert abs(values["rollout_corr/kl"]) < ROLLOUT_KL_MAX, (step, values["rollout_corr/kl"])
        assert values["training/rollout_probs_diff_mean"] < ROLLOUT_KL_MAX, step
        assert values[CHECKED_METRIC] == 1 and values[WARNING_METRIC] == 0, step
    # Both steps dump credit, so they score every row under the hint (cpo.hint.rescore=needed would score only the
    # wrong responses: test_cpo_hint_pass_* and the teacher runs below); the hint prompts are longer than the plain
    # ones: more tokens than rows.
    assert metrics[1]["cpo/hint_rows_frac"] == metrics[2]["cpo/hint_rows_frac"] == 1
    assert metrics[2]["cpo/hint_rows_frac"] < metrics[2]["cpo/hint_token_ratio"]
    # seq_kl's published teacher is the rollout policy: the weights after the previous step's update.
    assert [metrics[step]["cpo/teacher/policy"] for step in (1, 2)] == [1, 1]
    assert [metrics[step]["cpo/teacher_weights_step"] for step in (1, 2)] == [0, 1]
    assert metrics[steps]["actor/kl_loss"] > 0  # reference model on, and the policy moved away from it
    print(f"\nrollout_corr/kl per step: {[metrics[step]['rollout_corr/kl'] for step in sorted(metrics)]}")

    # The dump of step 1 (weights still the initial ones) against fp32 transformers on the same token ids.
    from transformers import AutoTokenizer

    dump = json.loads((run_dir / "credit" / "step_1.json").read_text())
    assert len(dump["rows"]) > 4 and dump["teacher"] == "policy"
    model = REFERENCE.load_model(assets_dir)
    vocab_size = len(AutoTokenizer.from_pretrained(assets_dir / "model"))
    old, hinted = rescored_dump(model, dump, vocab_size)
    dumped_old, dumped_hinted, mask = dumped_scores(dump)
    REFERENCE.assert_scores_match(dumped_old, as_matrix(old), "dumped old log-probs", mask)
    REFERENCE.assert_scores_match(dumped_hinted, as_matrix(hinted), "dumped hinted log-probs", mask)
    # Controls: the hinted log-probs are not the plain ones, and no corrupted forward matches either pass.
    with pytest.raises(AssertionError):
        REFERENCE.assert_scores_match(dumped_hinted, as_matrix(old), "hinted vs plain", mask)
    for corruption in REFERENCE.CORRUPTIONS:
        corrupted_old, corrupted_hinted = rescored_dump(model, dump, vocab_size, corruption)
        with pytest.raises(AssertionError):
            REFERENCE.assert_scores_match(dumped_old, as_matrix(corrupted_old), corruption, mask)
        with pytest.raises(AssertionError):
            REFERENCE.assert_scores_match(dumped_hinted, as_matrix(corrupted_hinted), corruption, mask)

    # Step 2: the policy teacher scores with the weights after step 1's update, not with the starting model (the
    # control of the initial teacher's check in test_initial_teacher_scores_with_the_starting_model).
    step_2 = json.loads((run_dir / "credit" / "step_2.json").read_text())
    _, step_2_hinted, step_2_mask = dumped_scores(step_2)
    after_step_1 = REFERENCE.load_model(
        assets_dir, run_dir / "checkpoints" / "global_step_1" / "actor" / "huggingface" / "model.safetensors"
    )
    REFERENCE.assert_scores_match(
        step_2_hinted, as_matrix(rescored_dump(after_step_1, step_2, vocab_size)[1]), "policy teacher", step_2_mask
    )
    with pytest.raises(AssertionError):
        REFERENCE.assert_scores_match(
            step_2_hinted, as_matrix(rescored_dump(model, step_2, vocab_size)[1]), "policy vs initial", step_2_mask
        )

    initial = load_file(assets_dir / "model" / "model.safetensors")
    trained = load_file(
        run_dir / "checkpoints" / f"global_step_{steps}" / "actor" / "huggingface" / "model.safetensors"
    )
    # Two FSDP ranks save the tied lm_head explicitly (equal to the embedding); every initial tensor is there.
    assert set(initial) <= set(trained) <= {*initial, "lm_head.weight"}
    if "lm_head.weight" in trained:
        assert torch.equal(trained["lm_head.weight"], trained["model.embed_tokens.weight"])
    max_change = max((trained[name].float() - initial[name].float()).abs().max().item() for name in initial)
    assert math.isfinite(max_change) and max_change > 1e-3


@pytest.mark.e2e
@pytest.mark.both_releases
@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_the_two_step_run_put_one_trainer_rank_and_one_server_on_each_node(two_step_run):
    record = two_step_run[3]
    assert len(record.node_ids) == 2
    # SYNC WARNING: verl/single_controller/ray/base.py:create_colocated_worker_cls names the trainer workers' class
    workers = record.actors_named("WorkerDict")
    assert len(workers) == 2, [actor["ActorClassName"] for actor in record.actors]
    assert {worker["Address"]["NodeID"] for worker in workers} == record.node_ids
    assert all(worker["State"] == "DEAD" for worker in workers)  # the run ended and released them
    servers = record.actors_named("HFGenerationServer")
    assert {server["Address"]["NodeID"] for server in servers} == record.node_ids  # one replica per node


#: The teacher runs (``teacher_runs``): steps, seed and overrides of each. Same model, data, settings and seed (so the
#: same step-1 rollouts); they differ in method and teacher.
UNTRUNCATED_SAMPLING = (
    "actor_rollout_ref.rollout.temperature=1.0",
    "actor_rollout_ref.rollout.top_p=1.0",
    "actor_rollout_ref.rollout.top_k=-1",
)
TEACHER_RUNS = {
    # OPSD-token's published teacher: the starting model, held fixed (the reference worker). Its published sampling
    # (τ 1.1, top-p 0.95, top-k 20) is overridden on the command line, so that its step-1 rollouts are the other runs'
    # (the user's override wins over a method's run settings).
    # Its published KL weight 0 leaves the reference pass unread, so the run keeps it for the drift metrics it checks.
    "initial": (
        2,
        0,
        ["cpo.method=opsd_token", "cpo.credit_dump.steps=[1,2]", "cpo.drift_metrics=true", *UNTRUNCATED_SAMPLING],
    ),
    # A teacher refreshed from the actor after every 2nd update: the starting model at steps 1-2, the weights after
    # step 2's update at step 3 (saved by the step-2 checkpoint).
    "refreshed": (
        3,
        0,
        [
            "cpo.teacher=refreshed",
            "cpo.teacher_refresh_steps=2",
            "cpo.credit_dump.steps=[2,3]",
            "trainer.save_freq=2",
            "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]",
        ],
    ),
}


@pytest.fixture(scope="module")
def teacher_runs(context_sensitive_assets_dir, tmp_path_factory):
    """``run(name)``: the :data:`TEACHER_RUNS` run ``name`` on the context-sensitive model (lr 1e-2: the policy moves
    visibly in one step), made on first use and shared by the tests, with its credit dumps and, on verl 0.9.1, its
    rollouts (``trainer.rollout_data_dir``; verl 0.7.1's writer fails on the numpy booleans of the reward's extra
    info); returns (run folder, metrics)."""
    runs = {}

    def run(name):
        if name not in runs:
            steps, seed, overrides = TEACHER_RUNS[name]
            run_dir = tmp_path_factory.mktemp(f"teacher_{name}")
            _, metrics = run_cpo(
                context_sensitive_assets_dir,
                run_dir,
                steps=steps,
                extra=[
                    "actor_rollout_ref.actor.optim.lr=1e-2",
                    "reward.custom_reward_function.name=compute_score_half_correct",
                    f"data.seed={seed}",
                    f"++actor_rollout_ref.rollout.engine_kwargs.hf.seed={seed}",
                    *([f"trainer.rollout_data_dir={run_dir / 'rollouts'}"] if not verl_is("0.7.1") else []),
                    f"cpo.credit_dump.dir={run_dir / 'credit'}",
                    *overrides,
                ],
            )
            runs[name] = run_dir, metrics
        return runs[name]

    return run


def teacher_check(assets_dir, run_dir, step: int, weights=None) -> None:
    """Assert that the hinted log-probs of the step's credit dump are fp32 transformers' under the hint prompt, with
    the starting model or the checkpoint ``weights``."""
    from transformers import AutoTokenizer

    dump = json.loads((run_dir / "credit" / f"step_{step}.json").read_text())
    _, hinted, mask = dumped_scores(dump)
    vocab_size = len(AutoTokenizer.from_pretrained(assets_dir / "model"))
    rescored = rescored_dump(REFERENCE.load_model(assets_dir, weights), dump, vocab_size)[1]
    REFERENCE.assert_scores_match(hinted, as_matrix(rescored), f"hinted log-probs of step {step}", mask)


@pytest.mark.e2e
@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_initial_teacher_scores_with_the_starting_model(teacher_runs, context_sensitive_assets_dir):
    run_dir, metrics = teacher_runs("initial")
    log = (run_dir / "train.log").read_text()
    assert "[cpo] teacher of the hinted pass: initial (published setting of opsd_token" in log
    # The method's run settings were applied, except the sampling the command line set.
    applied = next(line for line in log.splitlines() if "published run settings applied" in line)
    assert "ppo_mini_batch_size=${data.train_batch_size}" in applied and "rollout." not in applied, applied
    for step in (1, 2):
        assert metrics[step]["cpo/teacher/initial"] == 1 and metrics[step]["cpo/teacher_weights_step"] == 0
        assert json.loads((run_dir / "credit" / f"step_{step}.json").read_text())["teacher"] == "initial"
        # At step 2 the policy has taken one update: a policy teacher fails this check (the two-step CPO run).
        teacher_check(context_sensitive_assets_dir, run_dir, step)
        assert math.isfinite(metrics[step]["treetune/drift/old_minus_ref_mean"])
    # Drift from the reference: 0 while the policy is the starting model, then the k1 estimate of KL(old || ref).
    assert abs(metrics[1]["treetune/drift/old_minus_ref_mean"]) < 1e-4
    assert metrics[2]["treetune/drift/old_minus_ref_mean"] > 1e-3


@pytest.mark.e2e
@pytest.mark.both_releases
@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_refreshed_teacher_takes_the_actors_weights_at_the_refresh_step(teacher_runs, context_sensitive_assets_dir):
    run_dir, metrics = teacher_runs("refreshed")
    assert [metrics[step]["cpo/teacher_weights_step"] for step in (1, 2, 3)] == [0, 0, 2]
    assert [metrics[step]["cpo/teacher_refreshed"] for step in (1, 2, 3)] == [0, 0, 1]
    # Step 1 dumps no credit: cpo.hint.rescore=needed scores only the rows seq_kl reads (the wrong responses), and
    # their hint prompts are longer than the plain ones.
    assert metrics[1]["cpo/hint_rows_frac"] == pytest.approx(1 - metrics[1]["cpo/success_frac"])
    assert metrics[1]["cpo/hint_rows_frac"] < metrics[1]["cpo/hint_token_ratio"]
    checkpoint = run_dir / "checkpoints" / "global_step_2" / "actor" / "huggingface" / "model.safetensors"
    teacher_check(context_sensitive_assets_dir, run_dir, 2)  # still the starting model
    teacher_check(context_sensitive_assets_dir, run_dir, 3, checkpoint)  # the actor after step 2
    with pytest.raises(AssertionError):  # control: step 3 is no longer the starting model
        teacher_check(context_sensitive_assets_dir, run_dir, 3)
    with pytest.raises(AssertionError):  # control: nor was step 2 already the refreshed one
        teacher_check(context_sensitive_assets_dir, run_dir, 2, checkpoint)
    # The reference restarts from the actor: the drift from it drops back at the refresh.
    drift = [metrics[step]["treetune/drift/old_minus_ref_mean"] for step in (2, 3)]
    assert abs(drift[1]) < 1e-4 < drift[0], drift


def step_one_rollouts(run_dir) -> list[tuple]:
    """(prompt, response, score) of every step-1 sample, sorted: which row of a prompt group gets which of its
    responses follows their arrival at the hf server (verl numbers its samples for vLLM only)."""
    return sorted(step_rollouts(run_dir, step=1))


@pytest.mark.e2e
@pytest.mark.timeout(3 * RUN_TIMEOUT_S + 120)
def test_one_seed_gives_every_method_the_same_step_one_rollouts(teacher_runs, two_step_run):
    # Two methods (OPSD-token, CPO seq_kl), same seed: identical prompts, responses and rewards in step 1 (each request
    # of the hf server samples from an RNG seeded from the request alone, whatever batch it lands in).
    initial, refreshed = (step_one_rollouts(teacher_runs(name)[0]) for name in ("initial", "refreshed"))
    assert len(initial) == 16 and initial == refreshed
    # Control: a run with another seed (the two-step run, seed 1) draws other prompts or responses.
    assert len(step_one_rollouts(two_step_run[2])) == 16 and step_one_rollouts(two_step_run[2]) != initial


def start_cpo(assets_dir, tmp_path, *overrides, timeout_s=180):
    """Run the entry point expecting it to stop at start-up; returns its combined output."""
    command = [
        sys.executable,
        "-m",
        ENTRY_MODULE,
        "platform=cpu",
        *tiny_run_overrides(assets_dir, tmp_path, total_training_steps=1),
        f"hydra.run.dir={tmp_path / 'hydra'}",
        *overrides,
    ]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=tmp_path)
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "ray.init" not in output and "Started a local Ray instance" not in output  # stopped before Ray
    return output


@pytest.mark.e2e
def test_unknown_method_stops_at_start_up_listing_valid_names(assets_dir, tmp_path):
    output = start_cpo(assets_dir, tmp_path, "cpo.method=seq_kll")
    assert "Unknown cpo.method 'seq_kll'" in output
    assert "Valid values:" in output and "mi_clamp_unify_difficulty" in output and "negonly_tok_kl" in output


@pytest.mark.e2e
def test_invalid_rollout_health_thresholds_stop_at_start_up(assets_dir, tmp_path):
    # The run-health guard is checked for every estimator, before Ray starts.
    output = start_cpo(assets_dir, tmp_path, "algorithm.adv_estimator=grpo", "treetune.rollout_health.warn_kl=2.0")
    assert "treetune.rollout_health.warn_kl=2.0 is above treetune.rollout_health.stop_kl=1.0" in output, output
