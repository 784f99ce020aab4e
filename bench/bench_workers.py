"""gunicorn worker settings for the submit path, side by side: the same fairq,
database and Redis behind gunicorns of different worker classes, bursts alternated.

Each side is a gunicorn (bench_api.start_gunicorn) on one fresh PostgreSQL database;
clients are bench_api's lean keep-alive connections posting `POST /api/v1/jobs/`. For
each client count, `--rounds` rounds of `--burst`-second bursts, one per side, the order
reversed every other round; the median of the rounds per side.

A side's class is gunicorn's (`sync`, `gthread`, ...), `balanced` for the image's
`config.gunicorn_worker.BalancedThreadWorker` (gthread taking new connections by least
connections), or any dotted worker class. `--load N` runs N busy loops beside all sides.
A side may carry environment for its gunicorn after a fourth colon, `VAR=value` pairs
joined by `+`; its name then ends with the variables' names. The durable commit's share
of a submit (docs/performance.md): `--sides balanced:3:4,balanced:3:4:PGOPTIONS=
-csynchronous_commit=off --clients 1 --load 2` (libpq's PGOPTIONS: that side's
PostgreSQL sessions answer before the WAL reaches the disk; measurement only).

Output: `BENCH workers_<side>_rate_c<N>` (submits/s, the median round),
`workers_<side>_p99_c<N>` (ms, over every submit of every round) and
`workers_<side>_cpu_c<N>` (ms of server CPU per submit: gunicorn's workers, their
PostgreSQL backends and Redis).
Run: `.venv/bin/python bench/bench_workers.py [--sides gthread:3:4,balanced:3:4] [--load 2]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, note, recreate_postgres, start_load  # noqa: E402  (bench/ is sys.path[0])
from bench_api import (  # noqa: E402
    JOB,
    _LeanConnection,
    free_port,
    local_redis_url,
    setup_django,
    start_gunicorn,
    stop,
)
from bench_vs_slurm import _burst, _pct, fairq_cpu_seconds  # noqa: E402

DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/fairq_bench_workers"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sides", default="sync:4:1,gthread:2:4",
                   help="class:workers:threads[:VAR=value+...], comma-separated")
    p.add_argument("--clients", default="1,4,8")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--burst", type=float, default=3.0)
    p.add_argument("--load", type=int, default=0,
                   help="busy-loop processes beside all sides (a loaded machine); 0: none")
    a = p.parse_args()
    url = os.environ.get("FAIRQ_BENCH_WORKERS_DATABASE_URL", DEFAULT_PG)
    if urlparse(url).hostname not in {"127.0.0.1", "localhost", "::1"}:
        note(f"refusing a non-loopback database {url}")
        return 2
    if not recreate_postgres(url):
        note("skipping: this bench runs on PostgreSQL")
        return 0
    redis = local_redis_url()
    if redis:
        os.environ["REDIS_URL"] = redis
    counts = [int(c) for c in a.clients.split(",")]
    keys = setup_django(url, max(counts) + 1)
    body = json.dumps({**JOB, "gpus": 1}).encode()
    sides = {}
    hogs: list[subprocess.Popen[bytes]] = []
    try:
        for spec in a.sides.split(","):
            kind, workers, threads, *more = spec.split(":", 3)
            env = dict(pair.split("=", 1) for pair in more[0].split("+")) if more else {}
            port = free_port()
            name = f"{kind.rsplit('.', 1)[-1]}{workers}x{threads}" + "".join(
                f"_{var.lower()}" for var in env)
            sides[name] = (port, start_gunicorn(
                url, port, int(workers), int(threads), kind,
                extra_env={"FAIRQ_FAST_SUBMIT": "1", **env}))
        note(f"sides {list(sides)}; load {os.getloadavg()[0]:.2f}")
        hogs = start_load(a.load)
        if hogs:
            bench("workers_load_processes", a.load, "busy loops")

        def factory(port: int) -> object:
            def make(i: int) -> object:
                conn = _LeanConnection(port, keys[i], body)
                return lambda: conn.post() == 201
            return make

        for port, _ in sides.values():  # warm-up: workers import and connect lazily
            _burst(max(counts), 1.0, factory(port))
        for clients in counts:
            rates: dict[str, list[float]] = {k: [] for k in sides}
            cpus: dict[str, list[float]] = {k: [] for k in sides}
            lats: dict[str, list[float]] = {k: [] for k in sides}
            for r in range(a.rounds):
                order = list(sides) if r % 2 == 0 else list(reversed(sides))
                for name in order:
                    port, proc = sides[name]
                    c0 = fairq_cpu_seconds(proc, url)
                    n, lat, _ = _burst(clients, a.burst, factory(port))
                    rates[name].append(n / a.burst)
                    lats[name] += lat
                    cpus[name].append((fairq_cpu_seconds(proc, url) - c0) * 1000 / max(n, 1))
            for name in sides:
                bench(f"workers_{name}_rate_c{clients}", statistics.median(rates[name]),
                      "submits/s")
                bench(f"workers_{name}_p99_c{clients}", _pct(lats[name], 0.99), "ms")
                bench(f"workers_{name}_cpu_c{clients}", statistics.median(cpus[name]), "ms")
                note(f"  {name} c{clients} rounds: {[round(x) for x in rates[name]]}")
        bench("host_load_average_1m", os.getloadavg()[0], "")
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        for _, proc in sides.values():
            stop(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
