"""Health of fairq's processes, for Kubernetes probes (docs/deployment.md, "Health").

- `readiness()`: can this process serve? PostgreSQL answers a query and the Redis cache
  answers a round trip. The web's `GET /readyz`.
- Heartbeats: a process that runs or sends scheduler ticks touches a file per role
  (`heartbeat_touch`); `heartbeat_age` says how long ago. The worker's and beat's liveness
  probes (`manage.py heartbeat_check worker|beat`) fail when it is older than
  `heartbeat_stale_after_seconds()`. A file, not the shared cache: each pod must prove
  that *it* is alive, and a pod's /tmp is its own.
- `pending_migrations()`: the migrations not applied yet (`manage.py wait_for_migrations`).
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Literal

from django.conf import settings
from django.core.cache import cache
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor

Role = Literal["worker", "beat"]
ROLES: tuple[Role, ...] = ("worker", "beat")


def readiness() -> dict[str, Any]:
    """{"ready": bool, "checks": {"database": "ok"|error, "cache": "ok"|error}}. Never
    raises: a failing dependency is reported by its exception's type and message."""
    checks: dict[str, str] = {}
    try:
        with connections[DEFAULT_DB_ALIAS].cursor() as cur:
            cur.execute("SELECT 1")
            cur.fetchone()
        checks["database"] = "ok"
    except Exception as exc:  # reported, not raised: the probe's answer is the point
        checks["database"] = f"{type(exc).__name__}: {exc}"
    try:
        # A round trip with a value of our own: a cache that drops writes is not ready.
        key, value = "fairq:health:readyz", uuid.uuid4().hex
        cache.set(key, value, timeout=30)
        got = cache.get(key)
        checks["cache"] = "ok" if got == value else "the cache did not return the value set"
    except Exception as exc:
        checks["cache"] = f"{type(exc).__name__}: {exc}"
    return {"ready": all(v == "ok" for v in checks.values()), "checks": checks}


def heartbeat_path(role: Role) -> Path:
    directory = settings.FAIRQ_HEARTBEAT_DIR or tempfile.gettempdir()
    return Path(directory) / f"fairq-{role}.heartbeat"


def heartbeat_touch(role: Role, *, now: float | None = None) -> None:
    """Mark `role` alive in this pod at `now` (default: the current time)."""
    path = heartbeat_path(role)
    path.touch(exist_ok=True)
    when = time.time() if now is None else now
    os.utime(path, (when, when))


def heartbeat_age(role: Role, *, now: float | None = None) -> float | None:
    """Seconds since `role` last touched its heartbeat in this pod, None if never."""
    try:
        mtime = heartbeat_path(role).stat().st_mtime
    except FileNotFoundError:
        return None
    return max(0.0, (time.time() if now is None else now) - mtime)


def heartbeat_stale_after_seconds() -> float:
    """FAIRQ_SCHEDULER_STALE_CYCLES cycle intervals, as for GET /healthz/scheduler."""
    return float(settings.FAIRQ_SCHEDULER_STALE_CYCLES * settings.FAIRQ_CYCLE_INTERVAL_SECONDS)


def pending_migrations(database: str = DEFAULT_DB_ALIAS) -> list[str]:
    """The migrations of the installed apps not applied to `database`, "app.name" each,
    in the order `migrate` would apply them. Raises when the database cannot be reached."""
    connection = connections[database]
    connection.prepare_database()
    executor = MigrationExecutor(connection)
    targets = executor.loader.graph.leaf_nodes()
    return [f"{m.app_label}.{m.name}" for m, _ in executor.migration_plan(targets)]
