"""Job lifecycle: submit, cancel and the one place a job's state changes (rule S1)."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from fractions import Fraction
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import ForeignKey, JSONField
from django.utils import timezone

from accounts.models import TEAM_RESOURCE_FIELDS, Team
from queueing import rawsql
from queueing import validation as v
from queueing.composition import kick, stop_workload_soon
from queueing.errors import DomainError, IdempotencyKeyReused, InvalidTransition
from queueing.models import Cluster, GpuType, Job, JobArray, JobEvent, Tier, WebhookEndpoint
from queueing.policy.arrays import index_runs, run_indices
from queueing.policy.states import (
    HOLDING_STATES,
    IllegalTransition,
    JobState,
    check_transition,
)
from queueing.sanitize import clean_fields, clean_json, clean_text
from queueing.selectors.budgets import budget_downgrade_tier
from queueing.selectors.cluster import largest_node_cpu_memory, largest_node_gpus
from queueing.selectors.lookups import gpu_types_by_slug, team_for_submitter, tiers_by_slug
from queueing.selectors.queue_plan import queue_plan_forget
from queueing.validation import spec_size

from .access import (
    check_job_access,
    check_job_cancel,
    check_submit,
    submit_allowed_sql,
    unknown_team_message,
)
from .usage import usage_record_attempt
from .webhooks import notify_url_problem, webhooks_event_written, webhooks_events_written

_EVENT_REASON_MAX = JobEvent._meta.get_field("reason").max_length
_ACTOR_LABEL_MAX = JobEvent._meta.get_field("actor_label").max_length


def next_attempt(attempt: int) -> dict[str, Any]:
    """The fields of a job handed back to the queue as attempt `attempt` (rules R6, U3,
    K5, K6 and a vanished or name-held workload): its submit time kept, placed nowhere -
    no nodes, no cluster, not on spot, not admitted, started or created on a cluster.
    `job_transition(job, JobState.QUEUED, ..., **next_attempt(job.attempt + 1))`: one
    list, so a field added for where an attempt runs is cleared by every requeue."""
    return {"attempt": attempt, "placement": [], "gpu_slots": [], "cluster": None,
            "on_spot": False, "spot_pools": {},
            "admitted_at": None, "started_at": None, "submitted_to_backend_at": None,
            "checkpointed_at": None}


def job_transition(
    job: Job,
    target: JobState,
    *,
    now: datetime,
    actor: Any = None,
    actor_label: str = "",
    reason: str = "",
    data: dict[str, Any] | None = None,
    **fields: Any,
) -> bool:
    """Move `job` to `target` with a compare-and-swap on its current state and attempt,
    writing the event in the same transaction. Must run inside `transaction.atomic`.

    Raises IllegalTransition (nothing changed) when rule S1 forbids the move. Returns
    False (nothing changed) when another worker moved the job first. Every value saved
    (fields, reason, data) first goes through `queueing.sanitize`: text from a cluster
    or an exception never fails the UPDATE (NUL, over-long, out-of-range integers).
    """
    source = job.state
    check_transition(source, target)
    fields.setdefault("updated_at", now)
    fields = clean_fields(Job, fields)
    won = Job.objects.filter(pk=job.pk, status=source, attempt=job.attempt).update(
        status=target, **fields
    )
    if won != 1:
        return False
    for name, value in fields.items():
        setattr(job, name, value)
    event_attempt = job.attempt
    job.status = target
    event = JobEvent.objects.create(
        job=job, at=now, kind=JobEvent.Kind.TRANSITION, from_status=source, to_status=target,
        actor=actor if actor is not None and getattr(actor, "is_authenticated", False) else None,
        actor_label=clean_text(actor_label or (str(actor) if actor is not None else "scheduler"),
                               max_length=_ACTOR_LABEL_MAX),
        reason=clean_text(reason, max_length=_EVENT_REASON_MAX),
        attempt=event_attempt, data=clean_json(data) if data else {},
    )
    webhooks_event_written(event.pk)  # sent after commit (docs/webhooks.md)
    return True


# `jobs_admit_batch`'s statement: the rows' compare-and-swap (status QUEUED and the
# attempt read, per row, as `job_transition`'s) and the winners' events, one round trip.
# `gpu_type_id` NULL keeps the row's (a job of one GPU type).
_ADMIT_SQL = """
WITH u AS (
    SELECT * FROM unnest(%(id)s::bigint[], %(attempt)s::bigint[], %(placement)s::text[],
                         %(cluster_id)s::bigint[], %(on_spot)s::boolean[],
                         %(spot_pools)s::text[], %(gpu_slots)s::text[],
                         %(gpu_type_id)s::bigint[], %(reason)s::text[], %(data)s::text[],
                         %(ord)s::integer[])
        AS u(id, attempt, placement, cluster_id, on_spot, spot_pools, gpu_slots,
             gpu_type_id, reason, data, ord)
), won AS (
    UPDATE queueing_job j
    SET status = %(to)s, updated_at = %(now)s, admitted_at = %(admitted_at)s,
        placement = u.placement::jsonb, cluster_id = u.cluster_id, on_spot = u.on_spot,
        spot_pools = u.spot_pools::jsonb, gpu_slots = u.gpu_slots::jsonb,
        gpu_type_id = COALESCE(u.gpu_type_id, j.gpu_type_id)
    FROM u
    WHERE j.id = u.id AND j.status = %(from)s AND j.attempt = u.attempt
    RETURNING j.id
)
INSERT INTO queueing_jobevent (job_id, at, kind, from_status, to_status, actor_id,
                               actor_label, reason, attempt, data)
SELECT u.id, %(now)s, %(kind)s, %(from)s, %(to)s, NULL, %(actor)s, u.reason, u.attempt,
       u.data::jsonb
FROM u JOIN won ON won.id = u.id
ORDER BY u.ord
RETURNING job_id, id
"""
# What an admission writes on the row besides its status (`jobs_admit_batch`).
ADMIT_FIELDS = frozenset({"admitted_at", "placement", "cluster_id", "on_spot", "spot_pools",
                          "gpu_slots", "gpu_type_id"})


def jobs_admit_batch(
    changes: Sequence[tuple[Job, str, dict[str, Any] | None, dict[str, Any]]], *,
    now: datetime,
) -> set[int]:
    """QUEUED → ADMITTED for many jobs at once (PostgreSQL; the scheduler's step 4):
    per (job, reason, data, fields) what `job_transition(job, ADMITTED, now=now,
    reason=reason, data=data, **fields)` writes - the same row values, cleaned the same
    way, the same event by the scheduler, its webhook message after commit - in one
    statement, the compare-and-swap (rule S1) per row: a row whose status or attempt is
    no longer the one read (cancelled or requeued meanwhile) is not written and gets no
    event. `fields`: `admitted_at` (the same for all), `placement`, `cluster_id`,
    `on_spot`, `spot_pools`, `gpu_slots`, and `gpu_type_id` or not. Returns the ids
    admitted. Must run inside `transaction.atomic`; a job listed twice is written once."""
    if not changes:
        return set()
    cols: dict[str, list[Any]] = {k: [] for k in (
        "id", "attempt", "placement", "cluster_id", "on_spot", "spot_pools", "gpu_slots",
        "gpu_type_id", "reason", "data", "ord")}
    admitted_at: set[Any] = set()
    seen: set[int] = set()
    for i, (job, reason, data, fields) in enumerate(changes):
        if job.pk in seen:
            continue
        seen.add(job.pk)
        check_transition(job.state, JobState.ADMITTED)
        if not set(fields) <= ADMIT_FIELDS:
            raise ValueError(f"jobs_admit_batch writes {sorted(ADMIT_FIELDS)}, not "
                             f"{sorted(set(fields) - ADMIT_FIELDS)}")
        f = clean_fields(Job, fields)
        admitted_at.add(f["admitted_at"])
        cols["id"].append(job.pk)
        cols["attempt"].append(job.attempt)
        for name in ("placement", "spot_pools", "gpu_slots"):
            cols[name].append(json.dumps(f[name]))
        cols["cluster_id"].append(f["cluster_id"])
        cols["on_spot"].append(bool(f["on_spot"]))
        cols["gpu_type_id"].append(f.get("gpu_type_id"))
        cols["reason"].append(clean_text(reason, max_length=_EVENT_REASON_MAX))
        cols["data"].append(json.dumps(clean_json(data) if data else {}))
        cols["ord"].append(i)
    if len(admitted_at) != 1:
        raise ValueError("jobs_admit_batch: one admitted_at for all the jobs")
    with connection.cursor() as cur:
        cur.execute(_ADMIT_SQL, {**cols, "now": now, "admitted_at": admitted_at.pop(),
                                 "from": JobState.QUEUED.value, "to": JobState.ADMITTED.value,
                                 "kind": JobEvent.Kind.TRANSITION.value,
                                 "actor": "scheduler"})
        rows = cur.fetchall()
    webhooks_events_written([event_id for _, event_id in rows])  # sent after commit
    return {job_id for job_id, _ in rows}


# `jobs_transition_batch`'s columns besides the status: each column's array type and
# what the row gets from it (`gpu_slots` NULL keeps the row's).
_BATCH_COLUMNS: dict[str, tuple[str, str]] = {
    "started_at": ("timestamptz", "u.started_at"),
    "placement": ("text", "u.placement::jsonb"),
    "gpu_slots": ("text", "COALESCE(u.gpu_slots::jsonb, j.gpu_slots)"),
    "finished_at": ("timestamptz", "u.finished_at"),
    "exit_code": ("integer", "u.exit_code"),
    "message": ("text", "u.message"),
}
_BATCH_JSON = frozenset({"placement", "gpu_slots"})


def _transition_batch_sql(columns: Sequence[str]) -> str:
    """The statement of `jobs_transition_batch` writing `columns`: the rows'
    compare-and-swap (the status and the attempt read, per row, as `job_transition`'s)
    and the winners' events, one round trip."""
    arrays = "".join(f", %({c})s::{_BATCH_COLUMNS[c][0]}[]" for c in columns)
    names = "".join(f", {c}" for c in columns)
    sets = "".join(f", {c} = {_BATCH_COLUMNS[c][1]}" for c in columns)
    return f"""
WITH u AS (
    SELECT * FROM unnest(%(id)s::bigint[], %(attempt)s::bigint[], %(from)s::text[],
                         %(to)s::text[], %(reason)s::text[], %(ord)s::integer[]{arrays})
        AS u(id, attempt, from_status, to_status, reason, ord{names})
), won AS (
    UPDATE queueing_job j
    SET status = u.to_status, updated_at = %(now)s{sets}
    FROM u
    WHERE j.id = u.id AND j.status = u.from_status AND j.attempt = u.attempt
    RETURNING j.id
)
INSERT INTO queueing_jobevent (job_id, at, kind, from_status, to_status, actor_id,
                               actor_label, reason, attempt, data)
SELECT u.id, %(now)s, %(kind)s, u.from_status, u.to_status, NULL, %(actor)s, u.reason,
       u.attempt, '{{}}'::jsonb
FROM u JOIN won ON won.id = u.id
ORDER BY u.ord
RETURNING job_id, id
"""


def jobs_transition_batch(
    changes: Sequence[tuple[Job, JobState, str, dict[str, Any]]], *, now: datetime,
) -> set[int]:
    """Many jobs' transitions at once (PostgreSQL; the scheduler's step 1): per (job,
    target, reason, fields) what `job_transition(job, target, now=now, reason=reason,
    **fields)` writes - the same row values, cleaned the same way, the same event by
    the scheduler (no data), its webhook message after commit - in one statement, the
    compare-and-swap (rule S1) per row: a row whose status or attempt is no longer the
    one read (cancelled, preempted or requeued meanwhile) is not written and gets no
    event. Every change writes the same `fields`, among `started_at`, `placement`,
    `gpu_slots` (None: the row's kept), `finished_at`, `exit_code` and `message`.
    Returns the ids moved; the `Job` objects are left as they were read (the caller
    sets what it needs once the transaction holds). Must run inside
    `transaction.atomic`; a job listed twice is written once."""
    if not changes:
        return set()
    columns = sorted(changes[0][3])
    if not set(columns) <= set(_BATCH_COLUMNS):
        raise ValueError(f"jobs_transition_batch writes {sorted(_BATCH_COLUMNS)}, not "
                         f"{sorted(set(columns) - set(_BATCH_COLUMNS))}")
    cols: dict[str, list[Any]] = {k: [] for k in (
        "id", "attempt", "from", "to", "reason", "ord", *columns)}
    seen: set[int] = set()
    for i, (job, target, reason, fields) in enumerate(changes):
        if job.pk in seen:
            continue
        seen.add(job.pk)
        check_transition(job.state, target)
        if sorted(fields) != columns:
            raise ValueError("jobs_transition_batch: the same fields for every job")
        f = clean_fields(Job, fields)
        cols["id"].append(job.pk)
        cols["attempt"].append(job.attempt)
        cols["from"].append(job.state.value)
        cols["to"].append(JobState(target).value)
        cols["reason"].append(clean_text(reason, max_length=_EVENT_REASON_MAX))
        cols["ord"].append(i)
        for name in columns:
            value = f[name]
            cols[name].append(json.dumps(value) if name in _BATCH_JSON and value is not None
                              else value)
    with connection.cursor() as cur:
        cur.execute(_transition_batch_sql(columns), {
            **cols, "now": now, "kind": JobEvent.Kind.TRANSITION.value, "actor": "scheduler"})
        rows = cur.fetchall()
    webhooks_events_written([event_id for _, event_id in rows])  # sent after commit
    return {job_id for job_id, _ in rows}


@dataclass(frozen=True)
class JobInput:
    """A job as submitted, its references resolved: the fields it sets on `Job`."""

    team: Team
    name: str
    image: str
    command: list[str]
    args: list[str]
    env: dict[str, str]
    gpu_type: GpuType
    gpus_per_replica: int
    replicas: int
    tier: Tier
    max_runtime_seconds: int | None
    # Shared GPUs: k slices of one GPU of a time-sliced or MPS type per replica (a
    # fraction, gpus_per_replica 1); 0 = whole devices (`validation.gpus_on_type`).
    gpu_slices: int = 0
    # Every GPU type it accepts, by slug, most preferred first (the first is `gpu_type`);
    # [] = only `gpu_type` (one type given alone or as a list of one is stored so).
    gpu_types: list[str] = dataclasses.field(default_factory=list)
    # Per replica, as written (validated, the team's defaults filled in): {"cpu": "4",
    # "memory": "16Gi", "ephemeral_storage": "50Gi"}, each optional; and the /dev/shm size.
    resources: dict[str, str] = dataclasses.field(default_factory=dict)
    shm_size: str = ""
    # Rule A7: {"level": ..., "mode": "required" | "preferred"} (checked against the GPU
    # type), or None; stored as the two columns below.
    topology: dict[str, str] | None = None
    # Normalised by `validation.workload_check` (docs/api.md, "Volumes, secrets and
    # metadata"); the grace period filled in (the setting, within the tier's cap).
    volumes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    secrets: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    image_pull_secret: str = ""
    working_dir: str = ""
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    annotations: dict[str, str] = dataclasses.field(default_factory=dict)
    termination_grace_seconds: int | None = None
    # docs/webhooks.md: under one of the team's allowed_notify_url_prefixes ("": none).
    notify_url: str = ""
    # Graceful stop (docs/api.md, "Checkpoints and graceful stop"): the first signal
    # when stopped; how often it says it checkpoints (None: not declared).
    stop_signal: str = v.DEFAULT_STOP_SIGNAL
    checkpoint_interval_seconds: int | None = None
    # Rule B3: the tier asked for when an over-budget team's job dropped to `tier`.
    downgraded_from: str = ""
    # Rules D1-D3, stored form, checked (`services.dependencies.job_input_with_dependencies`).
    dependencies: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # Rules K3, K4: a pin, a cluster selector, the spot opt-in, checked and set by
    # `services.cluster_rules.job_input_with_clusters`.
    requested_cluster: Cluster | None = None
    cluster_selector: dict[str, str] = dataclasses.field(default_factory=dict)
    allow_spot: bool = False
    # Derived from the two above (`__post_init__`): what the manifest and the rules use.
    cpu_millicores: int | None = dataclasses.field(init=False, default=None)
    memory_bytes: int | None = dataclasses.field(init=False, default=None)
    ephemeral_storage_bytes: int | None = dataclasses.field(init=False, default=None)
    shm_size_bytes: int | None = dataclasses.field(init=False, default=None)
    topology_level: str = dataclasses.field(init=False, default="")
    topology_mode: str = dataclasses.field(init=False, default="")

    def __post_init__(self) -> None:
        """Normalise the quantities (ValueError when one is not valid: `job_input_build`
        checked them first) and the topology request."""
        for name, column in RESOURCE_COLUMNS.items():
            text = self.shm_size if name == "shm_size" else self.resources.get(name)
            object.__setattr__(self, column, v.parse_resource(name, text) if text else None)
        if self.topology:
            object.__setattr__(self, "topology_level", self.topology["level"])
            object.__setattr__(self, "topology_mode", self.topology.get("mode") or "required")

    def job_values(self) -> dict[str, Any]:
        """The Job fields this input sets (submit, array job, and the idempotency check
        compare against it): `topology` as its two columns."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in {"topology", "downgraded_from"}}


# A job's quantities by the name the API gives them (`resources` keys and `shm_size`) ->
# Job's normalised column (Team's `default_<column>` and `max_<column>` too).
RESOURCE_COLUMNS: dict[str, str] = TEAM_RESOURCE_FIELDS


# The one job-field mapping: a submitted job's fields as the API, the CLI and the web form
# name them -> JobInput's (Job's) field. Everything that writes a job spec out derives
# from it: `job_spec` (resubmit, the form's "submit again"), JobInput.job_values.
JOB_SPEC_FIELDS: dict[str, str] = {
    "team": "team", "name": "name", "image": "image", "command": "command", "args": "args",
    "env": "env", "gpu_type": "gpu_type", "gpu_types": "gpu_types",
    "gpus": "gpus_per_replica", "replicas": "replicas", "tier": "tier",
    "max_runtime_seconds": "max_runtime_seconds",
    "resources": "resources", "shm_size": "shm_size", "topology": "topology",
    "volumes": "volumes", "secrets": "secrets", "image_pull_secret": "image_pull_secret",
    "working_dir": "working_dir", "labels": "labels", "annotations": "annotations",
    "termination_grace_seconds": "termination_grace_seconds", "notify_url": "notify_url",
    "stop_signal": "stop_signal", "checkpoint_interval_seconds": "checkpoint_interval_seconds",
}
# The fields `validation.workload_check` judges (their names are JobInput's and Job's).
WORKLOAD_FIELDS = ("volumes", "secrets", "image_pull_secret", "working_dir", "labels",
                   "annotations")
_SLUG_FIELDS = frozenset({"team", "gpu_type", "tier"})
INVALID_FIELDS = "The request has invalid fields."
REQUIRED = "This field is required."


def job_spec(job: Job) -> dict[str, Any]:
    """The job's spec as submitted (JOB_SPEC_FIELDS' names; teams, GPU types and tiers by
    slug; `gpu_types` None for a job of one type): what `job_input_build` takes to submit
    it again."""
    spec: dict[str, Any] = {}
    for name, attr in JOB_SPEC_FIELDS.items():
        value = getattr(job, attr)
        spec[name] = value.slug if name in _SLUG_FIELDS else copy.deepcopy(value)
    if job.gpu_slices:
        # A fraction of one GPU (shared GPUs): as `gpus` takes it back, e.g. "0.25".
        spec["gpus"] = v.gpus_text(Fraction(job.gpu_slices, job.gpu_type.slices_per_gpu))
    if spec.get("gpu_types"):
        # `gpu_type` is the type an attempt ran on; as submitted it was the first accepted.
        spec["gpu_type"] = spec["gpu_types"][0]
    else:
        spec["gpu_types"] = None  # a job of one type: `gpu_type` alone
    return spec


def gpu_types_problem(gpu_types: Any, *, gpu_type: str | None,
                      known: Mapping[str, GpuType]) -> str | None:
    """The refusal of a job's `gpu_types` on its own (None: fine): a non-empty list of
    distinct known GPU type slugs whose first is `gpu_type` when that is given too."""
    if not isinstance(gpu_types, list) or not gpu_types:
        return "Give the GPU types the job accepts, most preferred first (at least one)."
    if len(gpu_types) > v.MAX_GPU_TYPES:
        return f"At most {v.MAX_GPU_TYPES} GPU types."
    names = [str(t) for t in gpu_types]
    twice = sorted({t for t in names if names.count(t) > 1})
    if twice:
        return f"Each GPU type once; given more than once: {', '.join(twice)}."
    unknown = [t for t in names if t not in known]
    if unknown:
        return (f"Unknown GPU type{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(repr(t[:40]) for t in unknown)}; known: {', '.join(sorted(known))}.")
    if gpu_type is not None and gpu_type != names[0]:
        return (f"The first accepted type is the job's gpu_type: {gpu_type!r} here, "
                f"{names[0]!r} first in gpu_types (give one of them, or the same first).")
    return None


def job_input_build(
    *, actor: Any, team: str | None, name: str | None, image: str | None,
    gpu_type: str | None = None, gpus: int | Fraction | None, command: list[str] | None = None,
    args: list[str] | None = None, env: dict[str, str] | None = None, replicas: int | None = 1,
    tier: str | None = None, max_runtime_seconds: int | None = None,
    resources: dict[str, str] | None = None, shm_size: str | None = None,
    topology: dict[str, str] | None = None,
    volumes: list[Any] | None = None, secrets: list[Any] | None = None,
    image_pull_secret: str | None = None, working_dir: str | None = None,
    labels: dict[str, Any] | None = None, annotations: dict[str, Any] | None = None,
    termination_grace_seconds: int | None = None, notify_url: str | None = None,
    team_lookup: Callable[[str], Team | None] | None = None,
    gpu_types: list[str] | None = None,
    stop_signal: str | None = None, checkpoint_interval_seconds: int | None = None,
) -> JobInput:
    """The JobInput of a job spec whose fields have their shapes already (the API's
    serializer, the web form): the submit rules that need settings or the database. The
    team must be one `actor` may submit to; without a tier, FAIRQ_DEFAULT_TIER; rule T1
    is `check_submit`'s, at submit.

    Raises DomainError (400) with every refused field's messages, as the API answers and
    the web form shows them: first each field on its own, then, when they all pass, the
    rules across fields (a gang no node holds, the team's resource maxima, the spec's
    size, the tier's grace cap). A None argument is a field the front end found missing
    or ill-formed: reported as required, not checked. A resource or shm size not given
    (None, "") takes the team's default, if it has one, and memory then the platform's
    (`default_memory_bytes`: every pod has a memory limit); a shm size above the memory
    is refused; a grace period not given, FAIRQ_K8S_TERMINATION_GRACE_SECONDS (at most
    the tier's cap, rule R10: `tier_grace_cap`).

    `team_lookup(slug)`: what `team_for_submitter(user=actor, slug=slug)` gives, from a
    caller that remembers it (the API's fast submit, queueing/api/jobs.py); membership
    is checked again by the INSERT either way (`job_submit_with_event`).

    `gpu_types`: every GPU type the job accepts, most preferred first (None: only
    `gpu_type`); `gpu_type` may then be left out (it is the first). Each type must hold
    the job as `gpu_type` must: its GPUs per replica, CPU and memory, its topology level.

    `stop_signal` (None: SIGTERM) one of `validation.STOP_SIGNALS`;
    `checkpoint_interval_seconds` (None: not declared) at least 60.

    `gpus`: whole GPUs (an int), or a fraction of one GPU (a Fraction, as
    `validation.parse_gpus` reads it) on a time-sliced or MPS type only, a multiple of
    1/slices_per_gpu: stored as `gpu_slices` (`validation.gpus_on_type`; refused on
    `gpus`)."""
    command, args, env = command or [], args or [], env or {}
    resources = {k: val.strip() if isinstance(val, str) else val
                 for k, val in (resources or {}).items()}
    resources = {k: val for k, val in resources.items() if val not in (None, "")}
    shm_size = (shm_size or "").strip()
    workload_given = {"volumes": volumes, "secrets": secrets,
                      "image_pull_secret": image_pull_secret, "working_dir": working_dir,
                      "labels": labels, "annotations": annotations}
    accepted: list[str] = []
    types_problem = None
    if gpu_types is not None:
        types_problem = gpu_types_problem(gpu_types, gpu_type=gpu_type,
                                          known=gpu_types_by_slug())
        if types_problem is None:
            accepted = [str(t) for t in gpu_types]
            gpu_type = accepted[0]
    (team_row, gpu_type_row, tier_row), problems = _spec_fields(
        actor=actor, team=team, name=name, image=image, env=env, gpu_type=gpu_type, tier=tier,
        resources=resources, shm_size=shm_size, team_lookup=team_lookup)
    if types_problem:
        problems["gpu_types"] = [types_problem]
    workload, workload_problems = _workload(team_row, env=env, **workload_given)
    for field, refusal in workload_problems.items():
        problems.setdefault(field, refusal)
    grace_problem = _grace_problem(termination_grace_seconds)
    if grace_problem:
        problems["termination_grace_seconds"] = [grace_problem]
    stop_signal = v.DEFAULT_STOP_SIGNAL if stop_signal is None else stop_signal
    signal_problem = v.stop_signal_problem(stop_signal)
    if signal_problem:
        problems["stop_signal"] = [signal_problem]
    interval_problem = v.checkpoint_interval_problem(checkpoint_interval_seconds)
    if interval_problem:
        problems["checkpoint_interval_seconds"] = [interval_problem]
    notify_url = (notify_url or "").strip()
    if notify_url and team_row is not None:
        notify_problem = notify_url_problem(team=team_row, url=notify_url)
        if notify_problem:
            problems["notify_url"] = [notify_problem]
    gpu_slices = 0
    if gpus is not None and gpu_type_row is not None:
        several = len(accepted) > 1
        on_type = v.gpus_on_type(gpus, slug=gpu_type_row.slug, sharing=gpu_type_row.sharing,
                                 slices_per_gpu=gpu_type_row.slices_per_gpu,
                                 several_types=several)
        if isinstance(on_type, str):
            problems.setdefault("gpus", [on_type])
        else:
            gpus, gpu_slices = on_type
        shared = [t for t in accepted if gpu_types_by_slug()[t].packs_slices] if several else []
        if shared:
            problems.setdefault("gpu_types", [
                f"{', '.join(shared)} {'is' if len(shared) == 1 else 'are'} time-sliced or "
                "MPS: a job on such a type accepts only that type (its GPUs are counted "
                "in slices); give it alone as gpu_type."])
    for field, value in (("team", team), ("name", name), ("image", image),
                         ("gpu_type", gpu_type), ("gpus", gpus), ("replicas", replicas)):
        if value is None and not (field == "gpu_type" and gpu_types is not None):
            problems.setdefault(field, [REQUIRED])
    if problems:
        raise DomainError(INVALID_FIELDS, fields=problems)
    assert team_row is not None and gpu_type_row is not None and name is not None
    assert image is not None and gpus is not None and replicas is not None
    assert isinstance(gpus, int)
    if tier_row is None:
        tier_row = tiers_by_slug().get(settings.FAIRQ_DEFAULT_TIER)
        if tier_row is None:
            raise DomainError(INVALID_FIELDS, fields={"tier": [REQUIRED]})
    downgraded_from = ""
    lowest = budget_downgrade_tier(team=team_row, tier=tier_row, now=timezone.now())
    if lowest is not None:  # rule B3
        downgraded_from, tier_row = tier_row.slug, lowest
    type_rows = ([gpu_types_by_slug()[t] for t in accepted] if len(accepted) > 1
                 else [gpu_type_row])
    _refuse_gpus_above_nodes([t.slug for t in type_rows], gpus, slices=gpu_slices)
    for row in type_rows:
        topology = _topology_checked(row, topology, several=len(type_rows) > 1)
    resources, shm_size = _team_resources(team_row, resources=resources, shm_size=shm_size)
    resources = _platform_memory([t.slug for t in type_rows], resources, gpus_per_replica=gpus)
    for row in type_rows:
        _refuse_larger_than_nodes(row.slug, resources)
    _refuse_shm_above_memory(resources, shm_size)
    grace = _tier_grace(tier_row, termination_grace_seconds)
    if v.spec_size(command, args, env) > v.MAX_SPEC_BYTES:
        raise DomainError(INVALID_FIELDS, fields={"non_field_errors": [
            f"command, args and env together exceed {v.MAX_SPEC_BYTES // 1024} KiB."]})
    return JobInput(team=team_row, name=name, image=image, command=command, args=args,
                    env=env, gpu_type=gpu_type_row, gpus_per_replica=gpus, replicas=replicas,
                    gpu_slices=gpu_slices,
                    tier=tier_row, max_runtime_seconds=max_runtime_seconds,
                    gpu_types=accepted if len(accepted) > 1 else [],
                    resources=resources, shm_size=shm_size, topology=topology,
                    termination_grace_seconds=grace, downgraded_from=downgraded_from,
                    notify_url=notify_url, stop_signal=stop_signal,
                    checkpoint_interval_seconds=checkpoint_interval_seconds, **workload)


def _refuse_gpus_above_nodes(types: list[str], gpus: int, *, slices: int = 0) -> None:
    """Rule A3 at submit: DomainError when a replica's GPUs fit no node of an accepted
    type - on `gpus` when that is every type it accepts (or its one type), else on
    `gpu_types` naming the types that can never hold it. Nothing is refused while no
    cluster view was published (the scheduler's own check decides). Nodes report their
    capacity in the type's units (shared GPUs: slices of a time-sliced or MPS type), so
    a replica's units (`slices` for a fraction) are compared and GPUs are said."""
    refused: list[str] = []
    known = gpu_types_by_slug()
    for slug in types:
        per_gpu = known[slug].units_per_device if slug in known else 1
        largest = largest_node_gpus(slug)
        units = slices or gpus * per_gpu
        if largest is not None and units > largest:
            refused.append(f"No {slug} node holds {gpus} GPUs (the largest has "
                           f"{v.gpus_text(Fraction(largest, per_gpu))})."
                           if largest else f"The cluster has no {slug} nodes.")
    if not refused:
        return
    field = "gpus" if len(refused) == len(types) else "gpu_types"
    raise DomainError(INVALID_FIELDS, fields={field: refused})


def _topology_checked(gpu_type: GpuType, topology: dict[str, str] | None, *,
                      several: bool = False) -> dict[str, str] | None:
    """Rule A7: the request with its mode filled in ("required" unless said), or None;
    DomainError on `topology.level` when the GPU type has no such level (each accepted
    type must have it: `several`), on `topology.mode` for a mode that is neither."""
    if not topology:
        return None
    level, mode = topology.get("level"), topology.get("mode") or "required"
    problems: dict[str, list[str]] = {}
    levels = [lv.get("name") for lv in gpu_type.topology_levels or () if isinstance(lv, dict)]
    if level not in levels:
        problems["topology.level"] = [
            f"GPU type {gpu_type.slug} has no topology level {str(level)[:63]!r}; "
            + (f"its levels: {', '.join(map(str, levels))}." if levels
               else "it has none (an admin sets its topology_levels).")
            + (" Every GPU type the job accepts must have the level." if several else "")]
    if mode not in v.TOPOLOGY_MODES:
        problems["topology.mode"] = [f"Use one of: {', '.join(v.TOPOLOGY_MODES)}."]
    if problems:
        raise DomainError(INVALID_FIELDS, fields=problems)
    return {"level": str(level), "mode": mode}


def default_memory_bytes(*, gpus_per_replica: int, largest_node: int | None) -> int:
    """The memory (bytes, requests = limits) of a replica whose job and team set none:
    FAIRQ_DEFAULT_MEMORY_PER_GPU per GPU, at most `largest_node` (what the largest node
    of the GPU type can allocate, when known): docs/kubernetes.md, "Memory, /dev/shm
    and CPU"."""
    memory = v.parse_bytes(settings.FAIRQ_DEFAULT_MEMORY_PER_GPU) * max(1, gpus_per_replica)
    return memory if largest_node is None else max(1, min(memory, largest_node))


def _platform_memory(gpu_types: list[str], resources: dict[str, str], *,
                     gpus_per_replica: int) -> dict[str, str]:
    """`resources` with the platform's memory default when neither the job nor its team
    set memory: every pod gets a memory limit (an unlimited one can take a node's memory
    from every other pod on it); with several accepted GPU types, at most what the
    largest node of each can allocate."""
    if resources.get("memory"):
        return resources
    memory = min(default_memory_bytes(gpus_per_replica=gpus_per_replica,
                                      largest_node=None if largest is None else largest[1])
                 for largest in (largest_node_cpu_memory(t) for t in gpu_types))
    out = {**resources, "memory": v.format_bytes(memory)}
    return {name: out[name] for name in v.RESOURCE_NAMES if name in out}


def _refuse_shm_above_memory(resources: dict[str, str], shm_size: str) -> None:
    """DomainError on `shm_size` when the memory-backed /dev/shm is larger than the
    replica's memory limit: its pages are charged to the container's memory, so the
    pod could never fill it (docs/kubernetes.md, "Memory, /dev/shm and CPU")."""
    memory = resources.get("memory")
    if not shm_size or not memory:
        return
    if v.parse_bytes(shm_size) > v.parse_bytes(memory):
        raise DomainError(INVALID_FIELDS, fields={"shm_size": [
            f"At most the memory limit of a replica ({memory}): /dev/shm is memory and "
            f"counts against it; not {shm_size}."]})


def _refuse_larger_than_nodes(gpu_type: str, resources: dict[str, str]) -> None:
    """Rule A6 at submit: a replica asking more CPU or memory than the largest node of its
    GPU type can allocate would never run; DomainError on `resources.cpu` /
    `resources.memory`. Nothing is refused while the cluster view does not know it."""
    largest = largest_node_cpu_memory(gpu_type)
    if largest is None:
        return
    problems: dict[str, list[str]] = {}
    for name, most in zip(("cpu", "memory"), largest, strict=True):
        text = resources.get(name)
        if text and most is not None and v.parse_resource(name, text) > most:
            problems[resource_field(name)] = [
                f"No {gpu_type} node has {text} {'CPUs' if name == 'cpu' else 'of memory'} "
                f"(the largest can allocate {v.format_resource(name, most)})."]
    if problems:
        raise DomainError(INVALID_FIELDS, fields=problems)


def _workload(team: Team | None, *, env: dict[str, str], **fields: Any
              ) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """`validation.workload_check` of the job's storage, secret and metadata fields
    against `team`'s allowlists (None: the team is refused; every other rule)."""
    policy = None if team is None else v.WorkloadPolicy(
        pvcs=frozenset(team.allowed_pvcs or ()), secrets=frozenset(team.allowed_secrets or ()),
        pull_secrets=frozenset(team.allowed_pull_secrets or ()))
    return v.workload_check(env=env, policy=policy,
                            max_scratch_bytes=settings.FAIRQ_MAX_SCRATCH_BYTES, **fields)


def _grace_problem(grace: Any) -> str | None:
    if grace is None:
        return None
    if isinstance(grace, bool) or not isinstance(grace, int) or \
            not 0 <= grace <= v.MAX_TERMINATION_GRACE_SECONDS:
        return f"Seconds, within 0..{v.MAX_TERMINATION_GRACE_SECONDS}."
    return None


def tier_grace_cap(tier: Tier) -> int | None:
    """Rule R10: the longest termination grace period of a job of `tier`: the tier's
    own cap when it sets one, else FAIRQ_PREEMPTIBLE_MAX_TERMINATION_GRACE_SECONDS for
    a preemptible tier (a victim holds its GPUs while its pods terminate), else none."""
    if tier.max_termination_grace_seconds is not None:
        return int(tier.max_termination_grace_seconds)
    if tier.preemptible:
        return int(settings.FAIRQ_PREEMPTIBLE_MAX_TERMINATION_GRACE_SECONDS)
    return None


def attempt_grace_seconds(job: Job) -> int:
    """The termination grace the job's pods get (what `launch_spec` gives the backend):
    its own, else FAIRQ_K8S_TERMINATION_GRACE_SECONDS, cut to its tier's cap (rule R10)."""
    grace = job.termination_grace_seconds
    if grace is None:
        grace = int(settings.FAIRQ_K8S_TERMINATION_GRACE_SECONDS)
    cap = tier_grace_cap(job.tier)
    return grace if cap is None else min(grace, cap)


def _tier_grace(tier: Tier, grace: int | None) -> int:
    """The job's termination grace period: as asked, or the setting; DomainError when
    asked above the tier's cap (rule R10; the setting alone is cut to the cap)."""
    cap = tier_grace_cap(tier)
    if grace is None:
        grace = settings.FAIRQ_K8S_TERMINATION_GRACE_SECONDS
        return grace if cap is None else min(grace, cap)
    if cap is not None and grace > cap:
        whose = (f"tier {tier.slug}'s maximum" if tier.max_termination_grace_seconds is not None
                 else f"the maximum of preemptible tiers such as {tier.slug}, rule R10")
        raise DomainError(INVALID_FIELDS, fields={"termination_grace_seconds": [
            f"At most {cap} seconds ({whose}), not {grace}."]})
    return grace


def resource_field(name: str) -> str:
    """The error key of a quantity: "resources.cpu" (as DRF names a nested field), or
    "shm_size"."""
    return name if name == "shm_size" else f"resources.{name}"


def _team_resources(team: Team, *, resources: dict[str, str],
                    shm_size: str) -> tuple[dict[str, str], str]:
    """The job's quantities (already valid) with `team`'s defaults filled in; DomainError
    naming each one above the team's maximum."""
    out, problems = dict(resources), {}
    for name, column in RESOURCE_COLUMNS.items():
        text = shm_size if name == "shm_size" else out.get(name, "")
        if not text:
            default = getattr(team, f"default_{column}")
            if default is None:
                continue
            text = v.format_resource(name, default)
        most = getattr(team, f"max_{column}")
        if most is not None and v.parse_resource(name, text) > most:
            problems[resource_field(name)] = [
                f"At most {v.format_resource(name, most)} per replica (team {team.slug}'s "
                f"maximum), not {text}."]
        if name == "shm_size":
            shm_size = text
        else:
            out[name] = text
    if problems:
        raise DomainError(INVALID_FIELDS, fields=problems)
    return {name: out[name] for name in v.RESOURCE_NAMES if name in out}, shm_size


def job_spec_field_problems(
    *, actor: Any, team: str | None = None, name: str | None = None, image: str | None = None,
    env: dict[str, str] | None = None, gpu_type: str | None = None, tier: str | None = None,
    resources: dict[str, str] | None = None, shm_size: str | None = None,
    volumes: list[Any] | None = None, secrets: list[Any] | None = None,
    image_pull_secret: str | None = None, working_dir: str | None = None,
    labels: dict[str, Any] | None = None, annotations: dict[str, Any] | None = None,
) -> dict[str, list[str]]:
    """`job_input_build`'s first step alone: the refusals of each given field on its own
    (None: not given). For a front end whose own shape checks refused other fields, so it
    answers every field's problem at once, as one serializer did."""
    workload = {"volumes": volumes, "secrets": secrets, "image_pull_secret": image_pull_secret,
                "working_dir": working_dir, "labels": labels, "annotations": annotations}
    return _spec_fields(actor=actor, team=team, name=name, image=image, env=env or {},
                        gpu_type=gpu_type, tier=tier, resources=resources or {},
                        shm_size=shm_size or "", workload=workload)[1]


def _spec_fields(
    *, actor: Any, team: str | None, name: str | None, image: str | None,
    env: dict[str, str], gpu_type: str | None, tier: str | None,
    resources: dict[str, str] | None = None, shm_size: str = "",
    workload: dict[str, Any] | None = None,
    team_lookup: Callable[[str], Team | None] | None = None,
) -> tuple[tuple[Team | None, GpuType | None, Tier | None], dict[str, list[str]]]:
    """The team, GPU type and tier rows the spec names, and each field's refusals."""
    problems: dict[str, list[str]] = {}
    team_row = gpu_type_row = tier_row = None
    if team is not None:
        team_row = (team_lookup(team) if team_lookup is not None
                    else team_for_submitter(user=actor, slug=team))
        if team_row is None:
            problems["team"] = [unknown_team_message(team)]
    if name is not None and not v.JOB_NAME_RE.match(name):
        problems["name"] = ["Use at most 63 lower-case letters, digits and '-', starting and "
                            "ending with a letter or digit (a Kubernetes name)."]
    if image is not None:
        problem = ("Not a valid container image reference." if not v.IMAGE_RE.match(image)
                   else v.registry_problem(image, settings.FAIRQ_REGISTRY_ALLOWLIST))
        if problem:
            problems["image"] = [problem]
    env_problems = _env_problems(env)
    if env_problems:
        problems["env"] = env_problems
    if gpu_type is not None:
        types = gpu_types_by_slug()
        gpu_type_row = types.get(gpu_type)
        if gpu_type_row is None:
            problems["gpu_type"] = [f"Unknown GPU type {gpu_type!r}; known: "
                                    f"{', '.join(sorted(types))}."]
    if tier is not None:
        tiers = tiers_by_slug()
        tier_row = tiers.get(tier)
        if tier_row is None:
            problems["tier"] = [f"Unknown tier {tier!r}; known: {', '.join(sorted(tiers))}."]
    problems.update(_quantity_problems(resources or {}, shm_size))
    if workload is not None:
        problems.update(_workload(team_row, env=env, **workload)[1])
    return (team_row, gpu_type_row, tier_row), problems


def _quantity_problems(resources: dict[str, str], shm_size: str) -> dict[str, list[str]]:
    """Each quantity's refusal on its own (not a quantity, zero, negative, too large)."""
    problems: dict[str, list[str]] = {}
    unknown = sorted(str(k) for k in resources if k not in v.RESOURCE_NAMES)
    if unknown:
        problems["resources"] = [f"Unknown resources: {', '.join(unknown)} (known: "
                                 f"{', '.join(v.RESOURCE_NAMES)})."]
    given = [(name, text) for name, text in resources.items() if name in v.RESOURCE_NAMES]
    for name, text in [*given, *([("shm_size", shm_size)] if shm_size else [])]:
        try:
            v.parse_resource(name, text)
        except ValueError as exc:
            problems[resource_field(name)] = [str(exc)]
    return problems


def _env_problems(env: dict[str, str]) -> list[str]:
    """The first refusal of the environment's names and simulator knobs, or []."""
    if len(env) > v.MAX_ENV_ITEMS:
        return [f"At most {v.MAX_ENV_ITEMS} variables."]
    bad = [k for k in env if not v.ENV_NAME_RE.match(k) or len(k) > 253]
    if bad:
        return [f"Invalid variable names: {', '.join(sorted(bad))}."]
    reserved = [k for k in env if v.env_name_reserved(k)]
    if reserved:
        return [f"These names are reserved: {', '.join(sorted(reserved))} "
                f"({v.RESERVED_ENV_HELP})."]
    return v.sim_env_problems(env)


MAX_IDEMPOTENCY_KEY_LENGTH = 200  # Job.idempotency_key's column


def job_submit(
    *, actor: Any, data: JobInput, idempotency_key: str | None = None,
    now: datetime | None = None,
) -> tuple[Job, bool]:
    """Queue a job. Returns (job, created); with an idempotency key already used by the
    team, the first job and created=False, and nothing is written."""
    job, _, created = job_submit_with_event(actor=actor, data=data,
                                            idempotency_key=idempotency_key, now=now)
    return job, created


def job_submit_with_event(
    *, actor: Any, data: JobInput, idempotency_key: str | None = None,
    now: datetime | None = None,
) -> tuple[Job, JobEvent | None, bool]:
    """`job_submit`, also returning the submit event it wrote (None when nothing was
    written), so the API can answer with the job's events without reading them back.

    An idempotency key is unique per team (a constraint, kept as long as the job): the
    same submitter sending the same job again gets the first job back; the key with a
    different job, or from someone else in the team, is IdempotencyKeyReused (422), never
    another request's job. A key longer than the column is a DomainError (400)."""
    now = now or timezone.now()
    if idempotency_key and len(idempotency_key) > MAX_IDEMPOTENCY_KEY_LENGTH:
        raise DomainError(
            f"The idempotency key is longer than {MAX_IDEMPOTENCY_KEY_LENGTH} characters.",
            fields={"idempotency_key": [f"At most {MAX_IDEMPOTENCY_KEY_LENGTH} characters."]})
    if idempotency_key:
        existing = Job.objects.filter(team=data.team, idempotency_key=idempotency_key).first()
        if existing is not None:
            return _same_submit_or_refuse(existing, actor=actor, data=data), None, False
    submitter = actor if actor.is_authenticated else None
    job = Job(**data.job_values(), submitter=submitter, status=JobState.QUEUED,
              idempotency_key=idempotency_key or None, created_at=now, updated_at=now)
    event = JobEvent(at=now, kind=JobEvent.Kind.TRANSITION, from_status="", to_status=JobState.QUEUED,
                     actor=submitter, actor_label=str(actor), attempt=1,
                     **{"reason": "submitted", **_downgrade_note(data)})
    # Membership and rule T1 are the INSERT's own condition (one statement: a revoked
    # membership or grant holds from the next submit on, with no round trip of its own);
    # only a refused insert asks check_submit which of them refused.
    tier_sql, member_sql, allowed_params = submit_allowed_sql(
        actor=actor, team=data.team, tier=data.tier)
    try:
        inserted = _insert_job_with_event(
            job, event, where=(f"{tier_sql} AND {member_sql}", allowed_params),
            listeners_of=data.team.pk)
        if not inserted:
            check_submit(actor=actor, team=data.team, tier=data.tier)
            raise DomainError(INVALID_FIELDS, fields={"team": [
                "The team's members or tiers changed during this submit; try again."]})
    except IntegrityError:
        # A concurrent request with the same key won the unique constraint: return its job.
        if idempotency_key:
            existing = Job.objects.filter(team=data.team, idempotency_key=idempotency_key).first()
            if existing is not None:
                return _same_submit_or_refuse(existing, actor=actor, data=data), None, False
        raise
    # The shared plan is kept: a job newer than it refreshes it when its standing is asked
    # for (selectors/queue_plan.py::queue_standing), so a burst of submits plans once.
    transaction.on_commit(kick)
    # docs/webhooks.md: a submit event goes to the team's endpoints and the job's
    # notify_url; with neither (most teams, most jobs) no message is sent at all (the
    # INSERT said whether the team has an enabled endpoint: no query of its own).
    if job.notify_url or getattr(job, "team_has_webhooks", True):
        webhooks_event_written(event.pk)
    return job, event, True


def _downgrade_note(data: JobInput, *, array: bool = False) -> dict[str, Any]:
    """The submit event's reason and data when rule B3 dropped the job's tier."""
    if not data.downgraded_from:
        return {}
    return {"reason": f"submitted{' (array job)' if array else ''}; tier "
                      f"{data.downgraded_from} -> {data.tier.slug}: the team's monthly GPU "
                      "budget is used up (rule B3)",
            "data": {"budget_downgrade": {"from": data.downgraded_from, "to": data.tier.slug}}}


def _same_submit_or_refuse(existing: Job, *, actor: Any, data: JobInput) -> Job:
    """`existing` when it is the job `actor` would submit now with `data`."""
    submitter_id = actor.pk if actor.is_authenticated else None
    same = existing.submitter_id == submitter_id
    for name, value in data.job_values().items():
        field = Job._meta.get_field(name)
        if name == "gpu_type" and existing.gpu_types:
            continue  # the type it ran on; `gpu_types` (compared) says what it accepts
        if isinstance(field, ForeignKey):  # compare ids: no query for the existing job's rows
            same = same and getattr(existing, field.attname) == getattr(value, "pk", None)
        else:
            same = same and getattr(existing, name) == value
    if not same:
        raise IdempotencyKeyReused(
            f"Idempotency key {existing.idempotency_key!r} was used for another job of team "
            f"{data.team.slug}; use a new key.")
    return existing


def _insert_job_with_event(job: Job, event: JobEvent, *,
                           where: tuple[str, list[Any]] | None = None,
                           listeners_of: int | None = None) -> bool:
    """INSERT the unsaved `job` and its first `event`, both or neither, and set their ids.
    With `where` (an SQL condition and its parameters) the job is inserted only when the
    condition holds at the INSERT; False (nothing written, no ids) when it did not.

    This runs once per submitted job, so it skips the ORM's query compiler
    (queueing/rawsql.py). On PostgreSQL both rows go in one statement (a data-modifying
    WITH): atomic by itself, one round trip, no BEGIN/COMMIT; elsewhere two INSERTs in a
    transaction. Inside a caller's transaction a savepoint keeps a failed INSERT (an
    idempotency key taken meanwhile) from breaking the caller's transaction.

    With `listeners_of` (a team id), on PostgreSQL the same statement also tells whether
    that team has an enabled webhook endpoint, kept on the job as `team_has_webhooks`
    (elsewhere the attribute is not set: callers take it as True)."""
    job_columns, _ = rawsql.insert_columns(Job)
    event_columns, event_fields = rawsql.insert_columns(JobEvent)
    job_params = rawsql.insert_params(job)
    event_params = rawsql.insert_params(event)
    job_at = [f.attname for f in event_fields].index("job_id")
    # NULL written into the statement, not passed: psycopg converts a statement's %s
    # placeholders once and keeps the result only for statements of at most 50
    # parameters; a submit passed 62 and paid the conversion (~0.4 ms) every time. The
    # NULLs take the submit to 48. (Client-side binding sends None as NULL anyway.)
    placeholders = ", ".join(["NULL" if p is None else "%s" for p in job_params])
    job_params = [p for p in job_params if p is not None]
    if where is None:
        insert_job = f"INSERT INTO {rawsql.table(Job)} ({job_columns}) VALUES ({placeholders})"
    else:
        insert_job = (f"INSERT INTO {rawsql.table(Job)} ({job_columns}) "
                      f"SELECT {placeholders} WHERE {where[0]}")
        job_params = [*job_params, *where[1]]
    with transaction.atomic() if connection.in_atomic_block or connection.vendor != "postgresql" \
            else nullcontext(), rawsql.statement_cursor() as cur:
        if connection.vendor == "postgresql":
            event_values = ["NULL" if p is None else "%s" for p in event_params]
            event_values[job_at] = "j.id"
            event_params = [p for i, p in enumerate(event_params)
                            if i != job_at and p is not None]
            listeners, listeners_params = "", []
            if listeners_of is not None:
                listeners = (f", EXISTS (SELECT 1 FROM {rawsql.table(WebhookEndpoint)} w "
                             "WHERE w.team_id = %s AND w.enabled)")
                listeners_params = [listeners_of]
            cur.execute(
                f"WITH j AS ({insert_job} RETURNING id) "
                f"INSERT INTO {rawsql.table(JobEvent)} ({event_columns}) "
                f"SELECT {', '.join(event_values)} FROM j RETURNING job_id, id{listeners}",
                [*job_params, *event_params, *listeners_params],
            )
            row = cur.fetchone()
            if row is None:
                return False
            job.pk, event.pk = row[0], row[1]
            if listeners_of is not None:
                job.team_has_webhooks = bool(row[2])  # type: ignore[attr-defined]
        else:
            cur.execute(f"{insert_job} RETURNING id", job_params)
            row = cur.fetchone()
            if row is None:
                return False
            job.pk = row[0]
            event_params[job_at] = job.pk
            cur.execute(f"INSERT INTO {rawsql.table(JobEvent)} ({event_columns}) "
                        f"VALUES ({', '.join(['%s'] * len(event_params))}) RETURNING id",
                        event_params)
            event.pk = cur.fetchone()[0]
    job._state.adding = event._state.adding = False
    event.job = job
    return True


@transaction.atomic
def job_cancel(*, actor: Any, job: Job, reason: str = "", now: datetime | None = None) -> Job:
    """Cancel a job that is not final, if `actor` may see it (NotFound otherwise) and may
    cancel it (PermissionDenied otherwise: `check_job_cancel`). Its GPU time so far is
    charged; its cluster workload is stopped after commit."""
    now = now or timezone.now()
    if actor is not None:
        check_job_cancel(actor=actor, job=check_job_access(actor=actor, job_id=job.pk))
    job = Job.objects.select_for_update().get(pk=job.pk)
    held = job.state in HOLDING_STATES
    # A held attempt's pods get its stop signal, then its grace: it may still report a
    # checkpoint meanwhile (services/checkpoints.py reads the window from here).
    data = ({"grace_seconds": attempt_grace_seconds(job), "stop_signal": job.stop_signal}
            if held else None)
    try:
        job_transition(
            job, JobState.CANCELLED, now=now, actor=actor,
            reason=reason or f"cancelled by {actor}", finished_at=now, data=data,
        )
    except IllegalTransition as exc:
        raise InvalidTransition(f"job {job.pk} is {job.status}; it cannot be cancelled") from exc
    if held:
        if job.started_at is not None:
            usage_record_attempt(job=job, start=job.started_at, end=now)
        name = job.backend_name
        transaction.on_commit(lambda: stop_workload_soon(name))
    transaction.on_commit(queue_plan_forget)
    return job


MAX_BULK_JOBS = 10_000


# Every member of an array stores its own command, args and env, volumes, secrets,
# labels and annotations (a job is one row, which the scheduler and the cluster read
# whole). Their bytes times `count` are bounded, so a request of at most MAX_SPEC_BYTES
# (and of the bounded storage and metadata fields) cannot write more than this: 120 KB
# of env × 1,000 members wrote 124 MB before; 10,000 small members (1.6 KB each) fit.
MAX_ARRAY_BYTES = 16 * 1024 * 1024


def array_size_problem(*, command: list[str], args: list[str], env: dict[str, str],
                       count: int, extra: Any = None) -> str | None:
    """Why an array of `count` jobs of this spec would store too much, or None. `extra`:
    the member's other stored JSON (volumes, secrets, labels, annotations), counted too."""
    member_env = {**env, "FAIRQ_ARRAY_INDEX": str(count - 1), "FAIRQ_ARRAY_SIZE": str(count)}
    per_member = spec_size(command, args, member_env)
    if extra:
        per_member += len(json.dumps(extra).encode())
    if per_member * count <= MAX_ARRAY_BYTES:
        return None
    mib = 1024 * 1024
    return (f"{count} jobs of {per_member:,} bytes of command, args, env, volumes, secrets, "
            "labels and annotations would store "
            f"{per_member * count / mib:.1f} MiB; an array job stores at most "
            f"{MAX_ARRAY_BYTES // mib} MiB (at most {MAX_ARRAY_BYTES // per_member:,} jobs "
            "of this size): use fewer jobs or a smaller spec.")


def jobs_submit_bulk(
    *, actor: Any, data: JobInput, count: int, now: datetime | None = None
) -> list[int]:
    """`jobs_submit_array` without a concurrency limit, every member written as a row at
    once (the whole window: tests and benchmarks that need `count` queued rows); the job
    ids in index order."""
    return jobs_submit_array(actor=actor, data=data, count=count, now=now, window=count)[1]


# An array is stored compactly (docs/scheduling.md, "Arrays"): submit writes
# the JobArray (the template's columns, `count`, `max_running`) and only the first
# ARRAY_SUBMIT_WINDOW members as Job rows; the scheduler cycle materializes the rest as
# they are needed (services/arrays.py::arrays_top_up), Slurm's way. Arrays this small or
# smaller are whole at submit. Each row written costs the answer ~0.25 ms on PostgreSQL
# (bench/bench_bulk_copy.py: 13.5 ms for 1 row, 18 for 8, 25 for 32, 85 for 256); the
# cycle writes the rest before its snapshot whatever this is, so it only decides how
# small an array is whole at once.
ARRAY_SUBMIT_WINDOW = 8

# Job columns every member has of its own: not in `JobArray.spec` (its `env` is the
# template's, each member's adds its index).
_MEMBER_OWN = frozenset({"id", "name", "array_id", "array_index", "created_at",
                         "updated_at", "change_xid"})


def array_spec(template: Job) -> dict[str, Any]:
    """The template's columns as `JobArray.spec` keeps them (by attname, JSON values):
    what a member materialized later is built from (`array_template`)."""
    return {f.attname: getattr(template, f.attname) for f in Job._meta.concrete_fields
            if f.attname not in _MEMBER_OWN}


def array_template(array: JobArray, *, now: datetime) -> Job:
    """The unsaved Job every member of `array` is a copy of (but for name, env and
    index): its stored spec, submitted at the array's submit time (rule O1's age and the
    FIFO order count from then), the array's own env. Columns the spec lacks (added to
    Job after the array was submitted) get their defaults."""
    known = {f.attname for f in Job._meta.concrete_fields}
    values = {k: v for k, v in array.spec.items() if k in known and k not in _MEMBER_OWN}
    return Job(**values, name=array.name, created_at=array.created_at, updated_at=now,
               array=array)


_REASON_MAX = JobEvent._meta.get_field("reason").max_length or 500


def array_member_event(array: JobArray, *, now: datetime) -> JobEvent:
    """A member's first event (rule S1: "" -> QUEUED), whenever its row is written: at
    submit for the first ARRAY_SUBMIT_WINDOW, by the cycle for the rest; the submit's
    actor and note (rule B3's downgrade) come from the array's "submitted" event."""
    submitted: dict[str, Any] = next((e for e in array.events if e.get("kind") == "submitted"), {})
    note = submitted.get("note") or {}
    reason = note.get("reason") or f"submitted (array {array.pk})"
    if submitted and submitted.get("at") != now.isoformat():
        reason = f"{reason}; task queued by the scheduler (array submitted {submitted['at']})"
    return JobEvent(at=now, kind=JobEvent.Kind.TRANSITION, from_status="",
                    to_status=JobState.QUEUED, actor_id=array.created_by_id,
                    actor_label=submitted.get("actor", ""), attempt=1,
                    reason=reason[:_REASON_MAX], data=dict(note.get("data") or {}))


def array_member_indices(array: JobArray, positions: range) -> list[int]:
    """The array indices of the members at `positions` (0: the first member): the same
    numbers for a plain array of `count`, else from its stored runs (Slurm's `--array`
    ranges, queueing/policy/arrays.py)."""
    runs = array.spec.get(ARRAY_INDEX_RUNS)
    return run_indices(runs, positions) if runs else list(positions)


def array_members_write(array: JobArray, positions: range, *, now: datetime) -> list[int]:
    """Write the members at `positions` (0..count-1, in order) of `array` as QUEUED Job
    rows with their first event (COPY on PostgreSQL, bulk_create elsewhere); the caller
    holds the array's row lock and moves `materialized`. Returns their ids in index
    order."""
    if not positions:
        return []
    indices = array_member_indices(array, positions)
    template = array_template(array, now=now)
    event = array_member_event(array, now=now)
    count = array.count
    if connection.vendor == "postgresql":
        return _copy_array_job(template, event, array.name, indices, template.env, count)
    jobs = [Job(**{**{f.attname: getattr(template, f.attname)
                      for f in Job._meta.concrete_fields if not f.primary_key},
                   "name": f"{array.name}-{i}", "array_index": i,
                   "env": {**template.env, "FAIRQ_ARRAY_INDEX": str(i),
                           "FAIRQ_ARRAY_SIZE": str(count)}})
            for i in indices]
    Job.objects.bulk_create(jobs, batch_size=2000)
    ids = [job.pk for job in jobs]
    event_fields = {f.attname: getattr(event, f.attname)
                    for f in JobEvent._meta.concrete_fields if not f.primary_key}
    JobEvent.objects.bulk_create(
        [JobEvent(**{**event_fields, "job_id": job_id}) for job_id in ids], batch_size=2000)
    return ids


def array_members_notify(array: JobArray, ids: list[int]) -> None:
    """Hand the new members' first events to the webhooks (after commit, one message),
    when the members or their team have a receiver."""
    if ids and (array.spec.get("notify_url") or array.team.webhooks.filter(enabled=True).exists()):
        webhooks_events_written(JobEvent.objects.filter(
            job_id__in=ids, kind=JobEvent.Kind.TRANSITION, to_status=JobState.QUEUED,
            attempt=1).values_list("pk", flat=True))


@transaction.atomic
def jobs_submit_array(
    *, actor: Any, data: JobInput, count: int, max_running: int | None = None,
    now: datetime | None = None, window: int = ARRAY_SUBMIT_WINDOW,
    indices: Sequence[int] | None = None,
) -> tuple[JobArray, list[int]]:
    """Queue an array job: a `JobArray` of `count` copies of `data`, job i named
    `<name>-<i>` with `array_index` i and `FAIRQ_ARRAY_INDEX=i`, `FAIRQ_ARRAY_SIZE=count`
    in its environment; at most `max_running` members hold GPUs at once (rule A8; None:
    no limit). One transaction: the array (its spec, size, limit and its "submitted N
    tasks" event) and the first `window` members as QUEUED rows with their
    submit events; the rest are written by the cycle as they are needed (docs/scheduling.md "Arrays",
    `services.arrays.arrays_top_up`) and count as queued meanwhile. Returns the array
    and the ids of the members written now, in index order.

    `indices`: the members' array indices when not 0..count-1 (Slurm's `--array=1,3,5`,
    `0-15:4`: queueing/policy/arrays.py), increasing, `count` of them; kept as runs in
    the array's spec, member i of the array gets the i-th."""
    if not 1 <= count <= MAX_BULK_JOBS:
        raise ValueError(f"count must be within 1..{MAX_BULK_JOBS}")
    if indices is not None and (len(indices) != count or list(indices) != sorted(set(indices))):
        raise ValueError("indices must be `count` increasing numbers")
    last = indices[-1] if indices is not None else count - 1
    if max_running is not None and max_running < 1:
        raise DomainError(INVALID_FIELDS, fields={"max_running": ["At least 1."]})
    longest = f"{data.name}-{last}"
    if len(longest) > 63:
        message = f"{longest!r} is longer than 63 characters: shorten the name."
        raise DomainError(INVALID_FIELDS, fields={"name": [message]})
    problem = array_size_problem(
        command=data.command, args=data.args, env=data.env, count=count,
        extra=[data.volumes, data.secrets, data.labels, data.annotations])
    if problem:
        raise DomainError(INVALID_FIELDS, fields={"count": [problem]})
    now = now or timezone.now()
    check_submit(actor=actor, team=data.team, tier=data.tier)
    submitter = actor if actor.is_authenticated else None
    template = Job(**data.job_values(), submitter=submitter, status=JobState.QUEUED,
                   created_at=now, updated_at=now)
    window = min(count, max(window, 1))
    note = _downgrade_note(data, array=True)
    submitted = {"at": now.isoformat(), "kind": "submitted", "actor": str(actor)[:100],
                 "reason": f"submitted {count} tasks ({window} queued as jobs now, the rest "
                           "as the scheduler needs them)" if window < count
                           else f"submitted {count} tasks",
                 **({"note": note} if note else {})}
    spec = array_spec(template)
    if indices is not None and last != count - 1:
        runs = index_runs(indices)
        spec[ARRAY_INDEX_RUNS] = runs
        submitted["reason"] = f"{submitted['reason']} (indices {_indices_text(runs)})"
    array = JobArray.objects.create(team=data.team, name=data.name, count=count,
                                    max_running=max_running, created_by=submitter,
                                    created_at=now, spec=spec,
                                    materialized=window, events=[submitted])
    ids = array_members_write(array, range(window), now=now)
    transaction.on_commit(kick)  # the shared plan is kept (see job_submit_with_event)
    array_members_notify(array, ids)
    return array, ids


# `JobArray.spec`'s key for an array's indices when not 0..count-1: runs [start, step, n].
ARRAY_INDEX_RUNS = "index_runs"


def _indices_text(runs: list[list[int]]) -> str:
    """Runs as Slurm writes indices: `1-5,10,20-30:5`."""
    parts = []
    for start, step, n in runs:
        end = start + step * (n - 1)
        parts.append(str(start) if n == 1 else f"{start}-{end}" if step == 1
                     else f"{start}-{end}:{step}")
    return ",".join(parts)


def _row_values(instance: Any) -> dict[str, Any]:
    """Column -> value of an unsaved instance as COPY takes it (JSON as text)."""
    out: dict[str, Any] = {}
    for f in type(instance)._meta.concrete_fields:
        if f.primary_key:
            continue
        value = getattr(instance, f.attname)
        out[f.column] = json.dumps(value) if isinstance(f, JSONField) and value is not None \
            else value
    return out


# COPY's text format: a tab between fields, \N for NULL, these characters escaped.
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"})
_COPY_CHUNK = 1000  # rows per write: a few hundred KB


def _copy_text(value: Any) -> str:
    """`value` (as `_row_values` gives it) as one field of COPY's text format; TypeError
    for a type it does not know (the caller then lets psycopg adapt every row)."""
    if value is None:
        return "\\N"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, int | float | Decimal | UUID):
        return str(value)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise TypeError("naive datetime")
        return value.isoformat()
    if isinstance(value, str):
        return value.translate(_COPY_ESCAPES)
    raise TypeError(type(value).__name__)


def _copy_lines(table: str, columns: list[str], lines: Any) -> None:
    """COPY rows already in text format (one string per row, newline-terminated)."""
    with connection.cursor() as cur:
        quoted = ", ".join(connection.ops.quote_name(c) for c in columns)
        sql = f"COPY {connection.ops.quote_name(table)} ({quoted}) FROM STDIN"
        with cur.cursor.copy(sql) as cp:
            chunk: list[str] = []
            for line in lines:
                chunk.append(line)
                if len(chunk) == _COPY_CHUNK:
                    cp.write("".join(chunk))
                    chunk = []
            if chunk:
                cp.write("".join(chunk))


def _copy_rows(table: str, columns: list[str], rows: Any) -> None:
    with connection.cursor() as cur:
        quoted = ", ".join(connection.ops.quote_name(c) for c in columns)
        sql = f"COPY {connection.ops.quote_name(table)} ({quoted}) FROM STDIN"
        with cur.cursor.copy(sql) as cp:
            for row in rows:
                cp.write_row(row)


def _array_env_json(env: dict[str, str], count: int) -> tuple[str, str]:
    """Member i's env as JSON is `head + str(i) + tail`: every member's env is the same
    but for its index, so it is encoded once (json.dumps per member was a
    sixth of a 10,000-job array's time)."""
    encoded = json.dumps({**env, "FAIRQ_ARRAY_INDEX": "", "FAIRQ_ARRAY_SIZE": str(count)})
    # The marker appears once: a value's quotes are escaped inside its string.
    head, tail = encoded.split('"FAIRQ_ARRAY_INDEX": ""')
    return head + '"FAIRQ_ARRAY_INDEX": "', '"' + tail


def _copy_array_job(template: Job, event: JobEvent, name: str, indices: Sequence[int],
                    env: dict[str, str], count: int) -> list[int]:
    """COPY members `indices` of an array of `count` and their events, member i named
    `<name>-<i>` with `env` plus its index and the array's size. The rows are built as
    COPY text from a template encoded once (only the id, name and env differ between
    jobs, the job id between events); psycopg's per-value adaptation of every row is the
    fallback for a column type the template does not know."""
    names = [f"{name}-{i}" for i in indices]
    with connection.cursor() as cur:
        cur.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)",
            [Job._meta.db_table, len(indices)],
        )
        ids = sorted(r[0] for r in cur.fetchall())
    job_values = _row_values(template)
    columns = ["id", *job_values]
    name_at, env_at = columns.index("name"), columns.index("env")
    index_at = columns.index("array_index")  # rule A8: member i of its array
    env_head, env_tail = _array_env_json(env, count)
    event_values = _row_values(event)
    event_columns = list(event_values)
    job_at = event_columns.index("job_id")
    try:
        base = ["", *(_copy_text(x) for x in job_values.values())]
        event_base = [_copy_text(x) for x in event_values.values()]
    except TypeError:
        base = event_base = []
    if base:
        head, tail = env_head.translate(_COPY_ESCAPES), env_tail.translate(_COPY_ESCAPES)

        def job_lines() -> Any:
            row = list(base)
            for job_id, member, i in zip(ids, names, indices, strict=True):
                row[0], row[name_at] = str(job_id), member.translate(_COPY_ESCAPES)
                row[env_at], row[index_at] = f"{head}{i}{tail}", str(i)
                yield "\t".join(row) + "\n"

        def event_lines() -> Any:
            before = "\t".join(event_base[:job_at])
            after = "\t".join(event_base[job_at + 1:])
            prefix = f"{before}\t" if job_at else ""
            suffix = f"\t{after}\n" if job_at < len(event_base) - 1 else "\n"
            for job_id in ids:
                yield f"{prefix}{job_id}{suffix}"

        _copy_lines(Job._meta.db_table, columns, job_lines())
        _copy_lines(JobEvent._meta.db_table, event_columns, event_lines())
        return ids
    row_base = [None, *job_values.values()]

    def job_rows() -> Any:
        for job_id, member, i in zip(ids, names, indices, strict=True):
            row = list(row_base)
            row[0], row[name_at], row[env_at] = job_id, member, f"{env_head}{i}{env_tail}"
            row[index_at] = i
            yield row

    def event_rows() -> Any:
        row = list(event_values.values())
        for job_id in ids:
            row[job_at] = job_id
            yield row

    _copy_rows(Job._meta.db_table, columns, job_rows())
    _copy_rows(JobEvent._meta.db_table, event_columns, event_rows())
    return ids

