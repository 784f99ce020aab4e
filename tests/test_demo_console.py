"""`make demo`'s console keeps its banner: `rundemo` run for real (its own process, the demo
settings, SQLite in a temporary directory) prints the URL, the logins, the token and the
log file's name, then only warnings and errors; the worker's and beat's INFO lines and
the web server's request lines go to the log file (config/settings/demo.py)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _demo_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("REDIS_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(DJANGO_SETTINGS_MODULE="config.settings.demo", PYTHONPATH=str(ROOT),
               DATABASE_URL=f"sqlite:///{tmp / 'db.sqlite3'}",
               FAIRQ_DEMO_LOG=str(tmp / "demo.log"), FAIRQ_LOG_LEVEL="INFO",
               PYTHONUNBUFFERED="1")
    return env


def test_the_demo_console_holds_the_banner_and_no_info_lines_or_startup_warnings(
        tmp_path: Path) -> None:
    env = _demo_env(tmp_path)
    manage = [sys.executable, str(ROOT / "manage.py")]
    for step in (["migrate", "--noinput", "-v0"], ["seed_demo"]):
        subprocess.run([*manage, *step], env=env, cwd=tmp_path, check=True,
                       capture_output=True, timeout=180)
    log, console = tmp_path / "demo.log", tmp_path / "console.txt"
    port = _free_port()
    with console.open("w") as sink:
        demo = subprocess.Popen([*manage, "rundemo", "--port", str(port)], env=env,
                                cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT)
    try:
        # Running until the worker has run scheduler cycles (their INFO lines, wherever
        # they go), with a request to the web server (its request line too).
        deadline = time.monotonic() + 90
        asked = False
        while time.monotonic() < deadline and demo.poll() is None:
            text = console.read_text() + (log.read_text() if log.exists() else "")
            if not asked and "fairq demo is up" in text:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz",
                                            timeout=10) as r:
                    asked = r.status == 200
            if asked and text.count("scheduler_cycle_task") >= 4:
                break
            time.sleep(0.5)
    finally:
        demo.send_signal(signal.SIGTERM)
        try:
            demo.wait(timeout=30)
        except subprocess.TimeoutExpired:
            demo.kill()
            demo.wait()
    out = console.read_text()
    logged = log.read_text() if log.exists() else ""
    assert logged.count("scheduler_cycle_task") >= 4, (out, logged[-2000:])
    assert re.search(r" INFO celery\.apps\.worker celery@\S+ ready\.", logged)
    assert asked and '"GET /healthz HTTP/1.1" 200' in logged
    # The banner, whole, and the log file it names.
    assert "fairq demo is up: http://127.0.0.1:" in out
    assert "logins (password 'fairq-demo'): admin (staff), alice" in out
    assert re.search(r"API token for alice \(team vision\): fq_\w+", out)
    assert "log: demo.log (this console shows warnings and errors only)" in out
    # Nothing else but Celery's one line at shutdown: no INFO line, no Celery banner, no
    # kombu or root warning.
    assert " INFO " not in out and "GET /" not in out, out
    assert "[tasks]" not in out and "celery@" not in out
    assert "No hostname was supplied" not in out + logged
    assert "superuser privileges" not in out
    rest = out.split("(this console shows warnings and errors only)", 1)[1]
    assert [line for line in rest.splitlines() if line.strip()] in (
        [], ["worker: Warm shutdown (MainProcess)"]), rest


def test_the_demo_log_rotates_rather_than_filling_the_disk(tmp_path: Path) -> None:
    """The demo's file handler, as its settings configure it, keeps at most 10 MB and two
    old files: 25 MB written through the `fairq` logger leave three files under 31 MB."""
    code = (
        "import logging, logging.config\n"
        "from django.conf import settings\n"
        "import django; django.setup()\n"
        "log = logging.getLogger('fairq.demo.rotation')\n"
        "line = 'x' * 1000\n"
        "for _ in range(25_000): log.warning(line)\n"
    )
    env = _demo_env(tmp_path)
    subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, check=True,
                   capture_output=True, timeout=180)
    files = sorted(p.name for p in tmp_path.glob("demo.log*"))
    assert files == ["demo.log", "demo.log.1", "demo.log.2"]
    sizes = [(tmp_path / f).stat().st_size for f in files]
    assert max(sizes) <= 10 * 1024 * 1024
    assert sum(sizes) < 31 * 1024 * 1024
