"""Webhook receivers that hang or drip against the scheduler's cadence (docs/webhooks.md,
"A worker of their own"): the real stack as docker-compose runs it, on one side's code.

A side is a fairq tree (`--code`, default this checkout; an export of an older commit for
"before") and the Celery workers its docker-compose.yml runs (read from that file: the
`worker` service and, when there is one, the `webhooks` service), with gunicorn, beat,
PostgreSQL (DATABASE_URL's database, dropped and created) and Redis (REDIS_URL's db,
flushed as broker and cache), config.settings.prod, the simulated cluster. Team vision
registers two endpoints: one that never answers and one that drips a 200 a byte a second.
Teams vision, nlp and speech each submit a 1-GPU job of 4 s every 2 s for `--seconds`.

Measured: the cycles that completed (distinct `last_success_cycle` of /healthz/scheduler,
polled every 0.25 s), the longest time without one (its `last_success_age_seconds`), the
share of polls answered 200, and
nlp's and speech's queued wait (admitted_at - created_at; a job still queued at the end
counts its wait so far). Output: `BENCH webhook_iso_<side>_<figure> <value> <unit>`.

Run: `.venv/bin/python bench/bench_webhook_isolation.py --side after` and, on an export of
the commit before, `--side before --code /tmp/fairq-before`. `--shared` runs one worker
for both queues instead (a deployment that ignores the compose file): with this code the
try's deadline bounds the harm and /healthz/scheduler says "behind".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from _common import bench, note, recreate_postgres  # noqa: E402

PORT = 8791
STOP = threading.Event()


def receiver(behaviour: str) -> str:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            if behaviour == "hang":
                STOP.wait(300)
                return
            for byte in b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok":
                if STOP.wait(1.0):
                    return
                try:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                except OSError:
                    return

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/{behaviour}"


def api(method: str, path: str, token: str, body: Any = None) -> Any:
    req = urllib.request.Request(
        f"http://127.0.0.1:{PORT}{path}", method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", required=True)
    parser.add_argument("--code", default=str(ROOT))
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--shared", action="store_true",
                        help="one worker for both queues (-Q celery,webhooks), as main's "
                             "compose file ran it, instead of the side's compose workers")
    args = parser.parse_args()
    code = Path(args.code)
    db_url, redis_url = os.environ["DATABASE_URL"], os.environ["REDIS_URL"]
    recreate_postgres(db_url)
    import redis

    redis.Redis.from_url(redis_url).flushdb()
    env = {**os.environ, "PYTHONPATH": str(code), "PYTHONDONTWRITEBYTECODE": "1",
           "DJANGO_SETTINGS_MODULE": "config.settings.prod",
           "DJANGO_SECRET_KEY": "bench-only-0123456789abcdef0123456789abcdef",
           "DJANGO_ALLOWED_HOSTS": "127.0.0.1", "DJANGO_SECURE_SSL_REDIRECT": "false",
           "DJANGO_SECURE_COOKIES": "false", "FAIRQ_CLUSTER_BACKEND": "simulated",
           "FAIRQ_WEBHOOK_ALLOW_PRIVATE": "true", "FAIRQ_LOG_FORMAT": "plain",
           "FAIRQ_LOG_LEVEL": "WARNING", "FAIRQ_HEARTBEAT_DIR": "/tmp",
           "FAIRQ_SIM_NODES": "4x8xh100,4x8xa100"}
    env.pop("FAIRQ_WEBHOOK_QUEUE", None)
    bindir = Path(sys.executable).parent
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], cwd=code, env=env, check=True)
    token = subprocess.run(
        [*manage, "shell", "-c",
         "from queueing.services.demo import demo_seed; demo_seed(); "
         "from accounts.services import token_issue; from django.contrib.auth.models import User; "
         "print(token_issue(user=User.objects.get(username='admin')).key)"],
        cwd=code, env=env, check=True, capture_output=True, text=True).stdout.split()[-1]

    compose = yaml.safe_load((code / "docker-compose.yml").read_text())["services"]
    commands = [compose[name]["command"] for name in ("worker", "webhooks") if name in compose]
    if args.shared:
        commands = [["celery", "-A", "config", "worker", "-Q", "celery,webhooks", "-l", "INFO",
                     "--concurrency", "1"]]
    commands.append(compose["beat"]["command"])
    note(f"{args.side}: {commands}")
    procs = [subprocess.Popen(
        [str(bindir / "gunicorn"), "config.wsgi", "-b", f"127.0.0.1:{PORT}", "--workers", "2",
         "--threads", "4", "--log-level", "warning"], cwd=code, env=env, start_new_session=True)]
    for command in commands:
        procs.append(subprocess.Popen([str(bindir / command[0]), *command[1:]], cwd=code, env=env,
                                      start_new_session=True, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
    try:
        run(args, token)
    finally:
        STOP.set()
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 15)
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)


def run(args: argparse.Namespace, token: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{PORT}/healthz", timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    for behaviour in ("hang", "drip"):
        api("POST", "/api/v1/teams/vision/webhooks/", token, {"url": receiver(behaviour)})
    time.sleep(8)  # the workers and beat start; a first cycle
    polls: list[tuple[float, int, Any]] = []
    submitted: dict[str, list[int]] = {"vision": [], "nlp": [], "speech": []}
    end = time.monotonic() + args.seconds

    def poll() -> None:
        while time.monotonic() < end:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/healthz/scheduler",
                                            timeout=5) as r:
                    polls.append((time.monotonic(), r.status, json.loads(r.read())))
            except urllib.error.HTTPError as exc:
                polls.append((time.monotonic(), exc.code, json.loads(exc.read())))
            time.sleep(0.25)

    def load(team: str, gpu: str) -> None:
        n = 0
        while time.monotonic() < end:
            n += 1
            job = api("POST", "/api/v1/jobs/", token, {
                "team": team, "name": f"{team}-{n}", "image": "ghcr.io/acme/train:1",
                "command": ["python", "train.py"], "gpu_type": gpu, "gpus": 1,
                "env": {"FAIRQ_SIM_SECONDS": "4"}, "max_runtime_seconds": 600})
            submitted[team].append(job["id"])
            time.sleep(2.0)

    threads = [threading.Thread(target=poll)] + [
        threading.Thread(target=load, args=(t, g))
        for t, g in (("vision", "h100"), ("nlp", "a100"), ("speech", "a100"))]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    window = time.monotonic() - started

    cycles = {body.get("last_success_cycle") for _, _, body in polls} - {None}
    # The longest the scheduler went without a successful cycle, as the web saw it.
    gap = max((body.get("last_success_age_seconds") or 0.0 for _, _, body in polls), default=0.0)
    ok = sum(1 for _, status, _ in polls if status == 200) / max(1, len(polls))
    statuses = sorted({str(body.get("status", status)) for _, status, body in polls})
    note(f"{args.side}: /healthz/scheduler answered {statuses}")

    import psycopg

    now_sql = "now()"
    waits: list[float] = []
    queued = 0
    with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
        ids = submitted["nlp"] + submitted["speech"]
        for admitted, wait in conn.execute(
                f"SELECT admitted_at IS NOT NULL, EXTRACT(EPOCH FROM COALESCE(admitted_at, "
                f"{now_sql}) - created_at) FROM queueing_job WHERE id = ANY(%s)", (ids,)):
            waits.append(max(0.0, float(wait)))  # two clocks: a few ms apart
            queued += 0 if admitted else 1
        tries = conn.execute("SELECT count(*), COALESCE(max(duration_ms), 0) FROM "
                             "queueing_webhookattempt").fetchone()
    side = args.side
    bench(f"webhook_iso_{side}_cycles", len(cycles), "cycles")
    bench(f"webhook_iso_{side}_window", window, "s")
    bench(f"webhook_iso_{side}_cycles_per_min", len(cycles) * 60 / window, "cycles/min")
    bench(f"webhook_iso_{side}_max_cycle_gap", gap, "s")
    bench(f"webhook_iso_{side}_health_ok_share", ok, "ratio")
    bench(f"webhook_iso_{side}_other_wait_p50", statistics.median(waits), "s")
    bench(f"webhook_iso_{side}_other_wait_max", max(waits), "s")
    bench(f"webhook_iso_{side}_other_still_queued", queued, "jobs")
    bench(f"webhook_iso_{side}_other_jobs", len(waits), "jobs")
    bench(f"webhook_iso_{side}_webhook_tries", tries[0], "tries")
    bench(f"webhook_iso_{side}_webhook_try_max", tries[1] / 1000, "s")


if __name__ == "__main__":
    main()
