"""What every benchmark shares: the `BENCH <name> <value> <unit>` line, notes on stderr,
and a throw-away PostgreSQL database. Benchmarks run as scripts (`python bench/x.py`),
so this module is imported as `_common` from the bench/ folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse


def bench(name: str, value: float, unit: str) -> None:
    """One figure, in the form `make bench` output is compared by."""
    print(f"BENCH {name} {value:.6g} {unit}", flush=True)


def note(msg: str) -> None:
    print(f"# {msg}", file=sys.stderr, flush=True)


def setup_django_sqlite(name: str) -> None:
    """Django on a fresh SQLite file /tmp/<name>.sqlite3 (unless DATABASE_URL is set),
    test settings, migrated."""
    import os
    from pathlib import Path

    if not os.environ.get("DATABASE_URL"):
        path = Path(f"/tmp/{name}.sqlite3")
        path.unlink(missing_ok=True)
        os.environ["DATABASE_URL"] = f"sqlite:///{path}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def recreate_postgres(url: str) -> bool:
    """Drop and create the database named in `url`; False (with a note) when PostgreSQL
    cannot be reached, so the caller can fall back to SQLite."""
    try:
        import psycopg
    except ImportError:
        return False
    u = urlparse(url)
    try:
        with psycopg.connect(u._replace(path="/postgres").geturl(), autocommit=True,
                             connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{u.path.lstrip("/")}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{u.path.lstrip("/")}"')
        return True
    except Exception as exc:
        note(f"PostgreSQL not reachable ({exc}); using SQLite")
        return False


def drop_postgres(url: str) -> None:
    """Drop the database named in `url` (after closing Django's connections to it)."""
    import psycopg
    from django.db import connections

    connections.close_all()
    u = urlparse(url)
    with psycopg.connect(u._replace(path="/postgres").geturl(), autocommit=True,
                         connect_timeout=5) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{u.path.lstrip("/")}" WITH (FORCE)')


AUTOGROUP = Path("/proc/sys/kernel/sched_autogroup_enabled")


def start_load(count: int) -> list[subprocess.Popen[bytes]]:
    """`count` busy loops: other work on the cores, beside both sides of a comparison.

    Each loop runs in a session of its own, as other work on a machine does (another
    service, another user's job). With the kernel's autogroup (sched_autogroup_enabled,
    on by default on this machine), the CPU is shared between sessions first: loops
    started in the bench's own session would share the clients' part of the CPU and slow
    the clients, not the servers, which is not what a loaded machine is. Measured (issue
    20, 8 clients): with the loops in the bench's session, the slowest 1% of fairq's
    submits spent 40-70 ms between gunicorn sending the answer and the client reading
    it; in a session of their own, about 1 ms. Says which sharing the kernel does."""
    if count <= 0:
        return []
    try:
        grouped = AUTOGROUP.read_text().strip() == "1"
        note(f"load: {count} busy loops, each in its own session; the kernel shares CPU "
             f"{'per session (autogroup on)' if grouped else 'per task (autogroup off)'}")
    except OSError:
        note(f"load: {count} busy loops, each in its own session")
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                             start_new_session=True) for _ in range(count)]
