"""`statuses()` visits again only the Jobs something may have changed since the last
cycle (`KubernetesBackend.keep_visits`; docs/performance.md, "Statuses read only for what
changed"): those a watch event marked (the Job, its workload's pods, its replicas' Jobs),
those of a listed-again informer, those whose FailedCreate message or hidden state moved,
and those time changes. Held to the plain rebuild of every status each cycle
(`keep_statuses = False`) and to the kept statuses visiting every Job
(`keep_visits = False`): three backends fed the same random sequences of watch events
through the informers' own code (tests/test_k8s_kept_statuses.py's: Jobs and pods added,
modified, deleted, relists carrying changes the watch missed, stops asked, Jobs hidden
and unhidden, FailedCreate events, spot nodes reclaimed and back, time passing across
every deadline) answer the same statuses and delete the same finished Jobs at every
cycle, and the one visiting by marks visits fewer Jobs."""

from __future__ import annotations

import copy
import random
from datetime import timedelta

import pytest

from .k8s_world import T0, iso, workload, world
from .test_k8s_kept_statuses import Cluster, answered, backend, run_clock, step


@pytest.mark.parametrize("seed", range(10))
def test_statuses_visiting_marked_jobs_are_the_statuses_rebuilt_each_cycle(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    clock = run_clock(monkeypatch)
    marked = backend(monkeypatch, keep=True)
    every = backend(monkeypatch, keep=True)
    every.keep_visits = False
    plain = backend(monkeypatch, keep=False)
    backends = [marked, every, plain]
    cleaned: dict[int, list[tuple[str, str]]] = {id(b): [] for b in backends}
    for b in backends:
        # The finished Jobs past their TTL it deletes itself: each cycle, not each minute.
        monkeypatch.setattr(b, "_delete_quietly",
                            lambda name, namespace, b=b: cleaned[id(b)].append((name, namespace)))
    cluster = Cluster(world(seed, workloads=30), backends)
    next_id = [1000]
    now = T0
    for cycle in range(60):
        for _ in range(rng.choice([0, 0, 1, 1, 2, 5])):
            step(rng, cluster, backends, now, next_id)
        for b in backends:
            b._last_housekeeping = float("-inf")
            cleaned[id(b)].clear()
        want = answered(plain, now)
        assert answered(marked, now) == want, f"cycle {cycle}"
        assert answered(every, now) == want, f"cycle {cycle}"
        assert sorted(cleaned[id(marked)]) == sorted(cleaned[id(plain)]), f"cycle {cycle}"
        assert sorted(cleaned[id(every)]) == sorted(cleaned[id(plain)]), f"cycle {cycle}"
        now += timedelta(seconds=rng.choice([0, 0, 1, 5, 30, 90, 200]))
        clock[0] = now
    assert marked._visits is not None
    # Visiting by marks visited far fewer Jobs than visiting all of them each cycle.
    assert marked.job_visits < every.job_visits * 0.6, (marked.job_visits, every.job_visits)
    # And the rest of each cycle looked at what moved, not at every status, but in the
    # cycles that visited every Job (the first, a relist of every namespace).
    assert marked.full_passes < every.full_passes * 0.25, (marked.full_passes,
                                                             every.full_passes)


def test_a_cycle_visits_the_marked_jobs_and_those_time_changes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without events a cycle visits only the Jobs whose status time changes (or that
    are hidden); a pod's event adds its workload's Job; a FailedCreate message its Job."""
    b = backend(monkeypatch, keep=True)
    w = world(3, workloads=30)
    cluster = Cluster(w, [b])
    first = answered(b, T0)
    assert b._visits is not None
    jobs = len(b.jobs.items())
    b.job_visits = 0
    passes = b.full_passes
    assert answered(b, T0) == first
    often = b.job_visits
    assert b.full_passes == passes
    assert often == len(b._visits.often) < jobs // 2
    settled = sorted(set(b._visits.by_key) - b._visits.often)
    workload = next(k for k in settled
                    if b._visits.by_key[k][2] is not None and
                    any(p["metadata"]["labels"].get("fairq.io/workload") == k.split("/")[1]
                        for p in cluster.objects["pods"].values()))
    pod = next(p for p in cluster.objects["pods"].values()
               if p["metadata"]["labels"].get("fairq.io/workload") == workload.split("/")[1])
    changed = copy.deepcopy(pod)
    changed["metadata"].setdefault("annotations", {})["touched"] = "1"
    cluster.send("pods", "MODIFIED", changed)
    b.job_visits = 0
    assert answered(b, T0) == first
    assert b.job_visits == often + 1
    assert b.full_passes == passes


def test_a_start_seen_by_a_kept_cycle_is_remembered_for_a_job_deleted_outside_fairq(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The tracker learns a workload's start from the statuses a cycle recorded anew (not
    from every status each cycle): a Job that ran, lost its pods, then was deleted
    outside fairq is reported FAILED from that start, as by the plain rebuild."""
    run_clock(monkeypatch)
    marked = backend(monkeypatch, keep=True)
    plain = backend(monkeypatch, keep=False)
    cluster = Cluster(world(3, workloads=20), [marked, plain])
    assert answered(marked, T0) == answered(plain, T0)
    rng = random.Random(11)
    for job_id in range(5000, 5400):
        jobs, pods = workload(rng, job_id, [f"gpu-{i}" for i in range(8)])
        job = jobs[0]
        if len(jobs) == 1 and pods and not job["metadata"].get("deletionTimestamp") and \
                not (job.get("status") or {}).get("conditions") and \
                all(p["status"].get("phase") == "Running" for p in pods):
            break
    else:
        raise AssertionError("no running single-replica workload drawn")
    name = job["metadata"]["name"]
    cluster.send("jobs", "ADDED", job)
    assert answered(marked, T0) == answered(plain, T0)
    for pod in pods:
        cluster.send("pods", "ADDED", pod)
    running = answered(marked, T0)
    assert running == answered(plain, T0)
    started = next(s.started_at for s in running if s.name == name)
    assert started is not None
    for pod in pods:
        cluster.send("pods", "DELETED", pod)
    assert answered(marked, T0) == answered(plain, T0)
    cluster.send("jobs", "DELETED", job)
    after = answered(marked, T0)
    assert after == answered(plain, T0)
    tomb = next(s for s in after if s.name == name)
    assert (tomb.phase, tomb.started_at) == ("FAILED", started)
    assert marked.full_passes == 1


def test_replicas_seen_before_a_workload_job_deleted_are_known_when_it_comes_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The tracker forgets a workload's replicas when its Job is deleted and learns them
    again from the replicas' Jobs left (given again for the workloads marked, not every
    replica each cycle): a replica's Job deleted after the workload's Job came back is
    one deleted outside fairq, as the plain rebuild says."""
    run_clock(monkeypatch)
    marked = backend(monkeypatch, keep=True)
    plain = backend(monkeypatch, keep=False)
    cluster = Cluster(world(3, workloads=20), [marked, plain])
    assert answered(marked, T0) == answered(plain, T0)
    rng = random.Random(5)
    for job_id in range(6000, 6400):
        jobs, _ = workload(rng, job_id, [f"gpu-{i}" for i in range(8)])
        if len(jobs) > 1:
            break
    else:
        raise AssertionError("no multi-replica workload drawn")
    for job in jobs:  # just created, no pod yet
        job["metadata"].pop("deletionTimestamp", None)
        job["metadata"]["creationTimestamp"] = iso(T0)
        job["status"] = {}
    name = jobs[0]["metadata"]["name"]
    for job in jobs:
        cluster.send("jobs", "ADDED", job)
    assert answered(marked, T0) == answered(plain, T0)
    cluster.send("jobs", "DELETED", jobs[0])
    assert answered(marked, T0) == answered(plain, T0)
    cluster.send("jobs", "ADDED", jobs[0])
    assert answered(marked, T0) == answered(plain, T0)
    cluster.send("jobs", "DELETED", jobs[1])
    after = answered(marked, T0)
    assert after == answered(plain, T0)
    status = next(s for s in after if s.name == name)
    assert "deleted outside fairq" in status.reason, status
    assert marked.full_passes == 1
