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
"""End to end on CPU: the CPO recipe with ``trainer.nnodes=2`` on a two-node Ray cluster started on this machine.

The cluster is Ray's own multi-node test harness (``ray.cluster_utils.Cluster``): a head and a worker node, each a
separate raylet with its own logical resources (8 CPUs, a fake GPU for verl's cluster-wide check and one unit of the
``cpu`` resource that verl's placement bundles ask for), so one trainer rank fits on each node and no more. The run
attaches to it as a multi-node GPU run does (``RAY_ADDRESS``, no ``ray_init`` resources). Ray's GCS actor table then
tells on which node each trainer worker ran. The cluster is stopped through the processes the fixture started
(``Cluster.shutdown``), never with ``ray stop``.
"""

import math

import pytest
import ray
from ray._common.utils import reset_ray_address
from ray.cluster_utils import Cluster

from treetune_recipe.cpo.cpu_run import launch_cpo_on_cpu
from treetune_tests.support.runs import finished_run_metrics
from treetune_verl.tiny_assets import build_tiny_assets

RUN_TIMEOUT_S = 600
STEPS = 2
NODE_RESOURCES = dict(num_cpus=8, num_gpus=1, resources={"cpu": 1}, object_store_memory=300 * 1024**2)


@pytest.fixture(scope="module")
def two_node_run(tmp_path_factory):
    """One CPO run over two Ray nodes; yields the run, its metrics, the cluster's node ids and its actor table."""
    assets_dir = build_tiny_assets()
    run_dir = tmp_path_factory.mktemp("multinode")
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # the same auth mode for every node and the driver
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cluster = Cluster(initialize_head=True, head_node_args=NODE_RESOURCES, shutdown_at_exit=True)
    try:
        cluster.add_node(**NODE_RESOURCES)
        cluster.wait_for_nodes()
        overrides = [
            "actor_rollout_ref.rollout.n=4",
            "trainer.nnodes=2",
            "trainer.n_gpus_per_node=1",
            # Attaching to a running cluster: ray.init must not be given resources (they are the nodes').
            "ray_kwargs.ray_init.num_cpus=null",
            "ray_kwargs.ray_init.num_gpus=null",
            "ray_kwargs.ray_init.resources=null",
        ]
        run = launch_cpo_on_cpu(
            overrides,
            run_dir / "train.log",
            assets_dir=assets_dir,
            run_dir=run_dir,
            total_training_steps=STEPS,
            experiment_name="e2e_multinode",
            timeout_s=RUN_TIMEOUT_S,
            env={"RAY_ADDRESS": cluster.address, "RAY_AUTH_MODE": "disabled"},
        )
        ray.init(address=cluster.address)
        try:
            node_ids = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
            # The GCS actor table keeps finished actors with the node each one ran on.
            actors = list(ray._private.state.actors().values())
        finally:
            ray.shutdown()
        yield dict(run=run, run_dir=run_dir, node_ids=node_ids, actors=actors)
    finally:
        cluster.shutdown()
        # Cluster wrote its address to Ray's ray_current_cluster file; a later plain ray.init() on this machine
        # would try to join that dead cluster.
        reset_ray_address()
        monkeypatch.undo()


@pytest.mark.e2e
@pytest.mark.timeout(RUN_TIMEOUT_S + 180)
def test_two_node_run_finishes_every_step(two_node_run):
    metrics = finished_run_metrics(two_node_run["run"], two_node_run["run_dir"], STEPS)
    for step, values in metrics.items():
        for key in ("cpo/gw_minus_old_absmean", "actor/cpo/adv_delta_absmean", "actor/pg_loss", "actor/grad_norm"):
            assert key in values and math.isfinite(values[key]), (step, key)


@pytest.mark.e2e
@pytest.mark.timeout(RUN_TIMEOUT_S + 180)
def test_trainer_workers_ran_on_both_nodes_and_finished(two_node_run):
    assert len(two_node_run["node_ids"]) == 2
    # SYNC WARNING: verl/single_controller/ray/base.py:create_colocated_worker_cls names the trainer workers' class
    workers = [actor for actor in two_node_run["actors"] if "WorkerDict" in actor["ActorClassName"]]
    assert len(workers) == 2, [actor["ActorClassName"] for actor in two_node_run["actors"]]
    assert {worker["Address"]["NodeID"] for worker in workers} == two_node_run["node_ids"]
    assert all(worker["State"] == "DEAD" for worker in workers)  # the run ended and released them
    servers = [actor for actor in two_node_run["actors"] if actor["ActorClassName"] == "HFGenerationServer"]
    assert {server["Address"]["NodeID"] for server in servers} == two_node_run["node_ids"]  # one replica per node
