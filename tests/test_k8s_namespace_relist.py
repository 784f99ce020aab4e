"""A team namespace's watches listed again on their own (a resync, a 410 in that
namespace): the worker watches each team namespace apart (`teams`: one informer per
namespace, docs/kubernetes.md "RBAC"), so a relist moves one namespace's count, and
`statuses()` visits again that namespace's Jobs only (`KubernetesBackend.keep_visits`;
docs/performance.md "Statuses: the passes over every status"). Held to the plain rebuild
(`keep_statuses = False`) and to the kept statuses visiting every Job
(`keep_visits = False`): three backends fed the same random events, in three namespaces,
with relists of one namespace carrying changes the watch missed there, answer the same
statuses at every cycle; and a namespace listed again marks its own Jobs, no others."""

from __future__ import annotations

import copy
import json
import random
from datetime import timedelta
from typing import Any

import pytest

from queueing.backends.k8s_cache import key_of

from .k8s_world import T0, World, workload, world
from .test_k8s_kept_statuses import (
    Cluster,
    _Resp,
    answered,
    backend,
    changed_job,
    changed_pod,
    failed_create,
    new_workload,
    run_clock,
)

TEAMS = ("vision", "nlp", "audio")
NAMESPACES = tuple(f"fairq-{t}" for t in TEAMS)
OTHERS = "inference"  # where the world's other workloads' pods are


def namespaced_world(seed: int, workloads: int = 30) -> World:
    """`world`'s nodes and other pods; its workloads spread over the team namespaces."""
    rng = random.Random(seed)
    w = world(seed, workloads=0)
    nodes = [n["metadata"]["name"] for n in w.nodes]
    for job_id in range(1, workloads + 1):
        jobs, pods = workload(rng, job_id, nodes, namespace=rng.choice(NAMESPACES))
        if rng.random() < 0.1:  # its Jobs gone (deleted outside fairq): pods left
            jobs = []
        w.jobs.extend(jobs)
        w.pods.extend(pods)
    return w


def namespaced(monkeypatch: pytest.MonkeyPatch, *, keep: bool) -> Any:
    return backend(monkeypatch, keep=keep, teams=lambda: TEAMS,
                   other_pod_namespaces=(OTHERS,))


class NamespacedCluster(Cluster):
    """`Cluster` for backends with one watch per namespace: a change goes to its
    namespace's informer; a namespace can be listed again alone (`relist_namespace`)."""

    def group(self, backend: Any, kind: str) -> Any:
        return super().informer(backend, kind)

    def relist(self, backend: Any, kind: str) -> None:
        group = self.group(backend, kind)
        if not hasattr(group, "add"):  # the nodes: cluster-wide
            super().relist(backend, kind)
            return
        for namespace in (*NAMESPACES, OTHERS) if kind == "other_pods" else NAMESPACES:
            self.relist_namespace(backend, kind, namespace)

    def relist_namespace(self, backend: Any, kind: str, namespace: str) -> None:
        informer = self.group(backend, kind).add(namespace)
        body = {"metadata": {"resourceVersion": str(self.version)},
                "items": [o for o in self.objects[kind].values()
                          if o["metadata"]["namespace"] == namespace]}
        informer._list = lambda **kw: _Resp(json.dumps(body).encode())
        informer.relist()

    def watcher(self, backend: Any, kind: str, obj: dict[str, Any]) -> Any:
        group = self.group(backend, kind)
        return group.add(obj["metadata"]["namespace"]) if hasattr(group, "add") else group


def step(rng: random.Random, cluster: NamespacedCluster, backends: list[Any], now: Any,
         next_id: list[int]) -> None:
    """One random change, sent to every backend alike; a relist is of one namespace."""
    roll = rng.random()
    pods, jobs = cluster.objects["pods"], cluster.objects["jobs"]
    if roll < 0.2 and pods:
        pod = pods[rng.choice(sorted(pods))]
        cluster.send("pods", "MODIFIED", changed_pod(rng, pod, now))
    elif roll < 0.27 and pods:
        cluster.send("pods", "DELETED", pods[rng.choice(sorted(pods))])
    elif roll < 0.37 and jobs:
        cluster.send("jobs", "MODIFIED", changed_job(rng, jobs[rng.choice(sorted(jobs))], now))
    elif roll < 0.42 and jobs:
        cluster.send("jobs", "DELETED", jobs[rng.choice(sorted(jobs))])
    elif roll < 0.52:
        new_jobs, new_pods = new_workload(rng, next_id[0], now,
                                          namespace=rng.choice(NAMESPACES))
        next_id[0] += 1
        for job in new_jobs:
            cluster.send("jobs", "ADDED", job)
        for pod in new_pods:
            cluster.send("pods", "ADDED", pod)
    elif roll < 0.8:
        # One namespace's pods, Jobs or both listed again, with changes its watch missed
        # (or none: a resync).
        namespace = rng.choice(NAMESPACES)
        kinds = rng.choice([["pods"], ["jobs"], ["jobs", "pods"]])
        for kind in kinds:
            objects = cluster.objects[kind]
            mine = sorted(k for k, o in objects.items()
                          if o["metadata"]["namespace"] == namespace)
            for key in rng.sample(mine, min(rng.choice([0, 1, 3]), len(mine))):
                if rng.random() < 0.3:
                    cluster.missed(kind, objects[key], delete=True)
                elif kind == "pods":
                    cluster.missed(kind, changed_pod(rng, objects[key], now))
                else:
                    cluster.missed(kind, changed_job(rng, objects[key], now))
            for b in backends:
                cluster.relist_namespace(b, kind, namespace)
    elif roll < 0.88 and jobs:
        key = rng.choice(sorted(jobs))
        event = failed_create(rng, key, now)
        for b in backends:
            b.events.add(key.split("/", 1)[0])._store[key_of(event)] = event
    elif jobs:
        name = jobs[rng.choice(sorted(jobs))]["metadata"]["name"]
        how = rng.choice(["stop", "hide", "unhide"])
        finished = now - timedelta(seconds=rng.choice([10, 7200]))
        for b in backends:
            if how == "stop":
                b.tracker.stop_asked(name)
            elif how == "hide":
                b.tracker.hide(name, finished)
            else:
                b.tracker.unhide(name)


@pytest.mark.parametrize("seed", range(8))
def test_a_namespace_listed_again_gives_the_statuses_rebuilt_each_cycle(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    clock = run_clock(monkeypatch)
    marked = namespaced(monkeypatch, keep=True)
    every = namespaced(monkeypatch, keep=True)
    every.keep_visits = False
    plain = namespaced(monkeypatch, keep=False)
    backends = [marked, every, plain]
    cluster = NamespacedCluster(namespaced_world(seed), backends)
    next_id = [1000]
    now = T0
    for cycle in range(50):
        for _ in range(rng.choice([0, 1, 1, 2, 4])):
            step(rng, cluster, backends, now, next_id)
        want = answered(plain, now)
        assert answered(marked, now) == want, f"cycle {cycle}"
        assert answered(every, now) == want, f"cycle {cycle}"
        now += timedelta(seconds=rng.choice([0, 0, 1, 5, 30, 90, 200]))
        clock[0] = now
    # One watch per namespace, and the marked Jobs' visits were the ones that ran.
    assert sorted(marked.jobs.relist_counts()) == sorted(NAMESPACES)
    assert marked._visits is not None
    assert marked.job_visits < every.job_visits * 0.7, (marked.job_visits, every.job_visits)


def test_a_namespace_listed_again_visits_its_own_jobs_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A namespace's Jobs or pods listed again, unchanged, visit that namespace's Jobs
    and those visited every cycle; a change the watch missed there is answered."""
    b = namespaced(monkeypatch, keep=True)
    plain = namespaced(monkeypatch, keep=False)
    cluster = NamespacedCluster(namespaced_world(5, workloads=45), [b, plain])
    first = answered(b, T0)
    assert first == answered(plain, T0)
    assert b._visits is not None
    b.job_visits = 0
    assert answered(b, T0) == first
    often = set(b._visits.often)
    assert b.job_visits == len(often)
    for kind in ("jobs", "pods"):
        for namespace in NAMESPACES:
            own = {k for k, o in cluster.objects["jobs"].items()
                   if o["metadata"]["namespace"] == namespace}
            assert own and own != set(cluster.objects["jobs"])
            cluster.relist_namespace(b, kind, namespace)
            b.job_visits = 0
            assert answered(b, T0) == first
            assert b.job_visits == len(own | often), (kind, namespace)
    # A change only the relist brings: a running workload's container restarted.
    running = {s.name for s in first if s.phase == "RUNNING"}
    pod = next(p for p in cluster.objects["pods"].values()
               if p["metadata"]["namespace"] == NAMESPACES[1]
               and p["metadata"]["labels"]["fairq.io/workload"] in running
               and p["status"].get("containerStatuses"))
    changed = copy.deepcopy(pod)
    changed["status"]["containerStatuses"][0]["restartCount"] += 1
    cluster.missed("pods", changed)
    for each in (b, plain):
        cluster.relist_namespace(each, "pods", NAMESPACES[1])
    after = answered(b, T0)
    assert after == answered(plain, T0)
    assert after != first
