"""The scheduler cycle: how often it runs, the time it allows itself, when it counts as
unhealthy (docs/deployment.md, "Settings"; docs/performance.md, "Cycle budget")."""

from __future__ import annotations

from datetime import timedelta

import environ

from queueing.policy.settings import DEFAULTS as _POLICY

from .environment import env

FAIRQ_CYCLE_INTERVAL_SECONDS = env.float("FAIRQ_CYCLE_INTERVAL_SECONDS", default=_POLICY.cycle_seconds)
if FAIRQ_CYCLE_INTERVAL_SECONDS <= 0:
    raise environ.ImproperlyConfigured("FAIRQ_CYCLE_INTERVAL_SECONDS must be > 0")
# The time a scheduler cycle allows itself, well inside its task's time limits (soft 50 s,
# hard 60 s: queueing/tasks.py): step 1 stops handling moved workloads at 40% of it, step
# 5 starts no new chunk of FAIRQ_CYCLE_SUBMIT_CHUNK creates past it, and at most
# FAIRQ_CYCLE_STOP_BATCH workloads no job holds are stopped (their logs kept first) per
# cycle; the rest is the next cycle's, kicked at once (docs/performance.md, "Cycle budget").
FAIRQ_CYCLE_BUDGET_SECONDS = env.float("FAIRQ_CYCLE_BUDGET_SECONDS", default=8.0)
if not 0 < FAIRQ_CYCLE_BUDGET_SECONDS <= 45:
    raise environ.ImproperlyConfigured(
        "FAIRQ_CYCLE_BUDGET_SECONDS must be in (0, 45] (the cycle task's soft limit is 50 s)")
# Not read from the environment: the budget above already bounds a cycle; these only cut
# its work into pieces small enough to look at the clock between them.
FAIRQ_CYCLE_STOP_BATCH = 64
FAIRQ_CYCLE_SUBMIT_CHUNK = 64
# The pages read "why is my job waiting" (rule P3) from the plan each cycle publishes; with
# none published (no cycle yet, the cache flushed) or for a job queued since, a request
# plans the queue itself only when at most this many jobs are queued, else answers
# "planning" until the next cycle (docs/scheduling.md, rule P3).
FAIRQ_QUEUE_PLAN_WEB_MAX = env.int("FAIRQ_QUEUE_PLAN_WEB_MAX", default=2000)
if FAIRQ_QUEUE_PLAN_WEB_MAX < 0:
    raise environ.ImproperlyConfigured("FAIRQ_QUEUE_PLAN_WEB_MAX must be >= 0")
# The scheduler is unhealthy (GET /healthz/scheduler answers 503) when its last successful
# cycle is older than this many cycle intervals (60 s at the default 3 s).
FAIRQ_SCHEDULER_STALE_CYCLES = env.float("FAIRQ_SCHEDULER_STALE_CYCLES", default=20.0)
if FAIRQ_SCHEDULER_STALE_CYCLES < 2:
    raise environ.ImproperlyConfigured("FAIRQ_SCHEDULER_STALE_CYCLES must be >= 2")
# ... and "behind" (also 503) when its last successful cycle, or a gap between two
# successful cycles within that stale window, is longer than this many intervals (15 s at
# the default 3 s): cycles that still succeed, but now and then instead of every interval
# (a worker busy with other work).
FAIRQ_SCHEDULER_BEHIND_CYCLES = env.float("FAIRQ_SCHEDULER_BEHIND_CYCLES", default=5.0)
if not 2 <= FAIRQ_SCHEDULER_BEHIND_CYCLES <= FAIRQ_SCHEDULER_STALE_CYCLES:
    raise environ.ImproperlyConfigured(
        "FAIRQ_SCHEDULER_BEHIND_CYCLES must be >= 2 and <= FAIRQ_SCHEDULER_STALE_CYCLES")
# The worker and beat touch a heartbeat file per scheduler tick (queueing/health.py); their
# liveness probes (`manage.py heartbeat_check`) read it. Empty: the system's temp dir.
FAIRQ_HEARTBEAT_DIR = env("FAIRQ_HEARTBEAT_DIR", default="")
# Kick a scheduler cycle after a submit or a finish (debounced through the cache). Not read
# from the environment: off, a submit waits for the next tick; only the tests turn it off
# (config/settings/test.py).
FAIRQ_KICK_SCHEDULER = True

beat = {
    "scheduler-cycle": {
        "task": "queueing.tasks.scheduler_cycle_task",
        "schedule": timedelta(seconds=FAIRQ_CYCLE_INTERVAL_SECONDS),
        # A late tick is worthless: the next one is seconds away.
        "options": {"expires": FAIRQ_CYCLE_INTERVAL_SECONDS * 2},
    },
}
