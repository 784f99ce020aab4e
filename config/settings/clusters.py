"""Which cluster fairq runs jobs on, the simulated one, the cluster view the web reads,
and GPU utilization from Prometheus (docs/clusters.md, docs/simulator.md)."""

from __future__ import annotations

import environ

from .environment import env

# The cluster backend: "simulated" (in-process, the default) or "kubernetes".
FAIRQ_CLUSTER_BACKEND = env("FAIRQ_CLUSTER_BACKEND", default="simulated")
if FAIRQ_CLUSTER_BACKEND not in {"simulated", "kubernetes"}:
    raise environ.ImproperlyConfigured(
        f"FAIRQ_CLUSTER_BACKEND must be 'simulated' or 'kubernetes', not {FAIRQ_CLUSTER_BACKEND!r}"
    )
# Rule K5 (docs/clusters.md): how long a cluster fairq cannot read keeps its running jobs
# (they hold their quota and are charged) before they are requeued elsewhere.
FAIRQ_CLUSTER_UNREACHABLE_GRACE_SECONDS = env.int("FAIRQ_CLUSTER_UNREACHABLE_GRACE_SECONDS",
                                                  default=600)
if FAIRQ_CLUSTER_UNREACHABLE_GRACE_SECONDS < 0:
    raise environ.ImproperlyConfigured("FAIRQ_CLUSTER_UNREACHABLE_GRACE_SECONDS must be >= 0")
# The cluster view (nodes, free GPUs, live workloads) the worker publishes each cycle for
# the web; older than this, pages say it is stale (is the worker running?).
FAIRQ_CLUSTER_VIEW_STALE_SECONDS = env.float("FAIRQ_CLUSTER_VIEW_STALE_SECONDS", default=120.0)

# The simulated cluster: node pools as "count x gpus x gpu_type" separated by commas.
FAIRQ_SIM_NODES = env("FAIRQ_SIM_NODES", default="4x8xh100,4x8xa100,2x7xmig-1g-10gb")
FAIRQ_SIM_DEFAULT_SECONDS = env.float("FAIRQ_SIM_DEFAULT_SECONDS", default=60.0)
if FAIRQ_SIM_DEFAULT_SECONDS < 0:
    raise environ.ImproperlyConfigured("FAIRQ_SIM_DEFAULT_SECONDS must be >= 0")
# How long a stopped simulated job's program takes to save and exit after its stop
# signal (at most its grace): it keeps its GPUs meanwhile, as a terminating pod does.
FAIRQ_SIM_STOP_SECONDS = env.float("FAIRQ_SIM_STOP_SECONDS", default=5.0)
if FAIRQ_SIM_STOP_SECONDS < 0:
    raise environ.ImproperlyConfigured("FAIRQ_SIM_STOP_SECONDS must be >= 0")


def _check_sim_nodes(spec: str) -> None:
    """Parse FAIRQ_SIM_NODES at start-up, not at the first cycle."""
    from queueing.backends.simulated import SimulatedClusterError, parse_node_spec

    try:
        parse_node_spec(spec)
    except SimulatedClusterError as exc:
        raise environ.ImproperlyConfigured(str(exc)) from exc


_check_sim_nodes(FAIRQ_SIM_NODES)

# Synthetic jobs so the standings move: the demo's (config/settings/demo.py reads
# FAIRQ_DEMO_LOAD from the environment); never anywhere else.
FAIRQ_DEMO_LOAD = False

# GPU utilization and idle GPUs (docs/scheduling.md, "Idle GPUs", rules U1-U5): read once a
# cycle from Prometheus (dcgm-exporter's metrics) at FAIRQ_PROMETHEUS_URL; unset: from the
# simulated cluster when that is the backend, else off. Per-minute samples are kept
# FAIRQ_UTIL_RETENTION_DAYS, then deleted, archived first only with FAIRQ_UTIL_ARCHIVE
# (the per-attempt summaries go with their job).
FAIRQ_PROMETHEUS_URL = env("FAIRQ_PROMETHEUS_URL", default="")
FAIRQ_PROMETHEUS_TIMEOUT_SECONDS = env.float("FAIRQ_PROMETHEUS_TIMEOUT_SECONDS", default=5.0)
FAIRQ_UTIL_RETENTION_DAYS = env.float("FAIRQ_UTIL_RETENTION_DAYS", default=30.0)
# Off (the default): old samples are deleted as they always were - they need no
# storage, and archiving them costs about 25 times the delete (docs/performance.md,
# "history retention"). On: written to the history archive first, as finished jobs
# and usage records are (FAIRQ_HISTORY_STORAGE_*, which must then be writable).
FAIRQ_UTIL_ARCHIVE = env.bool("FAIRQ_UTIL_ARCHIVE", default=False)
if FAIRQ_PROMETHEUS_URL:
    from queueing.backends.prometheus import parse_prometheus_url

    try:
        parse_prometheus_url(FAIRQ_PROMETHEUS_URL)
    except ValueError as _exc:
        raise environ.ImproperlyConfigured(str(_exc)) from _exc
if not 0 < FAIRQ_PROMETHEUS_TIMEOUT_SECONDS <= 60 or FAIRQ_UTIL_RETENTION_DAYS <= 0:
    raise environ.ImproperlyConfigured(
        "FAIRQ_PROMETHEUS_TIMEOUT_SECONDS must be in (0, 60] and FAIRQ_UTIL_RETENTION_DAYS > 0")

# The samples older than FAIRQ_UTIL_RETENTION_DAYS are deleted (archived first with
# FAIRQ_UTIL_ARCHIVE) by the
# hourly `history-prune` task (config/settings/history.py).
beat: dict[str, dict[str, object]] = {}
