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
"""End to end on CPU: the distribution-level methods (OPSD, SDPO: losses that read top-k distributions) trained by the
CPO recipe's entry point with their published settings on the context-sensitive tiny model, two steps each, checked
from each run's outputs (metrics, log, the credit dump of step 2). Each run is made once, on first use
(``distribution_runs``). The CPO runs and the start-up checks are in ``test_cpo_cpu_e2e_on_cpu.py``.

The teacher runs inside the update, beside the student, on the worker: what the driver hands ``update_actor``
(``treetune/update_actor_mb``) stays below the size of the per-id tensors the former teacher pass shipped (ids and
log-probs, 12 bytes per id, per response token), and the reference's log-prob pass, unread at the published KL weight
0, does not run.
"""

import json

import pytest

from treetune_tests.support.cpo_runs import ROLLOUT_KL_MAX, RUN_TIMEOUT_S, run_cpo
from treetune_tests.support.fp32_reference import load_model

#: Two-step runs of the methods whose loss reads top-k distributions, with their published settings (OPSD: initial
#: teacher, τ 1.1, top-p 0.95, top-k 20, one update per batch; SDPO: EMA teacher, successful-sibling context, k 100).
DISTRIBUTION_RUNS = {
    "opsd": ["cpo.method=opsd", "cpo.credit_dump.steps=[2]"],
    "sdpo": ["cpo.method=sdpo", "cpo.credit_dump.steps=[2]"],
}


@pytest.fixture(scope="module")
def distribution_runs(context_sensitive_assets_dir, tmp_path_factory):
    """``run(name)``: the :data:`DISTRIBUTION_RUNS` run ``name`` (2 steps, lr 1e-2, about half the responses
    correct), made on first use; returns (run folder, metrics)."""
    runs = {}

    def run(name):
        if name not in runs:
            run_dir = tmp_path_factory.mktemp(f"method_{name}")
            _, metrics = run_cpo(
                context_sensitive_assets_dir,
                run_dir,
                steps=2,
                extra=[
                    "actor_rollout_ref.actor.optim.lr=1e-2",
                    "reward.custom_reward_function.name=compute_score_half_correct",
                    f"cpo.credit_dump.dir={run_dir / 'credit'}",
                    *DISTRIBUTION_RUNS[name],
                ],
            )
            runs[name] = run_dir, metrics
        return runs[name]

    return run


def assert_no_per_id_tensor_reached_the_update(metrics: dict, ids_per_token: int) -> None:
    """The batch handed to ``update_actor`` is smaller than one ``[rows, response width, ids]`` pair of ids and
    log-probs (what a teacher pass before the update has to send through the driver); and the unread reference pass
    was skipped (no drift metric, no KL term)."""
    rows, width = metrics["treetune/update_actor_rows"], metrics["treetune/update_actor_width"]
    per_id_tensors_mb = rows * width * ids_per_token * 12 / 2**20
    assert 0 < metrics["treetune/update_actor_mb"] < per_id_tensors_mb, (metrics["treetune/update_actor_mb"], rows)
    assert "treetune/drift/old_minus_ref_mean" not in metrics and "actor/kl_loss" not in metrics


def teacher_distribution(model, prompt_ids, token_ids, vocab_size: int, temperature: float):
    """fp32 transformers' log-softmax (at ``temperature``, over the tokenizer's ids) before each response token."""
    import torch

    with torch.no_grad():
        ids = torch.tensor([*prompt_ids, *token_ids])[None]
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1, :vocab_size].float()
    return torch.log_softmax(logits / temperature, dim=-1)


@pytest.mark.e2e
@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_opsd_trains_on_the_jsd_over_the_initial_teachers_distribution(distribution_runs, context_sensitive_assets_dir):
    import torch
    from transformers import AutoTokenizer

    run_dir, metrics = distribution_runs("opsd")
    log = (run_dir / "train.log").read_text()
    assert "opsd: published run settings applied:" in log and "rollout.top_k=20" in log
    assert "the rollout samples a truncated distribution (top_k=20, top_p=0.95)" in log  # the guard only logs
    vocab_size = len(AutoTokenizer.from_pretrained(context_sensitive_assets_dir / "model"))
    for step in (1, 2):
        step_metrics = metrics[step]
        assert step_metrics["actor/pg_loss"] == 0 and step_metrics["actor/distill_loss"] > 0  # JSD replaces the PG loss
        assert step_metrics["cpo/teacher/initial"] == 1 and step_metrics["cpo/context_frac"] == 1
        assert step_metrics["cpo/topk_k"] == 0  # top_k 0: the whole vocabulary, the published default
        assert_no_per_id_tensor_reached_the_update(step_metrics, vocab_size)
        # The hf rollout honours top-k and top-p: its log-probs are of the truncated distribution, the trainer's of the
        # whole one (both at τ 1.1), so they disagree above the warn level, where an untruncated run agrees to ~1e-8.
        assert step_metrics["rollout_corr/kl"] > ROLLOUT_KL_MAX
    # The teacher's top ids and log-probs of the dump are fp32 transformers' under the hint prompt at τ 1.1; under the
    # plain prompt (control) they are not.
    dump = json.loads((run_dir / "credit" / "step_2.json").read_text())
    model = load_model(context_sensitive_assets_dir)
    errors = {"hint_prompt_ids": 0.0, "prompt_ids": 0.0}
    for row in dump["rows"][:8]:
        for prompt_key in errors:
            expected = teacher_distribution(model, row[prompt_key], row["token_ids"], vocab_size, 1.1)
            for position, shown in enumerate(row["teacher_topk"]):
                ids = torch.tensor([entry[0] for entry in shown])
                got = torch.tensor([entry[2] for entry in shown])
                errors[prompt_key] = max(errors[prompt_key], (expected[position, ids] - got).abs().max().item())
                if prompt_key == "hint_prompt_ids":
                    assert ids.tolist() == expected[position].topk(len(ids)).indices.tolist() or (
                        (expected[position].topk(len(ids)).values - got).abs().max() < 1e-4  # ties
                    )
        assert len(row["token_loss"]) == len(row["token_ids"]) and min(row["token_loss"]) >= 0
    assert errors["hint_prompt_ids"] < 1e-4 < 0.05 < errors["prompt_ids"], errors


@pytest.mark.e2e
@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_sdpo_distils_from_a_successful_sibling_with_an_ema_teacher(distribution_runs):
    run_dir, metrics = distribution_runs("sdpo")
    log = (run_dir / "train.log").read_text()
    assert "[cpo] teacher of the hinted pass: ema (published setting of sdpo" in log
    assert "algorithm.rollout_correction.rollout_is=token" in log
    # The EMA teacher scores step 1 with the starting model and step 2 with the average that took step 1's update.
    assert [metrics[step]["cpo/teacher_weights_step"] for step in (1, 2)] == [0, 1]
    assert [metrics[step]["cpo/teacher_refreshed"] for step in (1, 2)] == [0, 1]
    dump = json.loads((run_dir / "credit" / "step_2.json").read_text())
    rows_by_group = {}
    for row in dump["rows"]:
        rows_by_group.setdefault(row["uid"], []).append(row)
    for step in (1, 2):
        assert metrics[step]["actor/pg_loss"] == 0 and metrics[step]["cpo/topk_k"] == 100
        assert metrics[step]["cpo/context_frac"] > 0  # about half correct: most groups have a second success
        assert metrics[step]["actor/distill_loss"] > 0
        # The student's top-k ids come from the update's own logits; the rollout agrees with the trainer as in any
        # healthy run, and the loss is weighted by the rollout importance ratio as published (rollout_is=token).
        assert_no_per_id_tensor_reached_the_update(metrics[step], 100)
        assert abs(metrics[step]["rollout_corr/kl"]) < ROLLOUT_KL_MAX
    # In the dump: a row has a teacher context exactly when another row of its group succeeded (the dump keeps rows of
    # every kind, so some groups are shown in part: check the rule where the dump shows a success other than the row).
    for row in dump["rows"]:
        others_succeeded = any(o["reward"] == 1 and o["row"] != row["row"] for o in rows_by_group[row["uid"]])
        if others_succeeded:
            assert row["has_context"], row["row"]
            assert (
                "Correct solution:" in row["hint_prompt"]
                and "Correctly solve the original question." in row["hint_prompt"]
            )
        if row["kind"] in ("all_wrong",):
            assert not row["has_context"] and row["hint_prompt"] == row["prompt"]
