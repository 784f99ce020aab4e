"""Interactive notebook sessions (docs/sessions.md): the pod, the tier, the per-user
limits and the idle culling (rules N1-N4 in docs/scheduling.md)."""

from __future__ import annotations

from datetime import timedelta

import environ

from .environment import env

# The image of a session's pod: a Jupyter Docker Stacks image runs `jupyter lab` as
# user jovyan with /home/jovyan as home. A user may ask another (the registry allowlist
# of the team still applies).
FAIRQ_NOTEBOOK_IMAGE = env("FAIRQ_NOTEBOOK_IMAGE", default="quay.io/jupyter/pytorch-notebook:latest")
# The port the server listens on in the pod, and where the notebook files are when the
# session mounts no PVC (the first PVC's mount path otherwise).
FAIRQ_NOTEBOOK_PORT = env.int("FAIRQ_NOTEBOOK_PORT", default=8888)
FAIRQ_NOTEBOOK_ROOT_DIR = env("FAIRQ_NOTEBOOK_ROOT_DIR", default="/home/jovyan/work")
if not 1 <= FAIRQ_NOTEBOOK_PORT <= 65535:
    raise environ.ImproperlyConfigured("FAIRQ_NOTEBOOK_PORT must be a TCP port (1-65535)")
if not FAIRQ_NOTEBOOK_ROOT_DIR.startswith("/"):
    raise environ.ImproperlyConfigured("FAIRQ_NOTEBOOK_ROOT_DIR must be an absolute path")
# The tier sessions run in: created at the first start when absent (not preemptible,
# open to every team, the rank below unless taken).
FAIRQ_SESSION_TIER = env("FAIRQ_SESSION_TIER", default="interactive")
FAIRQ_SESSION_TIER_RANK = env.int("FAIRQ_SESSION_TIER_RANK", default=150)
# Per user, at start: live sessions (not final) and their GPUs together (a fraction
# counts its share: two 0.25 sessions are 0.5).
FAIRQ_SESSION_MAX_PER_USER = env.int("FAIRQ_SESSION_MAX_PER_USER", default=2)
FAIRQ_SESSION_MAX_GPUS_PER_USER = env.float("FAIRQ_SESSION_MAX_GPUS_PER_USER", default=1.0)
# A session's defaults and bounds: idle minutes before it is stopped (rule N3), the
# warning's lead (rule N2), its time limit (the job's max_runtime_seconds).
FAIRQ_SESSION_IDLE_MINUTES = env.int("FAIRQ_SESSION_IDLE_MINUTES", default=60)
FAIRQ_SESSION_WARN_MINUTES = env.int("FAIRQ_SESSION_WARN_MINUTES", default=10)
FAIRQ_SESSION_DEFAULT_HOURS = env.float("FAIRQ_SESSION_DEFAULT_HOURS", default=8.0)
FAIRQ_SESSION_MAX_HOURS = env.float("FAIRQ_SESSION_MAX_HOURS", default=24.0)
# How long the culling check waits for a server's API (rule N1: no answer is no verdict).
FAIRQ_SESSION_CHECK_TIMEOUT_SECONDS = env.float("FAIRQ_SESSION_CHECK_TIMEOUT_SECONDS",
                                                default=5.0)
# The simulated cluster (the demo) starts a real local `jupyter lab` per session when
# JupyterLab is installed, its files under this directory (per team and PVC name).
FAIRQ_SIM_NOTEBOOKS = env.bool("FAIRQ_SIM_NOTEBOOKS", default=True)
FAIRQ_SIM_NOTEBOOK_DIR = env("FAIRQ_SIM_NOTEBOOK_DIR", default="/tmp/fairq-notebooks")
for _name, _value in (("FAIRQ_SESSION_MAX_PER_USER", FAIRQ_SESSION_MAX_PER_USER),
                      ("FAIRQ_SESSION_IDLE_MINUTES", FAIRQ_SESSION_IDLE_MINUTES),
                      ("FAIRQ_SESSION_MAX_GPUS_PER_USER", FAIRQ_SESSION_MAX_GPUS_PER_USER),
                      ("FAIRQ_SESSION_DEFAULT_HOURS", FAIRQ_SESSION_DEFAULT_HOURS),
                      ("FAIRQ_SESSION_CHECK_TIMEOUT_SECONDS",
                       FAIRQ_SESSION_CHECK_TIMEOUT_SECONDS)):
    if _value <= 0:
        raise environ.ImproperlyConfigured(f"{_name} must be > 0")
if FAIRQ_SESSION_WARN_MINUTES < 0 or FAIRQ_SESSION_WARN_MINUTES >= FAIRQ_SESSION_IDLE_MINUTES:
    raise environ.ImproperlyConfigured(
        "FAIRQ_SESSION_WARN_MINUTES must be >= 0 and below FAIRQ_SESSION_IDLE_MINUTES")
if FAIRQ_SESSION_MAX_HOURS < FAIRQ_SESSION_DEFAULT_HOURS:
    raise environ.ImproperlyConfigured(
        "FAIRQ_SESSION_MAX_HOURS must be at least FAIRQ_SESSION_DEFAULT_HOURS")

beat = {
    # Rules N1-N4: read every running session's server and GPUs, warn, stop.
    "sessions-check": {
        "task": "queueing.tasks.sessions_check_task",
        "schedule": timedelta(minutes=1),
        "options": {"expires": 60},
    },
}
