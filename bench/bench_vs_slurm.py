"""fairq against Slurm on the same machine, in the same run: single submits at
1, 4 and 8 clients, a 10,000-task array against a bulk submit of 10,000, and the priority
and fair-share reads (`sprio`, `sshare`) against fairq's.

The peer is Debian's Slurm 22.05 (bench/slurm/install.sh, `make slurm`; cached under
~/.cache/fairq-slurm): slurmctld, slurmdbd on the machine's MariaDB (127.0.0.1:3306), 4
slurmd with 8 fake GPUs each, munge, the multifactor priority with fair share. Without
root and apt, or when it does not start, the bench says so and exits 0.

How it works
  * fairq: gunicorn as the image runs it (3 `balanced` workers x 4 threads: gthread
    taking new connections by least connections, config/gunicorn_worker.py; keep-alive;
    `--workers`, `--worker-class`, `--server-threads` to compare others) on a fresh PostgreSQL
    database ($FAIRQ_BENCH_SLURM_DATABASE_URL, default .../fairq_bench_slurm; dropped and
    created afresh), rate limits in Redis ($REDIS_URL, else the local Redis), each client
    a keep-alive connection with its own token (bench_api's lean client) posting
    `POST /api/v1/jobs/` with one GPU.
  * Slurm: each client a thread running `sbatch --hold --wrap=true -G 1 -A vision` in a
    loop, as a user or a pipeline submits (the process start is part of what a Slurm
    submit costs; fairq's client keeps its connection).
  * Alternation: for each client count, `--rounds` pairs of `--burst`-second bursts, the
    order flipped every round, so both sides see the same machine; rates are submits over
    the bursts' wall time, latencies every submit's.
  * Server CPU per submit: fairq's gunicorn workers, their PostgreSQL backends and Redis
    (shared with whatever else uses it); Slurm's slurmctld, slurmdbd, munged and MariaDB
    (Linux /proc, during the bursts only). One unreported warm-up round goes first.
  * `--drf`: a second gunicorn with FAIRQ_FAST_SUBMIT=0 (every submit through DRF's
    view, as before the fast path) is a third side in the same rotation:
    vs_slurm_fast_over_drf_rate_c<N> is the fast path's gain measured in the same run.
  * Arrays: `sbatch --hold --array=0-9999` against `POST /api/v1/jobs/bulk/` with
    count=10000, alternated, `--array-runs` each; the median.
  * Reads: `sprio` and `sshare -a` (the command's wall time) against `GET /jobs/{id}/` of a
    queued job (its priority breakdown and why it waits) and `GET /fairshare/?users=1`,
    with everything the bursts queued still queued; the median of 10.

Output: `BENCH` lines vs_slurm_{fairq,slurm}_{rate,p50,p99,cpu_per_submit}_c<N>,
vs_slurm_rate_ratio_c<N> (fairq/Slurm, goal >= 1.25), vs_slurm_p99_ratio_c<N> (goal <= 1),
vs_slurm_array_10k_{fairq,slurm} and vs_slurm_array_ratio (goal <= 5), and the reads.
Run: `.venv/bin/python bench/bench_vs_slurm.py` (a few minutes on 2 cores); `--drf
--submits-only` for the submit comparison with the DRF path alone; `--load 2` for a
loaded machine (two busy loops beside both sides, each in a session of its own as other
work is: bench/_common.py start_load; as reproducible as a load gets).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, note, recreate_postgres, start_load  # noqa: E402  (bench/ is sys.path[0])
from bench_api import (  # noqa: E402
    JOB,
    _LeanConnection,
    bulk_submit,
    free_port,
    local_redis_url,
    server_cpu_seconds,
    setup_django,
    start_gunicorn,
    stop,
)

SLURM_DIR = ROOT / "bench" / "slurm"
CACHE = Path(os.environ.get("FAIRQ_SLURM_CACHE", Path.home() / ".cache" / "fairq-slurm"))
DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/fairq_bench_slurm"
SBATCH = ["sbatch", "--hold", "--wrap=true", "--parsable", "-G", "1", "-A", "vision",
          "-J", "bench", "-o", "/dev/null"]


def _cpu_of(pids: list[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
    return total


def _pids_named(*names: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() in names:
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def slurm_cpu_seconds() -> float:
    """slurmctld, slurmdbd, munged and MariaDB: what serves a Slurm submit."""
    return _cpu_of(_pids_named("slurmctld", "slurmdbd", "munged", "mariadbd", "mysqld"))


def _backend_pids(url: str) -> list[int]:
    """PostgreSQL backends connected to the bench's database (other databases on the same
    server, other sessions' tests, are not fairq's submits)."""
    import psycopg

    name = urlparse(url).path.lstrip("/")
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s "
                            "AND pid <> pg_backend_pid()", [name]).fetchall()
    return [r[0] for r in rows]


def fairq_cpu_seconds(server: subprocess.Popen[bytes], url: str) -> float:
    """gunicorn's workers, their PostgreSQL backends and Redis: what serves a fairq
    submit (the workers keep their connections: CONN_MAX_AGE)."""
    return (server_cpu_seconds(server) + _cpu_of(_backend_pids(url))
            + _cpu_of(_pids_named("redis-server")))


def slurm_up() -> bool:
    """Install (cached) and start the peer; False with a note when it cannot."""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        note("skipping the Slurm comparison: it installs Debian's Slurm (root and apt-get)")
        return False
    for script in ("install.sh", "up.sh"):
        r = subprocess.run(["bash", str(SLURM_DIR / script)], capture_output=True, text=True,
                           timeout=900)
        if r.returncode != 0:
            note(f"skipping the Slurm comparison: bench/slurm/{script} failed: "
                 f"{(r.stderr or r.stdout).strip()[-400:]}")
            return False
    os.environ["SLURM_CONF"] = str(CACHE / "etc" / "slurm.conf")
    return True


def slurm_forget_jobs() -> None:
    """Cancel the bench's held jobs (named `bench`). They stay queued otherwise, and a
    daemon kept up across runs (--keep-slurm, or another run sharing the cache) reaches
    MaxJobCount (200,000: three 10,000-task arrays and the bursts per run); sbatch then
    sleeps and retries, and the bench hangs. Cancelled jobs still count until MinJobAge
    (300 s) has passed."""
    subprocess.run(["scancel", "--name=bench"], capture_output=True, timeout=300)


def slurm_down() -> None:
    subprocess.run(["bash", str(SLURM_DIR / "down.sh")], capture_output=True, timeout=120)


def _burst(clients: int, seconds: float, submit_factory: object) -> tuple[int, list[float], int]:
    """`clients` threads submitting until the deadline; (count, latencies, errors)."""
    lats: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    start = threading.Barrier(clients + 1)
    deadline = [0.0]

    def run(i: int) -> None:
        submit = submit_factory(i)  # type: ignore[operator]
        submit()  # warm: connect, first request
        start.wait()
        lat = lats[i]
        while (t0 := time.perf_counter()) < deadline[0]:
            ok = submit()
            lat.append(time.perf_counter() - t0)
            if not ok:
                errors[i] += 1

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    deadline[0] = time.perf_counter() + 1e9
    start.wait()
    t_start = time.perf_counter()
    deadline[0] = t_start + seconds
    for t in threads:
        t.join()
    all_lat = [x for lat in lats for x in lat]
    return len(all_lat), all_lat, sum(errors)


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * q))] * 1000


def compare_submits(port: int, keys: list[str], server: subprocess.Popen[bytes], url: str,
                    clients: int, rounds: int, burst: float, report: bool = True,
                    drf: tuple[int, subprocess.Popen[bytes]] | None = None) -> None:
    """Slurm and fairq alternated; with `drf` (the port and process of a second gunicorn
    with FAIRQ_FAST_SUBMIT=0) fairq's DRF path is a third side, in the same rotation."""
    body = json.dumps(JOB).encode()

    def fairq_factory(on: int) -> object:
        def factory(i: int) -> object:
            conn = _LeanConnection(on, keys[i], body)
            return lambda: conn.post() == 201
        return factory

    def slurm_factory(_i: int) -> object:
        return lambda: subprocess.run(SBATCH, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL).returncode == 0

    sides: dict[str, tuple[object, object]] = {
        "fairq": (fairq_factory(port), lambda: fairq_cpu_seconds(server, url)),
        "slurm": (slurm_factory, slurm_cpu_seconds),
    }
    if drf is not None:
        sides["fairq_drf"] = (fairq_factory(drf[0]), lambda: fairq_cpu_seconds(drf[1], url))
    names = list(sides)
    totals: dict[str, list[Any]] = {side: [0, 0.0, [], 0, 0.0] for side in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        if r % 2:
            order.reverse()
        for side in order:
            factory, cpu = sides[side]
            c0, t0 = cpu(), time.perf_counter()  # type: ignore[operator]
            n, lat, err = _burst(clients, burst, factory)
            wall, used = time.perf_counter() - t0, cpu() - c0  # type: ignore[operator]
            tot = totals[side]
            tot[0] += n
            tot[1] += wall
            tot[2] += lat
            tot[3] += err
            tot[4] += used
    if not report:
        return
    rates = {}
    for side, (n, wall, lat, err, used) in totals.items():
        rates[side] = n / wall
        bench(f"vs_slurm_{side}_rate_c{clients}", n / wall, "submits/s")
        bench(f"vs_slurm_{side}_p50_c{clients}", _pct(lat, 0.5), "ms")
        bench(f"vs_slurm_{side}_p99_c{clients}", _pct(lat, 0.99), "ms")
        bench(f"vs_slurm_{side}_cpu_per_submit_c{clients}", used * 1000 / max(n, 1), "ms")
        if err:
            bench(f"vs_slurm_{side}_errors_c{clients}", err, "submits")
    bench(f"vs_slurm_rate_ratio_c{clients}", rates["fairq"] / rates["slurm"], "x")
    bench(f"vs_slurm_p99_ratio_c{clients}",
          _pct(totals["fairq"][2], 0.99) / _pct(totals["slurm"][2], 0.99), "x")
    if drf is not None:
        bench(f"vs_slurm_fast_over_drf_rate_c{clients}", rates["fairq"] / rates["fairq_drf"],
              "x")
        bench(f"vs_slurm_drf_rate_ratio_c{clients}", rates["fairq_drf"] / rates["slurm"], "x")


def compare_arrays(port: int, key: str, runs: int, count: int = 10_000) -> None:
    fairq, slurm = [], []
    for r in range(runs):
        for side in (("fairq", "slurm") if r % 2 == 0 else ("slurm", "fairq")):
            if side == "fairq":
                fairq.append(bulk_submit(port, key, count))
            else:
                t0 = time.perf_counter()
                subprocess.run([*SBATCH, f"--array=0-{count - 1}"], check=True,
                               stdout=subprocess.DEVNULL)
                slurm.append(time.perf_counter() - t0)
    f, s = statistics.median(fairq), statistics.median(slurm)
    bench("vs_slurm_array_10k_fairq", f * 1000, "ms")
    bench("vs_slurm_array_10k_slurm", s * 1000, "ms")
    bench("vs_slurm_array_ratio", f / s, "x")


def _timed(fn: object, n: int = 10) -> float:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - t0)
    return statistics.median(out) * 1000


def compare_reads(port: int, key: str) -> None:
    """sprio / sshare against fairq's priority (a queued job's detail) and standings."""
    def get(path: str) -> bytes:
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                     headers={"Authorization": f"Token {key}"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.read()

    # A few Slurm jobs that are pending for their start time, not held: sprio shows only
    # those (a held job has priority 0).
    for _ in range(20):
        subprocess.run(["sbatch", "--begin=now+1day", "--wrap=true", "-G", "1", "-A", "vision",
                        "-o", "/dev/null"], check=True, stdout=subprocess.DEVNULL)
    job_id = json.loads(get("/api/v1/jobs/?status=QUEUED&page_size=1"))["results"][0]["id"]

    def cli(*cmd: str) -> object:
        return lambda: subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)

    bench("vs_slurm_sprio", _timed(cli("sprio")), "ms")
    bench("vs_slurm_fairq_job_priority", _timed(lambda: get(f"/api/v1/jobs/{job_id}/")), "ms")
    bench("vs_slurm_sshare", _timed(cli("sshare", "-a")), "ms")
    bench("vs_slurm_fairq_fairshare", _timed(lambda: get("/api/v1/fairshare/?users=1")), "ms")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", default="1,4,8", help="client counts, comma-separated")
    p.add_argument("--rounds", type=int, default=4, help="alternating burst pairs per count")
    p.add_argument("--burst", type=float, default=3.0, help="seconds per burst")
    p.add_argument("--array-runs", type=int, default=3)
    # The image's gunicorn (platform/Dockerfile): 3 balanced gthread workers x 4 threads.
    p.add_argument("--workers", type=int, default=int(os.environ.get("BENCH_WORKERS", "3")))
    p.add_argument("--worker-class", default=os.environ.get("BENCH_WORKER_CLASS", "balanced"))
    p.add_argument("--server-threads", type=int, default=4, help="gthread workers only")
    p.add_argument("--keep-slurm", action="store_true", help="leave the Slurm daemons up")
    p.add_argument("--drf", action="store_true",
                   help="also fairq's DRF submit path (FAIRQ_FAST_SUBMIT=0) as a third side")
    p.add_argument("--submits-only", action="store_true", help="skip arrays and reads")
    p.add_argument("--load", type=int, default=0,
                   help="busy-loop processes beside the bench (a loaded machine, the same "
                        "for both sides and from run to run); 0: none")
    a = p.parse_args()
    counts = [int(c) for c in a.clients.split(",")]

    url = os.environ.get("FAIRQ_BENCH_SLURM_DATABASE_URL", DEFAULT_PG)
    if urlparse(url).hostname not in {"127.0.0.1", "localhost", "::1"}:
        note(f"refusing a non-loopback database {url}")
        return 2
    if not slurm_up():
        return 0
    try:
        if not recreate_postgres(url):
            note("skipping the Slurm comparison: fairq's side runs on PostgreSQL")
            return 0
        redis = local_redis_url()
        if redis:
            os.environ["REDIS_URL"] = redis
        keys = setup_django(url, max(counts) + 1)
        port = free_port()
        note(f"fairq: gunicorn {a.workers} {a.worker_class} workers x {a.server_threads} "
             "threads, rate limits in "
             f"{'Redis ' + redis if redis else 'local memory'}; Slurm: "
             f"{subprocess.run(['sbatch', '-V'], capture_output=True, text=True).stdout.strip()}"
             f", {len(_pids_named('slurmd'))} slurmd; bursts of {a.burst} s x {a.rounds} "
             f"rounds; load {os.getloadavg()[0]:.2f}")
        server = start_gunicorn(url, port, a.workers, a.server_threads, a.worker_class,
                                extra_env={"FAIRQ_FAST_SUBMIT": "1"})
        drf = None
        if a.drf:
            drf_port = free_port()
            drf = (drf_port, start_gunicorn(url, drf_port, a.workers, a.server_threads,
                                            a.worker_class,
                                            extra_env={"FAIRQ_FAST_SUBMIT": "0"}))
        hogs = start_load(a.load)
        if hogs:
            bench("vs_slurm_load_processes", a.load, "busy loops")
        try:
            # Warm-up (not reported): gunicorn's workers import and connect lazily.
            compare_submits(port, keys, server, url, max(counts), 1, a.burst, report=False,
                            drf=drf)
            for c in counts:
                compare_submits(port, keys, server, url, c, a.rounds, a.burst, drf=drf)
            if not a.submits_only:
                compare_arrays(port, keys[-1], a.array_runs)
                compare_reads(port, keys[-1])
            bench("host_load_average_1m", os.getloadavg()[0], "")
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
            stop(server)
            if drf is not None:
                stop(drf[1])
    finally:
        slurm_forget_jobs()
        if not a.keep_slurm:
            slurm_down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
