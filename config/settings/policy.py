"""The scheduling policy's knobs: fair share, priority, preemption, tiers, cost
(docs/scheduling.md). The policy's defaults are the product's: every FAIRQ_* here that maps
a policy knob only overrides them (queueing/policy/settings.py, pure: no Django)."""

from __future__ import annotations

from datetime import timedelta

import environ

from queueing.policy.settings import DEFAULTS as _POLICY

from .environment import env
from .scheduler import FAIRQ_CYCLE_INTERVAL_SECONDS

# Fair-share (docs/scheduling.md, rules F1-F3).
FAIRQ_DECAY_HALF_LIFE_HOURS = env.float("FAIRQ_DECAY_HALF_LIFE_HOURS",
                                        default=_POLICY.half_life_hours)
if FAIRQ_DECAY_HALF_LIFE_HOURS <= 0:
    raise environ.ImproperlyConfigured("FAIRQ_DECAY_HALF_LIFE_HOURS must be > 0")
# Rule F6: an admission counts as this many seconds of usage at once: one recompute
# interval, and standings are recomputed every scheduler cycle. Not read from the
# environment: any other value would charge an admission for time nothing recomputes.
FAIRQ_FAIRSHARE_RECOMPUTE_SECONDS = FAIRQ_CYCLE_INTERVAL_SECONDS
# Rule P1: multifactor priority weights; max age in hours caps the age factor.
FAIRQ_PRIORITY_WEIGHT_FAIRSHARE = env.float("FAIRQ_PRIORITY_WEIGHT_FAIRSHARE",
                                            default=_POLICY.priority.fair_share)
FAIRQ_PRIORITY_WEIGHT_AGE = env.float("FAIRQ_PRIORITY_WEIGHT_AGE", default=_POLICY.priority.age)
FAIRQ_PRIORITY_WEIGHT_SIZE = env.float("FAIRQ_PRIORITY_WEIGHT_SIZE", default=_POLICY.priority.size)
FAIRQ_PRIORITY_MAX_AGE_HOURS = env.float("FAIRQ_PRIORITY_MAX_AGE_HOURS",
                                         default=_POLICY.priority.max_age_seconds / 3600.0)
FAIRQ_PRIORITY_FAVOR_SMALL = env.bool("FAIRQ_PRIORITY_FAVOR_SMALL",
                                      default=_POLICY.priority.favor_small)
# Standings snapshots for charts: one row per interval, kept this many days.
FAIRQ_FAIRSHARE_SNAPSHOT_SECONDS = env.float("FAIRQ_FAIRSHARE_SNAPSHOT_SECONDS", default=900.0)
FAIRQ_FAIRSHARE_SNAPSHOT_RETENTION_DAYS = env.float(
    "FAIRQ_FAIRSHARE_SNAPSHOT_RETENTION_DAYS", default=90.0
)
for _name in ("FAIRQ_PRIORITY_WEIGHT_FAIRSHARE", "FAIRQ_PRIORITY_WEIGHT_AGE",
              "FAIRQ_PRIORITY_WEIGHT_SIZE", "FAIRQ_PRIORITY_MAX_AGE_HOURS",
              "FAIRQ_FAIRSHARE_SNAPSHOT_RETENTION_DAYS"):
    if globals()[_name] < 0:
        raise environ.ImproperlyConfigured(f"{_name} must be >= 0")
if FAIRQ_FAIRSHARE_SNAPSHOT_SECONDS <= 0:
    raise environ.ImproperlyConfigured("FAIRQ_FAIRSHARE_SNAPSHOT_SECONDS must be > 0")
# Fair-share standings of every team to every user (like Slurm's sshare); by default a
# user sees only the teams they are in, staff see all (docs/api.md, "Who sees which team").
FAIRQ_FAIRSHARE_PUBLIC = env.bool("FAIRQ_FAIRSHARE_PUBLIC", default=False)
# The tier of a job that names none.
FAIRQ_DEFAULT_TIER = env("FAIRQ_DEFAULT_TIER", default="normal")

# Preemption (docs/scheduling.md, rules R1-R9).
FAIRQ_PREEMPTION_ENABLED = env.bool("FAIRQ_PREEMPTION_ENABLED", default=_POLICY.preemption.enabled)
# Rule R5: at most this many preemptions per preemptor team per window (-1 = no limit).
FAIRQ_PREEMPTION_MAX_PER_TEAM = env.int(
    "FAIRQ_PREEMPTION_MAX_PER_TEAM",
    default=-1 if _POLICY.preemption.max_per_team is None else _POLICY.preemption.max_per_team)
FAIRQ_PREEMPTION_WINDOW_SECONDS = env.int("FAIRQ_PREEMPTION_WINDOW_SECONDS",
                                          default=int(_POLICY.preemption.window_seconds))
# Rule R8: a preemptor waits for its victims (no new victims) while the cluster lists
# their workloads, and at least this long after preempting; it is nominated this long.
FAIRQ_PREEMPTION_TERMINATION_GRACE_SECONDS = env.int(
    "FAIRQ_PREEMPTION_TERMINATION_GRACE_SECONDS",
    default=int(_POLICY.preemption.termination_grace_seconds))
FAIRQ_PREEMPTION_NOMINATION_SECONDS = env.int(
    "FAIRQ_PREEMPTION_NOMINATION_SECONDS", default=int(_POLICY.preemption.nomination_seconds))
# Victim searches per cycle: bounds the cost of a long queue of jobs that cannot fit.
FAIRQ_PREEMPTION_MAX_SEARCHES = env.int("FAIRQ_PREEMPTION_MAX_SEARCHES",
                                        default=_POLICY.preemption.max_searches)
# Rule R3: a job preempted this many times is no longer a victim (-1 = no such protection).
FAIRQ_PREEMPTION_MAX_PER_JOB = env.int(
    "FAIRQ_PREEMPTION_MAX_PER_JOB",
    default=-1 if _POLICY.preemption.max_preemptions_per_job is None
    else _POLICY.preemption.max_preemptions_per_job)
# Rule R9: a preemption's victims may lose at most this many GPU-seconds per GPU-second
# its preemptor has waited (-1 = no such check).
FAIRQ_PREEMPTION_LOST_PER_WAIT = env.float(
    "FAIRQ_PREEMPTION_LOST_PER_WAIT",
    default=-1.0 if _POLICY.preemption.lost_per_wait is None
    else _POLICY.preemption.lost_per_wait)
if FAIRQ_PREEMPTION_LOST_PER_WAIT < 0 and FAIRQ_PREEMPTION_LOST_PER_WAIT != -1:
    raise environ.ImproperlyConfigured("FAIRQ_PREEMPTION_LOST_PER_WAIT must be >= 0 or -1")
for _name in ("FAIRQ_PREEMPTION_MAX_PER_TEAM", "FAIRQ_PREEMPTION_MAX_PER_JOB"):
    if globals()[_name] < -1:
        raise environ.ImproperlyConfigured(f"{_name} must be >= -1")
for _name in ("FAIRQ_PREEMPTION_WINDOW_SECONDS", "FAIRQ_PREEMPTION_TERMINATION_GRACE_SECONDS",
              "FAIRQ_PREEMPTION_NOMINATION_SECONDS", "FAIRQ_PREEMPTION_MAX_SEARCHES"):
    if globals()[_name] < 0:
        raise environ.ImproperlyConfigured(f"{_name} must be >= 0")

# Cost and budgets (docs/scheduling.md, rules C1 and B1-B3): the currency of GpuPrice and
# TeamBudget amounts (an ISO 4217 code, shown next to every amount).
FAIRQ_CURRENCY = env.str("FAIRQ_CURRENCY", default="EUR").strip().upper()
if not (len(FAIRQ_CURRENCY) == 3 and FAIRQ_CURRENCY.isalpha() and FAIRQ_CURRENCY.isascii()):
    raise environ.ImproperlyConfigured("FAIRQ_CURRENCY must be a three-letter ISO 4217 code, e.g. EUR")

beat = {
    "fairshare-snapshot": {
        "task": "queueing.tasks.fairshare_snapshot_task",
        "schedule": timedelta(seconds=FAIRQ_FAIRSHARE_SNAPSHOT_SECONDS),
        "options": {"expires": FAIRQ_FAIRSHARE_SNAPSHOT_SECONDS},
    },
    "budgets-check": {
        "task": "queueing.tasks.budgets_check_task",
        "schedule": timedelta(minutes=5),
        "options": {"expires": 300},
    },
    "usage-days-roll-up": {
        "task": "queueing.tasks.usage_days_roll_up_task",
        "schedule": timedelta(minutes=10),
        "options": {"expires": 600},
    },
}
