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
"""A two-node Ray cluster on one machine, for runs that must span nodes as a multi-node GPU run does.

The cluster is Ray's own multi-node test harness (``ray.cluster_utils.Cluster``): a head and a worker node, each a
separate raylet with its own logical resources (:data:`NODE_RESOURCES`: 8 CPUs, a fake GPU for verl's cluster-wide
check and one unit of the ``cpu`` resource that verl's placement bundles ask for), so one trainer rank fits on each
node and no more. A run attaches to it through :func:`attach_overrides` and :func:`attach_env`. The cluster is stopped
through the processes it started (``Cluster.shutdown``), never with ``ray stop``, which would end every Ray process on
the machine.
"""

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

NODE_RESOURCES = dict(num_cpus=8, num_gpus=1, resources={"cpu": 1}, object_store_memory=300 * 1024**2)
NODES = 2


@dataclass(frozen=True)
class ClusterRecord:
    """What the cluster knew after a run: its live nodes and the GCS actor table (finished actors included, each with
    the node it ran on)."""

    node_ids: set[str]
    actors: list[dict]

    def actors_named(self, fragment: str) -> list[dict]:
        return [actor for actor in self.actors if fragment in actor["ActorClassName"]]


@contextlib.contextmanager
def two_node_cluster() -> Iterator[str]:
    """Start the cluster; yields its address. Every node and the driver run with the same auth mode."""
    from ray._common.utils import reset_ray_address
    from ray.cluster_utils import Cluster

    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        cluster = Cluster(initialize_head=True, head_node_args=NODE_RESOURCES, shutdown_at_exit=True)
        try:
            for _ in range(NODES - 1):
                cluster.add_node(**NODE_RESOURCES)
            cluster.wait_for_nodes()
            yield cluster.address
        finally:
            cluster.shutdown()
            # Cluster wrote its address to Ray's ray_current_cluster file; a later plain ray.init() on this machine
            # would try to join that dead cluster.
            reset_ray_address()


def attach_overrides() -> list[str]:
    """Overrides of a run with one trainer rank per node: a run attached to a cluster gives ``ray.init`` no resources
    (they are the nodes')."""
    return [
        f"trainer.nnodes={NODES}",
        "trainer.n_gpus_per_node=1",
        "ray_kwargs.ray_init.num_cpus=null",
        "ray_kwargs.ray_init.num_gpus=null",
        "ray_kwargs.ray_init.resources=null",
    ]


def attach_env(address: str) -> dict[str, str]:
    return {"RAY_ADDRESS": address, "RAY_AUTH_MODE": "disabled"}


def cluster_record(address: str, ended: str = "WorkerDict", settle_s: float = 60.0) -> ClusterRecord:
    """Read the live nodes and the actor table of the cluster at ``address`` (a short-lived driver of its own).

    A finished run's actors are released asynchronously (the driver's exit reaches the cluster's GCS, which then ends
    the actors it owned), so the table is read again, for up to ``settle_s`` seconds, until no actor of class
    ``ended`` is alive any more; the caller asserts on what it finally holds.
    """
    import ray

    ray.init(address=address)
    try:
        node_ids = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
        deadline = time.monotonic() + settle_s
        while True:
            actors = list(ray._private.state.actors().values())
            alive = [a for a in actors if a["ActorClassName"].endswith(ended) and a["State"] != "DEAD"]
            if not alive or time.monotonic() > deadline:
                return ClusterRecord(node_ids=node_ids, actors=actors)
            time.sleep(1)
    finally:
        ray.shutdown()
