"""The Kubernetes backend keeps each workload's status between cycles and rebuilds it
only when one of its inputs moved (`KubernetesBackend.keep_statuses`; docs/performance.md,
"The cycle's statuses kept between cycles"). Held to the plain rebuild of every status
each cycle (`keep_statuses = False`): two backends fed the same random sequences of watch
events through the informers' own code (adds, modifies and deletes of Jobs and pods,
relists that carry changes the watch missed), tracker changes (stops asked, Jobs hidden,
spot nodes reclaimed, rule K6), the Job controller's FailedCreate events, and time
passing across every deadline a status reads (an image pull, a pod never created, a
replica's Job never created) answer the same statuses at every cycle."""

from __future__ import annotations

import copy
import json
import random
import time
from datetime import datetime, timedelta
from typing import Any

import pytest

from queueing.backends.k8s_cache import key_of

from .k8s_world import GPU_TYPES, KEY, T0, iso, pod_status, workload, world


class _Resp:
    def __init__(self, data: bytes = b"", lines: list[bytes] | None = None) -> None:
        self.data = data
        self._lines = lines or []

    def stream(self, amt: Any = None, decode_content: bool = False) -> Any:
        yield from self._lines

    def release_conn(self) -> None:
        pass

    def close(self) -> None:
        pass


class Cluster:
    """The API server's side: the objects as they are now, each change sent to every
    backend through its informer's watch (`_watch`) or list (`relist`)."""

    def __init__(self, w: Any, backends: list[Any]) -> None:
        self.objects = {"jobs": {key_of(o): o for o in w.jobs},
                        "pods": {key_of(o): o for o in w.pods},
                        "nodes": {key_of(o): o for o in w.nodes},
                        "other_pods": {key_of(o): o for o in w.other_pods}}
        self.backends = backends
        self.version = 10**7
        self.events: list[dict[str, Any]] = []
        for backend in backends:
            for kind in ("jobs", "pods", "nodes", "other_pods"):
                self.relist(backend, kind)

    def informer(self, backend: Any, kind: str) -> Any:
        return {"jobs": backend.jobs, "pods": backend.pods,
                "nodes": backend.nodes_informer, "other_pods": backend.other_pods}[kind]

    def relist(self, backend: Any, kind: str) -> None:
        informer = self.informer(backend, kind)
        body = {"metadata": {"resourceVersion": str(self.version)},
                "items": list(self.objects[kind].values())}
        informer._list = lambda **kw: _Resp(json.dumps(body).encode())
        informer.relist()

    def send(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        self.version += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.version)
        if event == "DELETED":
            self.objects[kind].pop(key_of(obj), None)
        else:
            self.objects[kind][key_of(obj)] = obj
        line = (json.dumps({"type": event, "object": obj}) + "\n").encode()
        for backend in self.backends:
            informer = self.watcher(backend, kind, obj)
            informer._list = lambda **kw: _Resp(lines=[line])
            informer._watch("1")

    def watcher(self, backend: Any, kind: str, obj: dict[str, Any]) -> Any:
        """The informer whose watch delivers a change of `obj`."""
        return self.informer(backend, kind)

    def missed(self, kind: str, obj: dict[str, Any], *, delete: bool = False) -> None:
        """A change the watch did not deliver (a 410, a broken stream): the next relist
        finds it."""
        self.version += 1
        if delete:
            self.objects[kind].pop(key_of(obj), None)
            return
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.objects[kind][key_of(obj)] = obj


def backend(monkeypatch: pytest.MonkeyPatch, *, keep: bool, **options: Any) -> Any:
    """A backend with no API server behind it: kept statuses and nodes (`keep`), or both
    rebuilt every cycle, the reference; `options` go to the backend (`teams`: one watch
    per namespace)."""
    from kubernetes import client

    from queueing.backends.kubernetes import KubernetesBackend

    b = KubernetesBackend(client.ApiClient(client.Configuration()), owner_key=KEY,
                          gpu_types=GPU_TYPES, **options)
    b.keep_statuses = keep
    b.keep_nodes = keep
    b.builds = 0
    plain_build = b._workload_status

    def counted(*args: Any, **kwargs: Any) -> Any:
        b.builds += 1
        return plain_build(*args, **kwargs)

    monkeypatch.setattr(b, "_workload_status", counted)
    monkeypatch.setattr(b, "_delete_orphan_pods", lambda name: None)
    monkeypatch.setattr(b, "_delete_quietly", lambda name, namespace: None)
    monkeypatch.setattr(b, "_remember_last_words", lambda pod: None)
    for informer in (b.jobs, b.pods, b.other_pods, b.nodes_informer, b.events):
        if hasattr(informer, "synced"):  # a namespace's own is synced by its first list
            informer.synced.set()
    b._started = True
    b._probe_ok_at = time.monotonic() + 3600  # rule K5's probe: answered
    return b


def changed_pod(rng: random.Random, pod: dict[str, Any], now: datetime) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    roll = rng.random()
    if roll < 0.5:
        created = now - timedelta(seconds=rng.randint(0, 400))
        pod["metadata"]["creationTimestamp"] = iso(created)
        status, bound = pod_status(rng, created)
        pod["status"] = status
        if bound:
            pod["spec"]["nodeName"] = pod["spec"].get("nodeName") or f"gpu-{rng.randint(0, 7)}"
    elif roll < 0.6:
        pod["metadata"]["deletionTimestamp"] = iso(now)
    elif roll < 0.7:
        pod["metadata"]["ownerReferences"] = []  # orphaned
    elif roll < 0.8:
        pod["spec"]["nodeName"] = f"gpu-{rng.randint(0, 7)}"
    elif roll < 0.9:
        pod["metadata"].setdefault("labels", {})["fairq.io/replica"] = str(rng.randint(0, 2))
    else:
        for cs in pod["status"].get("containerStatuses") or ():
            cs["restartCount"] = int(cs.get("restartCount") or 0) + 1
    return pod


def changed_job(rng: random.Random, job: dict[str, Any], now: datetime) -> dict[str, Any]:
    job = copy.deepcopy(job)
    roll = rng.random()
    if roll < 0.3:
        job["status"] = {"conditions": [{"type": "Complete", "status": "True",
                                         "lastTransitionTime": iso(now)}],
                         "succeeded": 1, "completionTime": iso(now)}
    elif roll < 0.5:
        job["status"] = {"conditions": [{"type": "Failed", "status": "True",
                                         "reason": "DeadlineExceeded",
                                         "lastTransitionTime": iso(now)}], "failed": 1}
    elif roll < 0.7:
        job["metadata"]["deletionTimestamp"] = iso(now)
    elif roll < 0.85:
        job["status"] = {"active": 1, "failed": rng.randint(0, 2)}
    else:
        job["metadata"]["creationTimestamp"] = iso(now - timedelta(seconds=rng.randint(0, 300)))
    return job


def new_workload(rng: random.Random, job_id: int, now: datetime, *,
                 namespace: str = "fairq-vision"
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A workload just created: Jobs a few seconds to minutes old, pods that may be
    missing yet or stuck pulling their image, so the deadlines pass during the run."""
    jobs, pods = workload(rng, job_id, [f"gpu-{i}" for i in range(8)], namespace=namespace)
    created = now - timedelta(seconds=rng.randint(0, 200))
    for job in jobs:
        job["metadata"]["creationTimestamp"] = iso(created)
        job["metadata"].pop("deletionTimestamp", None)
        job["status"] = {}
    if rng.random() < 0.4:
        pods = []
    for pod in pods:
        pod["metadata"]["creationTimestamp"] = iso(created + timedelta(seconds=2))
        pod["metadata"].pop("deletionTimestamp", None)
    return jobs, pods


def failed_create(rng: random.Random, job_key: str, now: datetime) -> dict[str, Any]:
    namespace, name = job_key.split("/", 1)
    return {"metadata": {"name": f"{name}.{rng.getrandbits(32):08x}", "namespace": namespace},
            "involvedObject": {"kind": "Job", "namespace": namespace, "name": name},
            "reason": "FailedCreate", "lastTimestamp": iso(now),
            "message": rng.choice(["exceeded quota: gpus", "forbidden: LimitRange"])}


def step(rng: random.Random, cluster: Cluster, backends: list[Any], now: datetime,
         next_id: list[int]) -> None:
    """One random change, sent to every backend alike."""
    roll = rng.random()
    pods, jobs = cluster.objects["pods"], cluster.objects["jobs"]
    if roll < 0.3 and pods:
        pod = pods[rng.choice(sorted(pods))]
        cluster.send("pods", "MODIFIED", changed_pod(rng, pod, now))
    elif roll < 0.4 and pods:
        cluster.send("pods", "DELETED", pods[rng.choice(sorted(pods))])
    elif roll < 0.55 and jobs:
        job = jobs[rng.choice(sorted(jobs))]
        cluster.send("jobs", "MODIFIED", changed_job(rng, job, now))
    elif roll < 0.62 and jobs:
        cluster.send("jobs", "DELETED", jobs[rng.choice(sorted(jobs))])
    elif roll < 0.74:
        new_jobs, new_pods = new_workload(rng, next_id[0], now)
        next_id[0] += 1
        for job in new_jobs:
            cluster.send("jobs", "ADDED", job)
        for pod in new_pods:
            cluster.send("pods", "ADDED", pod)
    elif roll < 0.8:
        # Changes the watch missed, found by a relist of pods or Jobs.
        kind = rng.choice(["pods", "jobs"])
        objects = cluster.objects[kind]
        for key in rng.sample(sorted(objects), min(3, len(objects))):
            if rng.random() < 0.3:
                cluster.missed(kind, objects[key], delete=True)
            elif kind == "pods":
                cluster.missed(kind, changed_pod(rng, objects[key], now))
            else:
                cluster.missed(kind, changed_job(rng, objects[key], now))
        for b in backends:
            cluster.relist(b, kind)
    elif roll < 0.86 and jobs:
        key = rng.choice(sorted(jobs))
        event = failed_create(rng, key, now)
        for b in backends:
            b.events._store[key_of(event)] = event
    elif roll < 0.92 and jobs:
        name = jobs[rng.choice(sorted(jobs))]["metadata"]["name"]
        how = rng.choice(["stop", "hide", "unhide"])
        finished = now - timedelta(seconds=rng.choice([10, 7200]))
        for b in backends:
            if how == "stop":
                b.tracker.stop_asked(name)
            elif how == "hide":
                b.tracker.hide(name, finished)  # the same in every backend
            else:
                b.tracker.unhide(name)
    else:
        # A spot node tainted for termination, or back without the taint (rule K6).
        node = copy.deepcopy(cluster.objects["nodes"][rng.choice(sorted(cluster.objects["nodes"]))])
        node["metadata"]["labels"]["karpenter.sh/capacity-type"] = "spot"
        taints = [t for t in node["spec"].get("taints") or ()
                  if t["key"] != "cloud.google.com/impending-node-termination"]
        if rng.random() < 0.6:
            taints.append({"key": "cloud.google.com/impending-node-termination",
                           "effect": "NoSchedule"})
        node["spec"]["taints"] = taints
        cluster.send("nodes", "MODIFIED", node)


def run_clock(monkeypatch: pytest.MonkeyPatch) -> list[datetime]:
    """The backend's wall clock made the run's (the hooks stamp a Job deleted outside
    fairq with it): a one-item list whose item the run moves, T0 to begin with."""
    import queueing.backends.kubernetes as kubernetes

    clock = [T0]

    class Clock(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return clock[0]

    monkeypatch.setattr(kubernetes, "datetime", Clock)
    return clock


def answered(b: Any, now: datetime) -> list[Any]:
    return sorted(b.statuses(now=now), key=lambda s: (s.name, s.job_id))


@pytest.mark.parametrize("seed", range(10))
def test_the_kept_statuses_are_the_statuses_rebuilt_each_cycle(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    clock = run_clock(monkeypatch)
    kept, plain = backend(monkeypatch, keep=True), backend(monkeypatch, keep=False)
    cluster = Cluster(world(seed, workloads=30), [kept, plain])
    next_id = [1000]
    now = T0
    for cycle in range(40):
        for _ in range(rng.choice([0, 0, 1, 1, 2, 5])):
            step(rng, cluster, [kept, plain], now, next_id)
        assert answered(kept, now) == answered(plain, now), f"cycle {cycle}"
        # The pods by workload the hook keeps are those the plain index groups.
        for mine, theirs in zip(kept._pod_index(), plain._pod_index(), strict=True):
            assert {k: [key_of(p) for p in v] for k, v in mine.items()} == \
                {k: [key_of(p) for p in v] for k, v in theirs.items()}, f"cycle {cycle}"
        assert kept.nodes() == plain.nodes(), f"cycle {cycle}"
        now += timedelta(seconds=rng.choice([0, 1, 5, 30, 90, 200]))
        clock[0] = now
    assert kept._kept, "statuses were kept"
    # The kept path built far fewer statuses than the plain one (twice each it keeps).
    assert kept.builds < plain.builds * 0.8, (kept.builds, plain.builds)


def test_a_cycle_without_events_rebuilds_only_what_time_can_change(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Kept statuses are rebuilt when a pod of theirs changed, and only then (a status
    time can change - a pod pulling its image, a Job with no pod - each cycle)."""
    kept = backend(monkeypatch, keep=True)
    w = world(3, workloads=30)
    cluster = Cluster(w, [kept])
    first = answered(kept, T0)
    assert kept._kept
    kept.builds = 0
    assert answered(kept, T0) == first
    volatile = kept.builds
    assert volatile < len(first) // 2
    pod = next(p for p in cluster.objects["pods"].values()
               if f"{p['metadata']['namespace']}/{p['metadata']['labels']['fairq.io/workload']}"
               in kept._kept and p["status"].get("containerStatuses"))
    workload = pod["metadata"]["labels"]["fairq.io/workload"]
    changed = copy.deepcopy(pod)
    changed["status"]["containerStatuses"][0]["restartCount"] += 1  # the restarts count
    cluster.send("pods", "MODIFIED", changed)
    kept.builds = 0
    after = answered(kept, T0)
    assert kept.builds == volatile + 2  # the changed workload's, built and kept
    plain = backend(monkeypatch, keep=False)
    Cluster(w, [plain])
    plain.pods._store = dict(kept.pods._store)
    assert after == answered(plain, T0)
    assert [s for s in after if s.name == workload] != [s for s in first if s.name == workload]


def test_a_relist_keeps_the_object_it_holds_at_the_same_resource_version() -> None:
    """What readers derived from an object (a workload's pods, a kept status) stays
    valid across a relist that brings it back unchanged; a changed one is replaced and
    reported, and one with no resourceVersion is always replaced."""
    from queueing.backends.k8s_cache import Informer

    changes: list[tuple[str, str]] = []
    informer = Informer("t", lambda **kw: None,
                        on_change=lambda kind, old, new: changes.append(
                            (kind, key_of(new or old or {}))))

    def listed(*objects: dict[str, Any]) -> None:
        body = {"metadata": {"resourceVersion": "9"}, "items": list(objects)}
        informer._list = lambda **kw: _Resp(json.dumps(body).encode())
        informer.relist()

    def obj(name: str, rv: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}}

    listed(obj("a", "1"), obj("b", "1"), obj("c", ""))
    held = {k: informer.get(k) for k in ("ns/a", "ns/b", "ns/c")}
    changes.clear()
    listed(obj("a", "1"), obj("b", "2"), obj("c", ""))
    assert informer.get("ns/a") is held["ns/a"]
    assert informer.get("ns/b") is not held["ns/b"]
    assert informer.get("ns/b")["metadata"]["resourceVersion"] == "2"
    assert informer.get("ns/c") is not held["ns/c"]
    assert changes == [("MODIFIED", "ns/b")]
    assert informer.relist_counts() == {"": 2}
