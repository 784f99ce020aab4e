"""API submit benchmark: single-job submissions through gunicorn on PostgreSQL, a bulk
array job of 10,000, and the raw psycopg INSERT rate of the same rows for comparison.

Goals: >= 500 single submissions/s with p99 < 50 ms; 10,000 jobs in one bulk request in
under 2 s.

How it works
  * Database: PostgreSQL at $FAIRQ_BENCH_API_DATABASE_URL, default
    postgres://postgres@127.0.0.1:5432/fairq_bench, dropped and created afresh every run
    (never $DATABASE_URL: the bench would wipe it), migrated, seeded with 3 teams, GPU types,
    tiers and one API token per client worker (throttling stays on, per token, with a rate
    far above what is measured).
  * Server: gunicorn on 127.0.0.1 and a free port, settings `bench.settings_api`: the
    test settings (eager Celery, no scheduler kicks: the web path alone) with persistent
    database connections as in production, and the rate-limit buckets in Redis as in
    production when a Redis answers ($REDIS_URL, else 127.0.0.1:6379; local memory
    otherwise, said on the first line). Default: 2 *sync* workers (1 per core), one
    request at a time each, no keep-alive (`--worker-class`, `--workers`,
    `--server-threads`; BENCH_WORKER_CLASS, BENCH_WORKERS). Why not gthread with
    keep-alive: a gthread worker accepts every connection offered while it is awake, so
    the 8 long-lived client connections pile onto one or two workers and each worker is
    bound to one core by the GIL: 2-4 gthread workers plateaued at ~100 req/s with the
    host 35% idle. Sync workers take a new connection per request from the shared
    listen queue, so whichever worker is free serves it and both cores stay busy.
    A submit is CPU-bound Python with ~1 ms of database and Redis waits: 1 worker per
    core measured best (227/s against 198/s with 4: fewer processes thrash the caches
    less).
  * Client: `--clients` processes, each with `--threads` threads and a lean HTTP/1.1
    client (one prebuilt request, the answer read by Content-Length; it reconnects when
    the server closes, as sync workers do), POST /api/v1/jobs/ `--requests` times in total
    after a warm-up; every latency is recorded; rate = requests / wall time. The client
    shares the two cores, so its CPU is reported (api_client_cpu_per_submit), as are
    PostgreSQL's (api_postgres_cpu_per_submit) and the whole host's
    (api_host_cpu_per_submit): host CPU per submit x rate ~ 2 cores means saturated.
  * Bulk: POST /api/v1/jobs/bulk/ with count=10000, `--bulk-runs` times; the median.
  * Floors (bench/floor_app.py; skip with --no-floors): the same gunicorn and load on a
    bare WSGI app (gunicorn and the client alone) and on a plain Django view that runs the
    submit's three statements through the same functions, without DRF, validation,
    throttling or idempotency. They tell what this machine allows: the submit's rate is
    read against api_floor_django_rate, not against an absolute goal alone.
  * Raw INSERT: the same rows (a job and its submit event, one transaction per job) written
    with psycopg from the same number of connections, no Django, no HTTP; then the same
    10,000 rows with one executemany per table in one transaction.

Output: `BENCH <name> <value> <unit>` lines, among them api_submit_rate, api_submit_p50,
api_submit_p99, bulk_submit_10k, api_floor_{wsgi,django}_rate, psycopg_insert_rate and
api_vs_insert_ratio; also the
CPU per submit of the gunicorn workers, the clients, PostgreSQL and the host, and the
host's load average, to tell a slow code path from a busy machine.
Run: `.venv/bin/python bench/bench_api.py` (`make bench`); about a minute on 2 cores.
It stops by itself and stops its gunicorn whatever happens.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, note, recreate_postgres  # noqa: E402  (bench/ is sys.path[0])

DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/fairq_bench"
JOB = {"team": "vision", "name": "bench", "image": "ghcr.io/acme/train:1.4",
       "command": ["python", "train.py"], "args": ["--epochs", "1"], "env": {"SEED": "1"},
       "gpu_type": "h100", "gpus": 1, "replicas": 1, "tier": "normal",
       "max_runtime_seconds": 3600}


def setup_django(url: str, tokens: int) -> list[str]:
    """Migrate and seed; returns API keys (one per client thread)."""
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    from django.contrib.auth import get_user_model

    from accounts.models import Membership, Role, Team
    from accounts.services import token_issue
    from queueing.models import GpuType, Quota, Tier

    for slug, weight in (("h100", 2.0), ("a100", 1.0)):
        GpuType.objects.create(slug=slug, name=slug.upper(), billing_weight=weight)
    for slug, rank in (("low", 0), ("normal", 100), ("high", 200)):
        Tier.objects.create(slug=slug, name=slug, rank=rank, priority_class_name=f"fq-{slug}",
                            priority_value=rank * 10, open_to_all_teams=True)
    user = get_user_model().objects.create(username="bench")
    for slug, weight in (("vision", 3.0), ("nlp", 2.0), ("speech", 1.0)):
        team = Team.objects.create(slug=slug, name=slug, weight=weight)
        for g in GpuType.objects.all():
            Quota.objects.create(team=team, gpu_type=g, nominal=8)
    Membership.objects.create(user=user, team=Team.objects.get(slug="vision"),
                              role=Role.MEMBER)
    keys = [token_issue(user=user, name=f"bench-{i}").key for i in range(tokens)]
    from django.db import connections

    connections.close_all()
    return keys


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def local_redis_url() -> str | None:
    """$REDIS_URL, else the local Redis when one answers (production keeps the rate-limit
    buckets in Redis: measure that), else None (local memory)."""
    if os.environ.get("REDIS_URL"):
        return os.environ["REDIS_URL"]
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            if s.recv(16).startswith(b"+PONG"):
                return "redis://127.0.0.1:6379/0"
    except OSError:
        pass
    return None


# Short names for worker classes of fairq's own: `balanced` is the image's
# (platform/Dockerfile), gthread taking new connections by least connections.
WORKER_CLASSES = {"balanced": "config.gunicorn_worker.BalancedThreadWorker"}


def start_gunicorn(url: str, port: int, workers: int, threads: int,
                   worker_class: str = "gthread", app: str = "config.wsgi:application",
                   extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "bench.settings_api",
           "FAIRQ_API_RATE": "100000000/min", "FAIRQ_LOG_LEVEL": "WARNING",
           "DJANGO_ALLOWED_HOSTS": "127.0.0.1", **(extra_env or {})}
    gunicorn = str(Path(sys.executable).parent / "gunicorn")
    proc = subprocess.Popen(
        [gunicorn, app, "--bind", f"127.0.0.1:{port}",
         "--workers", str(workers), "--worker-class",
         WORKER_CLASSES.get(worker_class, worker_class), "--threads", str(threads),
         "--keep-alive", "30", "--log-level", "warning", "--timeout", "60"],
        cwd=ROOT, env=env, start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("gunicorn exited at start")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("gunicorn did not listen within 30 s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def server_cpu_seconds(proc: subprocess.Popen[bytes]) -> float:
    """User + system CPU of gunicorn's workers so far (Linux /proc), 0 when unknown."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    try:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        for pid in [str(proc.pid), *children]:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    except (OSError, IndexError, ValueError):
        return 0.0
    return total


def _post(conn: http.client.HTTPConnection, path: str, key: str, body: bytes) -> tuple[int, bytes]:
    conn.request("POST", path, body=body, headers={
        "Authorization": f"Token {key}", "Content-Type": "application/json"})
    r = conn.getresponse()
    return r.status, r.read()


class _LeanConnection:
    """A keep-alive HTTP/1.1 connection that sends one prebuilt request and reads the
    answer by its Content-Length: a fraction of http.client's CPU, which shares the two
    cores with gunicorn and PostgreSQL."""

    def __init__(self, port: int, key: str, body: bytes) -> None:
        self.port = port
        self.sock: socket.socket | None = None
        self.request = (
            f"POST /api/v1/jobs/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Token {key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        self.buf = b""

    def post(self) -> int:
        if self.sock is None:  # first request, or the server closed after the last one
            self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.buf = b""
        self.sock.sendall(self.request)
        buf = self.buf
        while (end := buf.find(b"\r\n\r\n")) < 0:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("server closed the connection")
            buf += chunk
        head = buf[:end].decode("latin-1")
        length = None
        close = False
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "connection":
                close = value.strip().lower() == "close"
        if length is None:
            raise RuntimeError(f"answer without Content-Length: {head!r}")
        buf = buf[end + 4:]
        while len(buf) < length:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("server closed the connection")
            buf += chunk
        self.buf = buf[length:]
        if close:
            self.close()
        return int(head.split(" ", 2)[1])

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def _client_process(port: int, keys: list[str], per_thread: int, warmup: int,
                    start_at: float, out: Any) -> None:
    """One client process: a thread per key, each with its own keep-alive connection."""
    results: list[list[float]] = [[] for _ in keys]
    errors = [0]
    body = json.dumps(JOB).encode()

    def run(i: int) -> None:
        conn = _LeanConnection(port, keys[i], body)
        for _ in range(warmup):
            conn.post()
        while time.time() < start_at:
            time.sleep(0.001)
        lat = results[i]
        for _ in range(per_thread):
            t0 = time.perf_counter()
            status = conn.post()
            lat.append(time.perf_counter() - t0)
            if status != 201:
                errors[0] += 1
        conn.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(keys))]
    for t in threads:
        t.start()
    while time.time() < start_at:
        time.sleep(0.001)
    cpu0 = time.process_time()  # the measured part only (warm-up is over by now)
    for t in threads:
        t.join()
    cpu = time.process_time() - cpu0
    out.put(([x for r in results for x in r], errors[0], time.time(), cpu))


def single_submits(port: int, keys: list[str], clients: int, threads: int,
                   requests: int) -> tuple[float, list[float], int, float]:
    per_thread = max(1, requests // (clients * threads))
    start_at = time.time() + 2.0  # every connection warmed up and waiting
    q: Any = mp.get_context("fork").Queue()
    procs = [mp.get_context("fork").Process(
        target=_client_process,
        args=(port, keys[c * threads:(c + 1) * threads], per_thread, 5, start_at, q))
        for c in range(clients)]
    for p in procs:
        p.start()
    latencies: list[float] = []
    errors = 0
    ends = []
    client_cpu = 0.0
    for _ in procs:
        lat, err, end, cpu = q.get(timeout=600)
        latencies += lat
        errors += err
        ends.append(end)
        client_cpu += cpu
    for p in procs:
        p.join(timeout=30)
    wall = max(ends) - start_at
    return len(latencies) / wall, latencies, errors, client_cpu


def postgres_cpu_seconds() -> float:
    """User + system CPU of every process named postgres so far (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if (d / "comm").read_text().strip() != "postgres":
                continue
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
    return total


def host_busy_seconds() -> float:
    """CPU seconds the whole host was busy so far (all cores; /proc/stat)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def bulk_submit(port: int, key: str, count: int) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = json.dumps({**JOB, "name": "arr", "count": count}).encode()
    t0 = time.perf_counter()
    status, content = _post(conn, "/api/v1/jobs/bulk/", key, body)
    took = time.perf_counter() - t0
    conn.close()
    if status != 201 or json.loads(content)["count"] != count:
        raise RuntimeError(f"bulk submit answered {status}: {content[:200]!r}")
    return took


def _row_values(url: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Ids of the seeded rows the raw INSERTs refer to."""
    import psycopg

    with psycopg.connect(url) as conn:
        ids = {
            "team_id": conn.execute("SELECT id FROM accounts_team WHERE slug='vision'").fetchone()[0],
            "gpu_type_id": conn.execute("SELECT id FROM queueing_gputype WHERE slug='h100'")
            .fetchone()[0],
            "tier_id": conn.execute("SELECT id FROM queueing_tier WHERE slug='normal'").fetchone()[0],
            "submitter_id": conn.execute("SELECT id FROM auth_user WHERE username='bench'")
            .fetchone()[0],
        }
    return ids, {}


JOB_SQL = (
    "INSERT INTO queueing_job (team_id, submitter_id, name, image, command, args, env, "
    "gpu_type_id, gpus_per_replica, replicas, tier_id, max_runtime_seconds, status, attempt, "
    "idempotency_key, created_at, updated_at, placement, message) VALUES (%s, %s, %s, %s, %s, "
    "%s, %s, %s, %s, %s, %s, %s, 'QUEUED', 1, NULL, %s, %s, '[]', '') RETURNING id"
)
EVENT_SQL = (
    "INSERT INTO queueing_jobevent (job_id, at, kind, from_status, to_status, actor_id, "
    "actor_label, reason, attempt, data) VALUES (%s, %s, 'transition', '', 'QUEUED', %s, "
    "'bench', 'submitted', 1, '{}')"
)


def _job_params(ids: dict[str, Any], now: datetime) -> tuple[Any, ...]:
    return (ids["team_id"], ids["submitter_id"], JOB["name"], JOB["image"],
            json.dumps(JOB["command"]), json.dumps(JOB["args"]), json.dumps(JOB["env"]),
            ids["gpu_type_id"], 1, 1, ids["tier_id"], 3600, now, now)


def raw_inserts(url: str, connections: int, jobs: int) -> float:
    """Jobs/s: a job row and its event row per transaction, `connections` in parallel."""
    import psycopg

    ids, _ = _row_values(url)
    per = max(1, jobs // connections)
    barrier = threading.Barrier(connections + 1)

    def run() -> None:
        with psycopg.connect(url) as conn:
            barrier.wait()
            for _ in range(per):
                now = datetime.now(UTC)
                with conn.transaction():
                    job_id = conn.execute(JOB_SQL, _job_params(ids, now)).fetchone()[0]
                    conn.execute(EVENT_SQL, (job_id, now, ids["submitter_id"]))

    threads = [threading.Thread(target=run) for _ in range(connections)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return per * connections / (time.perf_counter() - t0)


def raw_bulk(url: str, count: int) -> float:
    import psycopg

    ids, _ = _row_values(url)
    now = datetime.now(UTC)
    t0 = time.perf_counter()
    with psycopg.connect(url) as conn, conn.transaction(), conn.cursor() as cur:
        cur.executemany(JOB_SQL, [_job_params(ids, now)] * count, returning=True)
        job_ids = []
        while True:
            job_ids.append(cur.fetchone()[0])  # type: ignore[index]
            if not cur.nextset():
                break
        cur.executemany(EVENT_SQL, [(j, now, ids["submitter_id"]) for j in job_ids])
    return time.perf_counter() - t0


def floors(url: str, keys: list[str], a: argparse.Namespace) -> None:
    """The same load on less than a submit (bench/floor_app.py): the bare WSGI app, then a
    plain Django view doing the submit's three statements. Rates and server CPU per
    request, so fairq's figures can be read against what this machine allows."""
    for name, app, extra in (
        ("wsgi", "bench.floor_app:wsgi_app", {}),
        ("django", "config.wsgi:application", {"FAIRQ_BENCH_URLCONF": "bench.floor_app"}),
    ):
        port = free_port()
        server = start_gunicorn(url, port, a.workers, a.server_threads, a.worker_class,
                                app=app, extra_env=extra)
        try:
            cpu_before = server_cpu_seconds(server)
            rate, lat, errors, _ = single_submits(port, keys, a.clients, a.threads, a.requests)
            cpu = server_cpu_seconds(server) - cpu_before
        finally:
            stop(server)
        lat_ms = sorted(x * 1000 for x in lat)
        bench(f"api_floor_{name}_rate", rate, "req/s")
        bench(f"api_floor_{name}_p99", lat_ms[min(len(lat_ms) - 1, int(len(lat_ms) * 0.99))], "ms")
        if cpu > 0:
            bench(f"api_floor_{name}_server_cpu_per_request", cpu * 1000 / len(lat), "ms")
        if errors:
            bench(f"api_floor_{name}_errors", errors, "requests")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--clients", type=int, default=2, help="client processes")
    p.add_argument("--threads", type=int, default=4, help="connections per client process")
    p.add_argument("--workers", type=int, default=int(os.environ.get("BENCH_WORKERS", "2")))
    p.add_argument("--server-threads", type=int, default=1, help="gthread workers only")
    p.add_argument("--worker-class", default=os.environ.get("BENCH_WORKER_CLASS", "sync"))
    p.add_argument("--bulk-runs", type=int, default=3)
    p.add_argument("--no-floors", action="store_true",
                   help="skip the floors (bench/floor_app.py: bare WSGI, plain Django view)")
    a = p.parse_args()

    url = os.environ.get("FAIRQ_BENCH_API_DATABASE_URL", DEFAULT_PG)
    if urlparse(url).hostname not in {"127.0.0.1", "localhost", "::1"}:
        note(f"refusing a non-loopback database {url}")
        return 2
    if not recreate_postgres(url):  # it has said why
        note("skipping the API bench: it measures gunicorn on PostgreSQL")
        return 0
    redis = local_redis_url()
    if redis:
        os.environ["REDIS_URL"] = redis  # gunicorn's settings read it: rate limits in Redis
    keys = setup_django(url, a.clients * a.threads + 1)
    port = free_port()
    note(f"gunicorn: {a.workers} {a.worker_class} workers x {a.server_threads} threads on 127.0.0.1:{port}; "
         f"client: {a.clients} processes x {a.threads} connections, {a.requests} requests; "
         f"cache (rate limits): {'Redis ' + redis if redis else 'local memory (no Redis found)'}")
    server = start_gunicorn(url, port, a.workers, a.server_threads, a.worker_class)
    try:
        cpu_before = server_cpu_seconds(server)
        pg_before, host_before = postgres_cpu_seconds(), host_busy_seconds()
        rate, lat, errors, client_cpu = single_submits(port, keys[:-1], a.clients, a.threads,
                                                       a.requests)
        cpu = server_cpu_seconds(server) - cpu_before
        pg_cpu = postgres_cpu_seconds() - pg_before
        host_busy = host_busy_seconds() - host_before
        lat_ms = sorted(x * 1000 for x in lat)
        bench("api_submit_rate", rate, "req/s")
        bench("api_submit_p50", statistics.median(lat_ms), "ms")
        bench("api_submit_p99", lat_ms[min(len(lat_ms) - 1, int(len(lat_ms) * 0.99))], "ms")
        bench("api_submit_errors", errors, "requests")
        if cpu > 0:
            # Includes the warm-up requests (5 per connection): a slight overestimate.
            bench("api_server_cpu_per_submit", cpu * 1000 / len(lat), "ms")
        # Where the rest of the two cores went: the client processes (measured part only),
        # PostgreSQL's backends, and the whole host (warm-up included, like the server's).
        bench("api_client_cpu_per_submit", client_cpu * 1000 / len(lat), "ms")
        if pg_cpu > 0:
            bench("api_postgres_cpu_per_submit", pg_cpu * 1000 / len(lat), "ms")
        if host_busy > 0:
            bench("api_host_cpu_per_submit", host_busy * 1000 / len(lat), "ms")
        load = os.getloadavg()[0]
        bench("host_load_average_1m", load, "")
        bulks = [bulk_submit(port, keys[-1], 10_000) for _ in range(a.bulk_runs)]
        bench("bulk_submit_10k", statistics.median(bulks), "s")
    finally:
        stop(server)
    if not a.no_floors:
        floors(url, keys[:-1], a)
    insert_rate = raw_inserts(url, a.clients * a.threads, a.requests)
    bench("psycopg_insert_rate", insert_rate, "rows/s")
    bench("api_vs_insert_ratio", rate / insert_rate, "x")
    bench("psycopg_bulk_insert_10k", raw_bulk(url, 10_000), "s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
