"""The Kubernetes backend keeps `nodes()` between cycles and builds a node's NodeInfo
again only when its object, the pods bound to it or fairq's unbound demand on it moved
(`KubernetesBackend.keep_nodes`; docs/performance.md, "Nodes kept between cycles, and
Job creation again"). Held to the plain rebuild of every node each cycle
(`keep_nodes = False`): two backends fed the same random sequences of watch events
through the informers' own code - fairq's pods bound, moved, ended, deleted; other
workloads' pods (their GPUs, CPU and memory, rule A6); Jobs finished, deleted, their
placement changed (the unbound demand); nodes changed (allocatable, GPU type, taints,
readiness, schedulability, spot termination: rules K4, K6), added and deleted; relists
carrying changes the watch missed; the GPU types changed - answer the same nodes at
every cycle, and the kept one builds fewer."""

from __future__ import annotations

import copy
import random
from datetime import timedelta
from typing import Any

import pytest

from queueing.backends.k8s_cache import key_of
from queueing.backends.k8s_manifest import A_PLACEMENT

from .k8s_world import GPU_TYPES, T0, node_object, other_pod, world
from .test_k8s_kept_statuses import Cluster, backend, changed_job, changed_pod, new_workload

NODES = [f"gpu-{i}" for i in range(10)]  # two more than the world has: added later


def changed_node(rng: random.Random, node: dict[str, Any]) -> dict[str, Any]:
    node = copy.deepcopy(node)
    roll = rng.random()
    status, spec, labels = node["status"], node["spec"], node["metadata"]["labels"]
    if roll < 0.2:
        resource = next(k for k in status["allocatable"] if "/" in k)
        status["allocatable"][resource] = str(rng.choice([0, 2, 4, 8]))
    elif roll < 0.3:
        status["allocatable"]["cpu"] = rng.choice(["64", "96", "500m"])
        status["allocatable"]["memory"] = rng.choice(["512Gi", "1Ti"])
    elif roll < 0.4:
        labels["fairq.io/gpu-type"] = rng.choice(["h100", "l40s", "mig", "a10"])
    elif roll < 0.5:
        spec["unschedulable"] = not spec.get("unschedulable")
    elif roll < 0.6:
        for c in status["conditions"]:
            if c["type"] == "Ready":
                c["status"] = rng.choice(["True", "False", "Unknown"])
    elif roll < 0.8:
        labels["karpenter.sh/capacity-type"] = "spot"
        taints = [t for t in spec.get("taints") or ()
                  if t["key"] not in ("cloud.google.com/impending-node-termination",
                                      "node.kubernetes.io/unreachable")]
        if rng.random() < 0.5:
            taints.append({"key": rng.choice(["cloud.google.com/impending-node-termination",
                                              "node.kubernetes.io/unreachable"]),
                           "effect": "NoSchedule"})
        spec["taints"] = taints
    else:
        labels["topology.kubernetes.io/zone"] = f"z{rng.randint(0, 3)}"
    return node


def changed_other(rng: random.Random, pod: dict[str, Any]) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    roll = rng.random()
    if roll < 0.4:
        pod["spec"]["nodeName"] = rng.choice(NODES)
    elif roll < 0.7:
        pod["status"]["phase"] = rng.choice(["Running", "Pending", "Succeeded", "Failed"])
    else:
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        limits["nvidia.com/gpu"] = str(rng.randint(0, 3))
        limits["cpu"] = rng.choice(["1", "2", "250m"])
    return pod


def placed_elsewhere(rng: random.Random, job: dict[str, Any]) -> dict[str, Any]:
    job = copy.deepcopy(job)
    replicas = int(job["metadata"]["annotations"].get("fairq.io/replicas", "1") or 1)
    job["metadata"]["annotations"][A_PLACEMENT] = ",".join(
        rng.choice(NODES) for _ in range(replicas))
    return job


def step(rng: random.Random, cluster: Cluster, backends: list[Any], now: Any,
         next_id: list[int]) -> None:
    """One random change of what `nodes()` reads, sent to every backend alike."""
    roll = rng.random()
    objects = cluster.objects
    pods, jobs, nodes, others = (objects["pods"], objects["jobs"], objects["nodes"],
                                 objects["other_pods"])
    if roll < 0.2 and pods:
        cluster.send("pods", "MODIFIED", changed_pod(rng, pods[rng.choice(sorted(pods))], now))
    elif roll < 0.25 and pods:
        cluster.send("pods", "DELETED", pods[rng.choice(sorted(pods))])
    elif roll < 0.33 and jobs:
        cluster.send("jobs", "MODIFIED", changed_job(rng, jobs[rng.choice(sorted(jobs))], now))
    elif roll < 0.4 and jobs:
        cluster.send("jobs", "MODIFIED",
                     placed_elsewhere(rng, jobs[rng.choice(sorted(jobs))]))
    elif roll < 0.43 and jobs:
        cluster.send("jobs", "DELETED", jobs[rng.choice(sorted(jobs))])
    elif roll < 0.5:
        new_jobs, new_pods = new_workload(rng, next_id[0], now)
        next_id[0] += 1
        for job in new_jobs:
            cluster.send("jobs", "ADDED", job)
        for pod in new_pods:
            pod["spec"]["nodeName"] = rng.choice(NODES) if rng.random() < 0.5 else None
            cluster.send("pods", "ADDED", pod)
    elif roll < 0.6 and others:
        cluster.send("other_pods", "MODIFIED",
                     changed_other(rng, others[rng.choice(sorted(others))]))
    elif roll < 0.65:
        pod = other_pod(rng, next_id[0], NODES)
        next_id[0] += 1
        cluster.send("other_pods", "ADDED", pod)
    elif roll < 0.68 and others:
        cluster.send("other_pods", "DELETED", others[rng.choice(sorted(others))])
    elif roll < 0.8 and nodes:
        cluster.send("nodes", "MODIFIED", changed_node(rng, nodes[rng.choice(sorted(nodes))]))
    elif roll < 0.83:
        name = rng.choice(NODES)
        if name in nodes:
            cluster.send("nodes", "DELETED", nodes[name])
        else:
            cluster.send("nodes", "ADDED",
                         node_object(name, rng.choice(["h100", "l40s", "mig"]),
                                     rng.choice([4, 8]), rng))
    elif roll < 0.94:
        # Changes the watch missed, found by a relist.
        kind = rng.choice(["pods", "jobs", "other_pods", "nodes"])
        changed = {"pods": lambda o: changed_pod(rng, o, now),
                   "jobs": lambda o: changed_job(rng, o, now),
                   "other_pods": lambda o: changed_other(rng, o),
                   "nodes": lambda o: changed_node(rng, o)}[kind]
        held = objects[kind]
        for key in rng.sample(sorted(held), min(3, len(held))):
            if rng.random() < 0.3:
                cluster.missed(kind, held[key], delete=True)
            else:
                cluster.missed(kind, changed(held[key]))
        for b in backends:
            cluster.relist(b, kind)
    else:
        types = rng.choice([GPU_TYPES, GPU_TYPES[:2], GPU_TYPES[1:]])
        for b in backends:
            b._gpu_types_source = types


@pytest.mark.parametrize("seed", range(10))
def test_the_kept_nodes_are_the_nodes_rebuilt_each_cycle(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    kept, plain = backend(monkeypatch, keep=True), backend(monkeypatch, keep=False)
    cluster = Cluster(world(seed, workloads=30, others=10), [kept, plain])
    next_id = [1000]
    now = T0
    cycles, listed = 60, 0
    for cycle in range(cycles):
        for _ in range(rng.choice([0, 0, 1, 1, 2, 5])):
            step(rng, cluster, [kept, plain], now, next_id)
        answer = plain.nodes()
        assert kept.nodes() == answer, f"cycle {cycle}"
        listed += len(cluster.objects["nodes"])
        now += timedelta(seconds=rng.choice([0, 1, 5, 30]))
    assert plain.node_builds == 0
    # Far fewer NodeInfos built than nodes read: most cycles change a node or two.
    assert kept.node_builds < listed * 0.5, (kept.node_builds, listed)


def test_a_cycle_without_events_builds_no_node_and_a_pod_builds_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kept = backend(monkeypatch, keep=True)
    cluster = Cluster(world(4, workloads=30, others=10), [kept])
    first = kept.nodes()
    assert first and kept.node_builds == len(cluster.objects["nodes"])
    kept.node_builds = 0
    assert kept.nodes() == first
    assert kept.node_builds == 0
    # Another workload's pod lands on a node: that node alone is built, its GPUs counted.
    target = first[0]
    pod = other_pod(random.Random(1), 99, [target.name])
    pod["status"]["phase"] = "Running"
    cluster.send("other_pods", "ADDED", pod)
    after = kept.nodes()
    assert kept.node_builds == 1
    [moved] = [n for n in after if n.name == target.name]
    assert moved.allocated > target.allocated
    assert [n for n in after if n.name != target.name] == \
        [n for n in first if n.name != target.name]
    assert key_of(pod) in {k for _, k in kept._on_node[target.name]}
