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
"""One distribution-level actor update with the in-update teacher, run by ``world`` processes over gloo (CPU), as verl's
data-parallel workers run it: each rank holds a contiguous share of the rows (verl's dispatch), the actor and the
reference are FSDP-sharded over the ranks, and the teacher's forward runs on every rank for every micro-batch.

Used by ``treetune_tests/treetune_recipe/cpo/test_distribution_loss_ranks_on_cpu.py``: :func:`run_updates` spawns the
ranks, which run one update per method and set of rows from the same weights, and returns rank 0's report of each
(the update's metrics and the updated weights).
"""

from __future__ import annotations

import json
import os
import socket
from functools import partial
from pathlib import Path

import torch

from treetune_tests.support.fp32_reference import BATCH

#: Every row of the batch, and the first rank's half of them.
ALL_ROWS, HALF_ROWS = list(range(BATCH)), list(range(BATCH // 2))
#: Rows with a teacher context in the update (some rows without one, on both ranks).
CONTEXT = (1, 0, 1, 1, 1, 0, 1, 1)


def _rank_main(
    rank: int, world: int, port: int, assets_dir: str, methods: list[str], row_sets: list[list[int]], out: str
) -> None:
    import verl_cpu.activate  # noqa: F401  (as in every Ray process of a CPU run)
    from transformers import AutoTokenizer
    from verl import DataProto
    from verl.utils import tensordict_utils as tu

    from treetune_recipe.cpo.methods.loss import CONTEXT_MASK, cpo_ppo_loss
    from treetune_tests.support import distribution_harness as checks
    from treetune_tests.support import engine_harness as harness
    from treetune_tests.support.shards import load_shards, local_shards
    from treetune_verl.update_teacher import UpdateTeacher, teacher_columns

    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip
    torch.manual_seed(0)
    model_path = Path(assets_dir) / "model"
    # Fixed micro-batches of 2 rows: each rank's share is several micro-batches, the same count on every rank.
    config = checks.compose_config(model_path, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2")
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    plain, hint = checks.plain_and_hint_batches(model_path, tokenizer, config)
    tensors = plain.batch.clone()
    tensors.update(teacher_columns(hint))
    tensors[CONTEXT_MASK] = torch.tensor(CONTEXT, dtype=torch.float32)
    # A fixed old policy of -3 nats per token: SDPO's weight min(π/π_old, 2) is not 1 (clipped where log π > -2.3).
    tensors["old_log_probs"] = -3.0 * tensors["response_mask"].float()
    batch = DataProto(batch=tensors, non_tensor_batch=plain.non_tensor_batch, meta_info=dict(plain.meta_info))
    actor, actor_config = harness.actor_worker(config, checks.cpo_config(methods[0]))
    ref = harness.ref_worker(config)
    start = local_shards(actor.engine.module)
    reports = {}
    for method, rows in ((method, rows) for method in methods for rows in row_sets):
        share = len(rows) // world
        mine = batch.select_idxs(torch.tensor(rows[rank * share : (rank + 1) * share]))
        load_shards(actor.engine.module, start)
        actor.engine.optimizer.state.clear()  # each method's update starts from the same weights and a fresh Adam
        teacher = UpdateTeacher(ref.engine, name="reference teacher")
        cpo = checks.cpo_config(method)
        actor.set_loss_fn(partial(cpo_ppo_loss, config=actor_config, cpo=cpo, teacher=teacher))
        data = harness.update_request(mine, distillation_use_topk=True)
        tu.assign_non_tensor(data, global_batch_size=len(rows), mini_batch_size=len(rows))
        with ref.engine.eval_mode():
            output = actor.train_mini_batch(data)
        # The updated actor: its full parameters (gathered over the ranks), flattened.
        flat = torch.cat([
            (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().float().flatten()
            for p in actor.engine.module.parameters()
        ])  # fmt: skip
        if rank == 0:
            metrics = tu.get(output, "metrics")
            report = {
                "distill_loss": float(sum(torch.as_tensor(metrics["actor/distill_loss"]).flatten().tolist())),
                "grad_norm": float(torch.as_tensor(metrics["grad_norm"]).flatten()[0]),
                "teacher_forwards": teacher.forwards,
            }
            reports[method, len(rows)] = {"report": report, "weights": flat}
    if rank == 0:
        torch.save(reports, out)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def run_updates(assets_dir: Path, methods: list[str], world: int, row_sets: list[list[int]], out_dir: Path) -> dict:
    """Spawn ``world`` ranks that run, per method and per set of rows, one update from the same starting weights;
    returns rank 0's ``{(method, rows): {"report": {...}, "weights": flat tensor}}``."""
    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = str(out_dir / f"ranks_{world}.pt")
    mp.spawn(_rank_main, args=(world, port, str(assets_dir), methods, row_sets, out), nprocs=world, join=True)
    results = torch.load(out, weights_only=False)
    print(json.dumps({f"{method} {rows} rows": result["report"] for (method, rows), result in results.items()}))
    return results
