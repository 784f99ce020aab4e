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

from .k8s_world import T0, world
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
    assert answered(b, T0) == first
    often = b.job_visits
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
