"""The Kubernetes backend's watch cache at fleet size: 150,000 fairq pods, as many Jobs,
5,000 GPU nodes (docs/performance.md, "A fleet of 5,000 nodes: the Kubernetes path").

Question: what does the worker's in-process cache cost per pod, in memory and in work
per watch event, and what do the cycle's reads of it cost, with the objects kept whole
(`full`, as before) and slim (`slim`: k8s_manifest.slim_pod / slim_job / slim_node, what
fairq reads)? Goal: the worker's RSS <= 2 GB with the cycle's own memory beside it.

The objects are what the API server sends (tests/k8s_world.py: fairq's own signed Job
manifests, pods as the Job controller, kube-scheduler and a kubelet leave them, with
managedFields), ~900 distinct templates numbered into unique names; creating 150,000
real pods in envtest on this machine would take hours. They reach the informers the way
the API server's answers do: a paged list (500 a page, the JSON text parsed) for the
relist, a watch stream of MODIFIED events for the event cost, through the backend's
own hooks (`_pod_changed`: the kick, the graceful stop's trigger).

  BENCH k8s_fleet_<mode>_cache_mb              RSS growth after listing the pods,
                                               Jobs and nodes into the caches
  BENCH k8s_fleet_<mode>_bytes_per_pod         the same per pod (Jobs and nodes included)
  BENCH k8s_fleet_<mode>_peak_mb               the process's peak RSS by then
  BENCH k8s_fleet_<mode>_relist_s              listing every pod, Job and node, the
                                               fake pages' own making left out
  BENCH k8s_fleet_<mode>_event_us              per watch event (parse, transform,
                                               store, hook), 20,000 pod MODIFIED events
  BENCH k8s_fleet_<mode>_statuses_s / _nodes_s  the cycle's two reads, once each
  BENCH calibration_1M_loop                    the machine's speed now, load average beside

With `--cycles 0.01,0.1` (one process, slim): the cycle's reads with that share of the
pods modified (watch events, through the hooks) between two cycles, the statuses and
nodes kept between cycles (`KubernetesBackend.keep_statuses`, `keep_nodes`) alternated
with the plain rebuild of every status and node, `--rounds` times: `every` visits each
Job of the cache (`keep_visits = False`), `kept` only the Jobs marked since the last
cycle (`keep_visits`) with the rest of the call passing over every status
(`passes`: `keep_passes = False`) or looking at what moved (`kept`); `--paths` picks
some of plain, every, passes, kept; the lowest of each (`--settled`: only the workloads
a cycle leaves as they are, see `settle`):

  BENCH k8s_fleet_cycle_plain_<share>_s        statuses(), every status rebuilt
  BENCH k8s_fleet_cycle_<path>_first_s         statuses(), kept, its first cycle
  BENCH k8s_fleet_cycle_<path>_<share>_s       statuses(), kept, the next cycle
  BENCH k8s_fleet_cycle_<path>_nodes_first_s   nodes(), kept, its first cycle
  BENCH k8s_fleet_cycle_<path>_nodes_<share>_s nodes() after it (plain: every node
                                               rebuilt; kept: the nodes whose pods moved)

An instance number is a template's round (`i // len(templates)`), so a pod and its Job
(and a replica's Jobs) share it: every pod belongs to its workload's Jobs as in the
template world. A bound pod is on node number (its own number modulo 5,000), about 30
a node (before, every pod was on one of the template world's 8 nodes).

Times are the process's CPU time (`time.process_time`), not wall time: the machine is
shared. Each mode runs in a process of its own (RSS is per process), alternated: full,
slim, full, slim; the lower of each mode's two counts. Run:
`.venv/bin/python bench/bench_k8s_fleet.py [--pods 150000] [--modes slim]` (`full` at
150k holds ~10 GB: compare the two at 30k, and run slim alone at 150k).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import resource
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, note  # noqa: E402  (bench/ is sys.path[0])

PAGE = 500
EVENTS = 20_000
NODES = 5_000
MARK = "@@N@@"
SEAL = "@@SEAL@@"


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def settle(w: Any) -> None:
    """Only the workloads of `w` a cycle leaves as they are (`--settled`): every
    replica's Job there (none deleted outside fairq) and no pod stuck pulling its image,
    the states a cycle acts on at once (it requeues or fails the job) and that the
    backend reports anew each cycle (their end stamped with the cycle's time)."""
    from queueing.backends.k8s_manifest import IMAGE_ERRORS, workload_replicas

    def workload(obj: Any) -> str:
        return str(obj["metadata"]["labels"]["fairq.io/workload"])

    keep = set()
    for name in {workload(j) for j in w.jobs}:
        jobs = [j for j in w.jobs if workload(j) == name]
        first = [j for j in jobs if j["metadata"]["name"] == name]
        stuck = any(((cs.get("state") or {}).get("waiting") or {}).get("reason") in IMAGE_ERRORS
                    for p in w.pods if workload(p) == name
                    for cs in p["status"].get("containerStatuses") or ())
        if first and len(jobs) >= workload_replicas(first[0]) and not stuck:
            keep.add(name)
    w.jobs = [j for j in w.jobs if workload(j) in keep]
    w.pods = [p for p in w.pods if workload(p) in keep]


def templates(settled: bool = False) -> tuple[list[str], list[str], list[str]]:
    """Pod, Job and node JSON texts with MARK where an instance's number goes (in every
    name, uid and workload label, so each instance is an object of its own)."""
    from queueing.backends.k8s_manifest import A_OWNER, A_SPEC_DIGEST
    from tests.k8s_world import node_object, world

    w = world(7, workloads=600, nodes=8, others=0)
    if settled:
        settle(w)
    pods, jobs = [], []
    for obj in w.jobs:
        name = obj["metadata"]["labels"]["fairq.io/workload"]
        meta = obj["metadata"]
        ann = meta["annotations"]
        # Each instance's owner seal is made for its own name (`fake_list`).
        ann[A_OWNER] = f"{SEAL}{meta['namespace']}/{meta['name']}/{ann[A_SPEC_DIGEST]}{SEAL}"
        jobs.append(json.dumps(obj).replace(name, f"{name}x{MARK}")
                    .replace('"uid": "', f'"uid": "{MARK}-'))
    for j, obj in enumerate(w.pods):
        name = obj["metadata"]["labels"]["fairq.io/workload"]
        if obj["spec"].get("nodeName"):  # spread over the fleet's nodes (`instance`)
            obj["spec"]["nodeName"] = f"gpu-@@P{j}:{len(w.pods)}@@"
        pods.append(json.dumps(obj).replace(name, f"{name}x{MARK}")
                    .replace('"uid": "', f'"uid": "{MARK}-'))
    import random

    rng = random.Random(7)
    node = node_object(f"gpu-{MARK}", "h100", 8, rng)
    node["spec"].update(unschedulable=False, taints=node["spec"]["taints"][:1])  # usable
    nodes = [json.dumps(node)]
    return pods, jobs, nodes


class _Resp:
    def __init__(self, data: bytes = b"", lines: Iterator[bytes] | None = None) -> None:
        self.data = data
        self._lines = lines

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        yield from self._lines or ()

    def release_conn(self) -> None:
        pass

    def close(self) -> None:
        pass


def instance(text: str, i: int) -> str:
    """Template `text` as object number `i` (a Job's owner seal made for its name; a
    bound pod on node number its own number modulo the nodes: ~30 pods a node at
    150,000)."""
    text = text.replace(MARK, str(i))
    if "@@P" in text:
        text = re.sub(r"@@P(\d+):(\d+)@@",
                      lambda m: str((i * int(m[2]) + int(m[1])) % NODES), text)
    if SEAL not in text:
        return text
    from queueing.backends.k8s_manifest import owner_seal
    from tests.k8s_world import KEY

    head, sealed, tail = text.split(SEAL)
    namespace, name, digest = sealed.split("/")
    return head + owner_seal(namespace, name, digest, KEY) + tail


def fake_list(texts: list[str], count: int, spent: list[float]) -> Any:
    """A list function answering `count` objects in pages (continue = the next
    offset); the time making the pages' text is added to `spent`."""

    def list_func(**kw: Any) -> _Resp:
        t0 = time.process_time()
        start = int(kw.get("_continue") or 0)
        end = min(count, start + (kw.get("limit") or count))
        items = ",".join(instance(texts[i % len(texts)], i // len(texts))
                         for i in range(start, end))
        more = f',"continue":"{end}"' if end < count else ""
        data = f'{{"metadata":{{"resourceVersion":"1"{more}}},"items":[{items}]}}'.encode()
        spent[0] += time.process_time() - t0
        return _Resp(data)

    return list_func


def modify(backend: Any, pod_t: list[str], which: Iterable[int], version: str) -> None:
    """Watch events: MODIFIED for pods number `which` of the store, each with a new
    resourceVersion (prefixed `version`), through the pod informer and its hook."""
    lines = [(instance(pod_t[i % len(pod_t)], i // len(pod_t))
              .replace('"resourceVersion": "', f'"resourceVersion": "{version}'))
             for i in which]
    body = [f'{{"type":"MODIFIED","object":{text}}}\n'.encode() for text in lines]
    backend.pods._list = lambda **kw: _Resp(lines=iter(body))
    backend.pods._watch("1")


def cycles(backend: Any, pod_t: list[str], pods: int, shares: list[float],
           rounds: int, paths: tuple[str, ...] = ("plain", "every", "passes", "kept")
           ) -> None:
    """The cycle's reads with a share of the pods modified between two cycles, the kept
    statuses (`keep_statuses`) alternated with the plain rebuild in this process: per
    round and share, the plain path's cycle, then the kept path's first cycle (every
    status built) and its next one. CPU per cycle; the pods' events not counted."""
    from datetime import timedelta

    from tests.k8s_world import T0

    now, version, start = T0, 10, 0
    best: dict[str, float] = {}

    def timed(what: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.process_time()
        out = call(*args, **kwargs)
        spent = time.process_time() - t0
        best[what] = min(best.get(what, spent), spent)
        note(f"{what} {spent:.3f} s")
        return out

    for r in range(rounds):
        for share in shares:
            changed = max(1, int(pods * share))
            label = f"{share * 100:g}pct"
            for path in paths:
                backend.keep_statuses = backend.keep_nodes = path != "plain"
                backend.keep_visits = path in ("passes", "kept")
                backend.keep_passes = path == "kept"
                if path != "plain":
                    now += timedelta(seconds=3)
                    timed(f"{path}_first", backend.statuses, now=now)
                    timed(f"{path}_nodes_first", backend.nodes)
                version += 1
                modify(backend, pod_t, ((start + k) % pods for k in range(changed)),
                       str(version))
                start = (start + changed) % pods
                now += timedelta(seconds=3)
                visits = backend.job_visits
                answer = timed(f"{path}_{label}", backend.statuses, now=now)
                note(f"{path}: {backend.job_visits - visits} Jobs visited")
                if path != "plain" and path != "every":
                    entries = list(backend._kept.values())
                    note(f"{len(answer)} statuses: {sum(e.stable for e in entries)} kept, "
                         f"{sum(not e.stable for e in entries)} built again each cycle "
                         f"(time changes them), {len(answer) - len(entries)} others "
                         "(orphan pods, replica 0's Job gone, a replica's Job missing)")
                builds = backend.node_builds
                nodes = timed(f"{path}_nodes_{label}", backend.nodes)
                if path != "plain":
                    note(f"{backend.node_builds - builds} of {len(nodes)} nodes built again")
            backend.keep_statuses = backend.keep_nodes = False
            same = sorted(answer, key=lambda s: s.name) == \
                sorted(backend.statuses(now=now), key=lambda s: s.name)
            same_nodes = nodes == backend.nodes()
            note(f"round {r}, {label}: kept statuses equal to a plain rebuild: {same}; "
                 f"kept nodes: {same_nodes}; load {os.getloadavg()[0]:.1f}")
    for what, value in best.items():
        bench(f"k8s_fleet_cycle_{what}_s", value, "s")


def profiled(backend: Any, pod_t: list[str], pods: int, shares: list[float],
             rounds: int) -> None:
    """`--profile`: the kept path's `statuses()` (marked Jobs visited) under cProfile,
    `rounds` times per share of the pods modified before it; the functions that took
    the most of its own time, on stderr."""
    import cProfile
    import io
    import pstats
    from datetime import timedelta

    from tests.k8s_world import T0

    now, version, start = T0, 10, 0
    backend.keep_statuses = backend.keep_nodes = backend.keep_visits = True
    now += timedelta(seconds=3)
    backend.statuses(now=now)
    for r in range(rounds):
        for share in shares:
            changed = max(1, int(pods * share))
            version += 1
            modify(backend, pod_t, ((start + k) % pods for k in range(changed)),
                   str(version))
            start = (start + changed) % pods
            now += timedelta(seconds=3)
            profile = cProfile.Profile(time.process_time)
            t0 = time.process_time()
            profile.enable()
            backend.statuses(now=now)
            profile.disable()
            spent = time.process_time() - t0
            bench(f"k8s_fleet_profiled_{share * 100:g}pct_s", spent, "s")
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
            note(f"round {r}, {share * 100:g}% modified: {spent:.3f} s of CPU profiled; "
                 f"load {os.getloadavg()[0]:.1f}\n{text.getvalue()}")


def child(mode: str, pods: int, shares: list[float] | None = None, rounds: int = 0,
          settled: bool = False, profile: bool = False,
          paths: tuple[str, ...] = ("plain", "every", "passes", "kept")) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")
    os.environ.setdefault("DATABASE_URL", "sqlite:////tmp/fairq_bench_k8s_fleet.sqlite3")
    import django

    django.setup()
    from kubernetes import client

    from queueing.backends.kubernetes import KubernetesBackend
    from tests.k8s_world import GPU_TYPES, KEY, T0

    pod_t, job_t, node_t = templates(settled)
    backend = KubernetesBackend(client.ApiClient(client.Configuration()), owner_key=KEY,
                                gpu_types=GPU_TYPES)
    kicks = [0]
    backend._kick = lambda: kicks.__setitem__(0, kicks[0] + 1)
    backend._remember_last_words = lambda pod: None  # no API server behind
    backend._delete_orphan_pods = lambda name: None
    backend._delete_quietly = lambda name, namespace: None
    jobs = max(1, pods * len(job_t) // len(pod_t))  # as many Jobs per pod as the world has
    spent = [0.0]
    informers = ((backend.pods, pod_t, pods), (backend.jobs, job_t, jobs),
                 (backend.nodes_informer, node_t, NODES))
    for informer, texts, count in informers:
        informer._list = fake_list(texts, count, spent)
        if mode == "full":
            informer.transform = None
    for informer in (backend.other_pods, backend.events):
        informer._list = fake_list(['{"metadata":{"name":"x@@N@@","namespace":"o"}}'], 0, spent)
    gc.collect()
    before = rss_mb()
    t0 = time.process_time()
    for informer, _, _ in informers:
        informer.relist()
    backend.other_pods.relist()
    backend.events.relist()
    relist = time.process_time() - t0 - spent[0]
    gc.collect()
    grown = rss_mb() - before
    bench(f"k8s_fleet_{mode}_cache_mb", grown, "MB")
    bench(f"k8s_fleet_{mode}_bytes_per_pod", grown * 2**20 / pods, "B")
    bench(f"k8s_fleet_{mode}_peak_mb", peak_mb(), "MB")
    bench(f"k8s_fleet_{mode}_relist_s", relist, "s")
    note(f"{mode}: {pods} pods, {jobs} Jobs, {NODES} nodes listed; {kicks[0]} kicks")

    # Watch events: MODIFIED, each a pod of the store with a new resourceVersion.
    events = min(EVENTS, pods)
    t0 = time.process_time()
    modify(backend, pod_t, range(events), "9")
    per_event = (time.process_time() - t0) / events
    bench(f"k8s_fleet_{mode}_event_us", per_event * 1e6, "us")
    backend._started = True
    for i in (backend.pods, backend.jobs, backend.nodes_informer, backend.other_pods,
              backend.events):
        i.synced.set()
    backend._probe_ok_at = time.monotonic() + 3600
    # The plain rebuilds, as these lines always measured.
    backend.keep_statuses = backend.keep_nodes = False
    t0 = time.process_time()
    statuses = backend.statuses(now=T0)
    bench(f"k8s_fleet_{mode}_statuses_s", time.process_time() - t0, "s")
    t0 = time.process_time()
    nodes = backend.nodes()
    bench(f"k8s_fleet_{mode}_nodes_s", time.process_time() - t0, "s")
    note(f"{mode}: {len(statuses)} statuses, {len(nodes)} nodes; peak RSS {peak_mb():.0f} MB")
    if shares and profile:
        profiled(backend, pod_t, pods, shares, rounds)
    elif shares:
        cycles(backend, pod_t, pods, shares, rounds, paths)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", default="full,slim")
    parser.add_argument("--child", choices=("full", "slim"))
    parser.add_argument("--cycles", default="",
                        help="shares of the pods modified between two cycles (e.g. "
                             "0.01,0.1): the kept statuses against the plain rebuild, "
                             "slim, in one process")
    parser.add_argument("--settled", action="store_true",
                        help="with --cycles: only workloads a cycle leaves as they are "
                             "(`settle`)")
    parser.add_argument("--paths", default="plain,every,passes,kept",
                        help="with --cycles: the paths compared, in this order")
    parser.add_argument("--profile", action="store_true",
                        help="with --cycles: the kept path's statuses() under cProfile "
                             "instead of the comparison")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.pods)
        return 0
    if args.cycles:
        from bench_admission import calibrate

        calibrate()
        note(f"load {os.getloadavg()}")
        child("slim", args.pods, [float(x) for x in args.cycles.split(",")], args.rounds,
              settled=args.settled, profile=args.profile,
              paths=tuple(args.paths.split(",")))
        note(f"load {os.getloadavg()}")
        calibrate()
        return 0
    from bench_admission import calibrate

    calibrate()
    results: dict[str, dict[str, list[float]]] = {"full": {}, "slim": {}}
    for r in range(args.rounds):
        for mode in args.modes.split(","):
            out = subprocess.run([sys.executable, __file__, "--child", mode, "--pods",
                                  str(args.pods)], capture_output=True, text=True,
                                 check=False)
            sys.stderr.write(out.stderr)
            if out.returncode:
                note(f"round {r} {mode} failed ({out.returncode})")
                continue
            for line in out.stdout.splitlines():
                _, name, value, unit = line.split()
                results[mode].setdefault(f"{name} {unit}", []).append(float(value))
            note(f"round {r} {mode}: " + ", ".join(
                f"{k.split()[0].removeprefix(f'k8s_fleet_{mode}_')}={v[-1]:.4g}"
                for k, v in results[mode].items()))
    for mode in ("full", "slim"):
        for key, values in results[mode].items():
            name, unit = key.split()
            bench(name, min(values), unit)
    calibrate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
