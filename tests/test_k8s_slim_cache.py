"""The watch cache keeps slim objects (k8s_manifest.slim_pod, slim_job, slim_node): held
to the full objects the API server sends. Over random worlds (tests/k8s_world.py: every
pod phase and container state, deletions, orphans, multi-replica workloads, spot and
tainted nodes) the backend answers the same from either: its statuses, its nodes, the
orphan pods it deletes, the pods a log read finds, the graceful stop's "last words"
trigger and the watch hooks' kicks."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from queueing.backends.k8s_cache import Informer, key_of
from queueing.backends.k8s_manifest import slim_job, slim_node, slim_pod

from .k8s_world import GPU_TYPES, KEY, T0, world


def backend_with(w: Any, *, slim: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    from kubernetes import client

    from queueing.backends.kubernetes import KubernetesBackend

    backend = KubernetesBackend(client.ApiClient(client.Configuration()), owner_key=KEY,
                                gpu_types=GPU_TYPES)
    deleted: list[str] = []
    kicks: list[int] = []
    backend.deleted = deleted
    backend.kicks = kicks
    monkeypatch.setattr(backend, "_delete_orphan_pods", deleted.append)
    monkeypatch.setattr(backend, "_remember_last_words", lambda pod: None)  # no API call
    backend._kick = lambda: kicks.append(1)
    for informer, objects, transform in ((backend.jobs, w.jobs, slim_job),
                                         (backend.pods, w.pods, slim_pod),
                                         (backend.other_pods, w.other_pods, slim_pod),
                                         (backend.nodes_informer, w.nodes, slim_node)):
        for obj in objects:
            stored = transform(json.loads(json.dumps(obj))) if slim else obj
            informer._store[key_of(obj)] = stored
            informer._notify("ADDED", None, stored)  # the hook, as a list runs it
        informer.synced.set()
    backend.events.synced.set()
    backend._started = True
    backend._probe_ok_at = time.monotonic() + 3600  # rule K5's probe: answered
    return backend


def answers(backend: Any, w: Any) -> dict[str, Any]:
    statuses = sorted(backend.statuses(now=T0), key=lambda s: s.name)
    index = backend._pod_index()[1]
    hooks = []
    for raw in w.pods:
        pod = backend.pods.get(key_of(raw))
        ended = {**pod, "metadata": {**pod["metadata"], "deletionTimestamp": "x"},
                 "status": {**pod.get("status", {}), "containerStatuses": [
                     {"name": "main", "state": {"terminated": {"exitCode": 0}}}]}}
        hooks.append(backend._last_words_due(pod, ended))
        backend._pod_changed("MODIFIED", pod, ended)
    for raw in w.jobs:
        job = backend.jobs.get(key_of(raw))
        backend._job_changed("MODIFIED", job, job)
        backend._job_changed("MODIFIED", {**job, "status": {}}, job)
    for raw in w.nodes:
        node = backend.nodes_informer.get(key_of(raw))
        backend._node_changed("MODIFIED", node, node)
    return {
        "statuses": statuses,
        "nodes": backend.nodes(),
        "orphans deleted": list(backend.deleted),
        "pods by workload": {k: sorted(p["metadata"]["name"] for p in v)
                             for k, v in index.items()},
        "namespaces": {j["metadata"]["name"]: backend._namespace_of(j["metadata"]["name"])
                       for j in w.jobs},
        "last words due": hooks,
        "kicks": len(backend.kicks),
    }


@pytest.mark.parametrize("seed", range(12))
def test_the_backend_answers_the_same_from_slim_objects_as_from_full_ones(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    w = world(seed)
    full = answers(backend_with(w, slim=False, monkeypatch=monkeypatch), w)
    slim = answers(backend_with(w, slim=True, monkeypatch=monkeypatch), w)
    assert full["statuses"], "the world reports workloads"
    assert any(n.allocated for n in full["nodes"]), "the world's pods hold GPUs"
    for what in full:
        assert slim[what] == full[what], what


def test_a_slim_object_is_a_fraction_of_the_full_one_and_keeps_what_is_read() -> None:
    w = world(1)
    pod = next(p for p in w.pods if p["spec"].get("nodeName") and p["status"].get("startTime"))
    slim = slim_pod(pod)
    assert len(json.dumps(slim)) * 4 < len(json.dumps(pod))
    assert slim["spec"]["containers"][0]["resources"] == pod["spec"]["containers"][0]["resources"]
    assert [cs["state"] for cs in slim["status"]["containerStatuses"]] == [
        cs["state"] for cs in pod["status"]["containerStatuses"]]
    assert "managedFields" not in slim["metadata"] and "env" not in slim["spec"]["containers"][0]
    job = w.jobs[0]
    assert "template" not in slim_job(job)["spec"]
    assert slim_job(job)["metadata"]["annotations"] == job["metadata"]["annotations"]
    assert "images" not in slim_node(w.nodes[0])["status"]


class _Resp:
    def __init__(self, body: Any = None, lines: list[dict[str, Any]] | None = None) -> None:
        self.data = json.dumps(body).encode() if body is not None else b""
        self._lines = lines or []

    def stream(self, amt: Any = None, decode_content: bool = False) -> Any:
        for line in self._lines:
            yield (json.dumps(line) + "\n").encode()
        time.sleep(0.05)

    def release_conn(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_the_informer_lists_in_pages_and_transforms_what_it_lists_and_watches() -> None:
    """Pages of `page_size` (limit/continue), one snapshot; an expired continue token
    (410) starts the list over; every object, listed or watched, goes through the
    transform before the store and the hook see it."""
    from kubernetes.client.exceptions import ApiException

    def obj(name: str, rv: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv,
                             "managedFields": [{"manager": "x"}]}, "status": {"phase": "Running"}}

    calls: list[dict[str, Any]] = []
    pages = iter([
        _Resp({"metadata": {"resourceVersion": "7", "continue": "c1"}, "items": [obj("a", "5")]}),
        ApiException(status=410, reason="Expired"),  # the token expired: over again
        _Resp({"metadata": {"resourceVersion": "9", "continue": "c2"}, "items": [obj("a", "8")]}),
        _Resp({"metadata": {"resourceVersion": "9"}, "items": [obj("b", "9")]}),
    ])
    watched = [{"type": "ADDED", "object": obj("c", "10")}]

    def list_func(**kw: Any) -> Any:
        calls.append(kw)
        if kw.get("watch"):
            resp = _Resp(lines=list(watched))
            watched.clear()
            return resp
        nxt = next(pages)
        if isinstance(nxt, Exception):
            raise nxt
        return nxt

    seen: list[dict[str, Any]] = []
    inf = Informer("t", list_func, resync_seconds=3600, page_size=1,
                   transform=lambda o: {"metadata": {k: v for k, v in o["metadata"].items()
                                                     if k != "managedFields"},
                                        "status": o["status"]},
                   on_change=lambda k, o, n: seen.append(n or o or {}))
    inf.start()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(inf.items()) < 3:
        time.sleep(0.02)
    inf.stop()
    lists = [c for c in calls if not c.get("watch")]
    assert [c.get("_continue") for c in lists] == [None, "c1", None, "c2"]
    assert all(c["limit"] == 1 for c in lists)
    assert next(c for c in calls if c.get("watch"))["resource_version"] == "9"
    assert sorted(key_of(o) for o in inf.items()) == ["ns/a", "ns/b", "ns/c"]
    assert inf.get("ns/a")["metadata"]["resourceVersion"] == "8"
    assert all("managedFields" not in o["metadata"] for o in [*inf.items(), *seen])
    assert inf.errors == 0


def test_the_kept_seal_answer_is_the_hmac_of_the_exact_inputs() -> None:
    """`sealed_by_fairq` keeps its answer per (namespace, name, digest, seal, key): held
    to the HMAC computed afresh, for a seal that verifies and for each input changed
    after it was first asked (a forged seal, another name, namespace, digest or key)."""
    import hmac
    import random

    from queueing.backends.k8s_manifest import (
        A_OWNER,
        A_SPEC_DIGEST,
        owner_seal,
        sealed_by_fairq,
    )

    def fresh(job: dict[str, Any], key: bytes) -> bool:
        meta = job["metadata"]
        ann = meta.get("annotations") or {}
        digest = str(ann.get(A_SPEC_DIGEST) or "")
        return bool(digest) and hmac.compare_digest(
            str(ann.get(A_OWNER) or ""), owner_seal(str(meta.get("namespace")),
                                                   str(meta.get("name")), digest, key))

    rng = random.Random(5)
    for i in range(200):
        key = rng.choice([b"k1", b"k2"])
        digest = f"{rng.getrandbits(64):016x}"
        meta = {"name": f"fq-{i}-1", "namespace": rng.choice(["fairq-a", "fairq-b"]),
                "annotations": {A_SPEC_DIGEST: digest,
                                A_OWNER: owner_seal("fairq-a", f"fq-{i}-1", digest, b"k1")}}
        job = {"metadata": meta}
        for change in range(6):
            assert sealed_by_fairq(job, key) == fresh(job, key)
            assert sealed_by_fairq(job, key) == fresh(job, key)  # asked again: kept
            if change == 0:
                meta["annotations"][A_OWNER] = "f" * 64  # forged
            elif change == 1:
                meta["name"] = f"fq-{i}-2"
            elif change == 2:
                meta["namespace"] = "fairq-c"
            elif change == 3:
                meta["annotations"][A_SPEC_DIGEST] = ""
            else:
                key = b"k3"


def test_a_kept_quantity_is_the_quantity_parsed_afresh() -> None:
    """`capacity` reads each pod's CPU and memory through values kept per text: held to
    `parse_cpu` / `parse_bytes` over quantities of every form, invalid ones included,
    asked twice."""
    import random

    from queueing.backends.k8s_manifest import _bytes_or_none, _cpu_or_none
    from queueing.validation import parse_bytes, parse_cpu

    def fresh(parse: Any, text: str) -> int | None:
        try:
            return int(parse(text))
        except ValueError:
            return None

    rng = random.Random(11)
    texts = ["8", "0.5", "250m", "1500m", "64Gi", "512Mi", "1e3", "1.5G", "100Ki", "",
             "-1", "x", "12Pi", "7", "0", "1Ti"]
    texts += [f"{rng.randint(0, 5000)}{rng.choice(['', 'm', 'Mi', 'Gi', 'k', 'M'])}"
              for _ in range(200)]
    for text in texts * 2:
        assert _cpu_or_none(text) == fresh(parse_cpu, text), text
        assert _bytes_or_none(text) == fresh(parse_bytes, text), text
