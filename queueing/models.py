"""GPU types, tiers, quotas, jobs, their events, usage and fair-share accumulators."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import F, Q

from accounts.models import Team, slug_validator

from .backends.base import workload_name
from .policy.snapshot import FlavorFallback
from .policy.states import FINAL_STATES, JobState
from .validation import (
    MIN_CHECKPOINT_INTERVAL_SECONDS,
    STOP_SIGNALS,
    topology_levels,
    webhook_url_problem,
)


def validate_topology_levels(value: object) -> None:
    """Model validator of `GpuType.topology_levels` (rule A7)."""
    try:
        topology_levels(value)
    except ValueError as exc:
        raise ValidationError(str(exc)) from exc


GPU_SHARING_CHOICES = [("exclusive", "exclusive (whole GPUs)"),
                       ("mig", "MIG (isolated instances)"),
                       ("time-sliced", "time-sliced (no memory isolation)"),
                       ("mps", "MPS (no memory isolation)")]


class GpuType(models.Model):
    slug = models.CharField(max_length=40, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    resource_name = models.CharField(
        max_length=100, default="nvidia.com/gpu",
        help_text="Kubernetes extended resource, e.g. nvidia.com/gpu or nvidia.com/mig-1g.10gb",
    )
    node_labels = models.JSONField(
        default=dict, blank=True, help_text="Node labels that select this GPU type."
    )
    billing_weight = models.FloatField(
        default=1.0, validators=[MinValueValidator(0.0)],
        help_text="Usage of one GPU-hour of this type counts as this many GPU-hours.",
    )
    # Rule A7 (docs/scheduling.md): the topology levels of its nodes, narrow to wide,
    # [{"name": "nvlink", "node_label": "nvidia.com/gpu.clique"}, {"name": "rack", ...}].
    topology_levels = models.JSONField(
        default=list, blank=True, validators=[validate_topology_levels],
        help_text='Narrow to wide, e.g. [{"name": "rack", "node_label": '
                  '"topology.kubernetes.io/rack"}]: a job may ask its replicas to share '
                  "one domain of a level (the nodes with the same value of its label).",
    )

    # Shared GPUs (docs/scheduling.md, "Shared GPUs"): how one physical GPU of the type
    # is shared. `exclusive`: a pod gets whole GPUs (slices_per_gpu = 1). `mig`: the
    # type is one MIG profile (resource_name e.g. nvidia.com/mig-1g.10gb), each device an
    # isolated instance, `slices_per_gpu` instances of it per GPU. `time-sliced` / `mps`:
    # the NVIDIA device plugin's replicas of one GPU (`slices_per_gpu` per GPU) with NO
    # memory isolation; a job asks whole GPUs or a fraction (`Job.gpu_slices`).
    sharing = models.CharField(max_length=12, choices=GPU_SHARING_CHOICES,
                               default="exclusive", db_default="exclusive")
    slices_per_gpu = models.PositiveSmallIntegerField(
        default=1, db_default=1, validators=[MinValueValidator(1), MaxValueValidator(64)],
        help_text="exclusive: 1; mig: instances of this profile per GPU; time-sliced and "
                  "mps: the device plugin's replicas per GPU.")

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.CheckConstraint(condition=Q(billing_weight__gte=0), name="gpu_billing_weight_gte_0"),
            models.CheckConstraint(condition=~Q(sharing="exclusive") | Q(slices_per_gpu=1),
                                   name="gpu_exclusive_one_slice"),
        ]

    def __str__(self) -> str:
        return self.slug

    @property
    def packs_slices(self) -> bool:
        """Time-sliced and MPS types: fractions of one GPU are packed per GPU."""
        return self.sharing in ("time-sliced", "mps")

    @property
    def units_per_device(self) -> int:
        """What one whole device counts in the policy's units of this type: a GPU of a
        time-sliced or MPS type is `slices_per_gpu` slices; an exclusive GPU or a MIG
        instance is 1."""
        return self.slices_per_gpu if self.packs_slices else 1

    @property
    def gpus_per_unit(self) -> float:
        """GPU-hours one unit-hour counts (quotas shown, fair share, costs): 1 /
        `slices_per_gpu` (a MIG instance of a 7-way profile: 1/7 GPU)."""
        return 1.0 / self.slices_per_gpu


class ClusterBackendKind(models.TextChoices):
    SIMULATED = "simulated", "simulated (embedded)"
    KUBERNETES = "kubernetes", "Kubernetes"


def validate_cluster_labels(value: object) -> None:
    """Model validator of `Cluster.labels` and `Job.cluster_selector` (rule K3): a flat
    object of short strings."""
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and 0 < len(k) <= 63 and len(v) <= 63
            for k, v in value.items()):
        raise ValidationError('Give labels as {"name": "value"}: strings of at most 63 '
                              "characters.")


class Cluster(models.Model):
    """A GPU cluster fairq schedules onto (docs/clusters.md, rules K1-K8): every enabled
    cluster's nodes are in one snapshot, one fair share and one plan; each job runs in
    exactly one of them. `backend`: how fairq reaches it - `kubernetes` with a kubeconfig
    file and context, or the pod's service account (`in_cluster`); `simulated` with
    `sim_nodes` (FAIRQ_SIM_NODES' grammar) for the demo and tests. `labels` (region, cost
    class, ...) are what a job's `cluster_selector` matches. `unreachable_since`: when the
    scheduler last started failing to read it (None = it answered the last cycle).
    `enabled` off drains it (rule K8): its jobs run on, nothing new goes there, and
    `drained_at` says when the last one had ended."""

    name = models.CharField(max_length=40, unique=True, validators=[slug_validator])
    backend = models.CharField(max_length=16, choices=ClusterBackendKind.choices,
                               default=ClusterBackendKind.SIMULATED)
    kubeconfig = models.CharField(max_length=500, blank=True, default="",
                                  help_text="Path of a kubeconfig file on the scheduler "
                                            "(empty with in_cluster or ~/.kube/config).")
    context = models.CharField(max_length=200, blank=True, default="",
                               help_text="The kubeconfig context (empty = its current one).")
    in_cluster = models.BooleanField(default=False, help_text=(
        "Use the scheduler pod's service account (the cluster fairq runs in)."))
    sim_nodes = models.CharField(max_length=500, blank=True, default="", help_text=(
        "Simulated clusters: the nodes, as FAIRQ_SIM_NODES (e.g. 4x8xh100,2x8xa100)."))
    enabled = models.BooleanField(default=True)
    labels = models.JSONField(default=dict, blank=True, validators=[validate_cluster_labels],
                              help_text='e.g. {"region": "eu-west", "cost": "cloud"}')
    # Rule K2: among clusters where a job fits, a lower cost rank goes first.
    cost_rank = models.IntegerField(default=0, help_text=(
        "Placement preference: among clusters where a job fits, the lowest rank is "
        "chosen first (e.g. 0 on-premises, 10 cloud)."))
    unreachable_since = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    # Rule K8: when the scheduler found this disabled cluster with no job left (None while
    # it is enabled, or disabled and still draining: its jobs run on, nothing new goes there).
    drained_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["cost_rank", "name"]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: Any, **kwargs: Any) -> None:
        # Rule K8: an enabled cluster is never drained - enabling one (the API, the admin,
        # any save) clears `drained_at`, so disabling it again drains it afresh.
        if self.enabled and self.drained_at is not None:
            self.drained_at = None
            if kwargs.get("update_fields") is not None:
                kwargs["update_fields"] = {*kwargs["update_fields"], "drained_at"}
        super().save(*args, **kwargs)


class NodePool(models.Model):
    """A pool of a cluster's nodes of one GPU type (rules K4, K6): the nodes that carry
    all of `node_labels` (besides the GPU type's own); `spot` pools are interruptible
    capacity, used by preemptible tiers unless a job opts in, at their own
    `price_per_gpu_hour` (None = the GPU type's price)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="pools")
    name = models.CharField(max_length=63, validators=[slug_validator])
    gpu_type = models.ForeignKey(GpuType, on_delete=models.PROTECT, related_name="pools")
    spot = models.BooleanField(default=False)
    node_labels = models.JSONField(default=dict, blank=True,
                                   validators=[validate_cluster_labels])
    price_per_gpu_hour = models.DecimalField(max_digits=12, decimal_places=4, null=True,
                                             blank=True)

    class Meta:
        ordering = ["cluster_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="one_pool_name_per_cluster"),
        ]

    def __str__(self) -> str:
        return f"{self.cluster_id}/{self.name}"


# A Tier's PriorityClass name must be one the API server takes (finding 11.6): a
# DNS-1123 subdomain (lower-case alphanumerics, '-' and '.'; the field's 100 characters
# are within its 253), never in the 'system-' namespace Kubernetes reserves.
priority_class_name_validators = [
    RegexValidator(
        r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z",
        "Use lower-case letters, digits, '-' and '.', starting and ending with a letter or "
        "digit (a Kubernetes PriorityClass name: DNS-1123 subdomain).",
    ),
    RegexValidator(r"^system-", "Names starting with 'system-' are reserved by Kubernetes.",
                   inverse_match=True),
]


class IdleAction(models.TextChoices):
    """A tier's answer to an idle job (rule U3)."""

    FLAG = "flag", "flag only"
    REQUEUE = "requeue", "stop and requeue"
    FAIL = "fail", "stop and fail"


# What a job accepting several GPU types does when its preferred type has room only by
# borrowing (docs/scheduling.md, "Several GPU types"): a tier's setting, a team's override.
FLAVOR_FALLBACK_CHOICES = [
    (FlavorFallback.BORROW.value, "borrow in a preferred type first"),
    (FlavorFallback.NEXT_TYPE.value, "try the next type's own quota first"),
]


class Tier(models.Model):
    slug = models.CharField(max_length=40, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    rank = models.IntegerField(unique=True, help_text="Higher ranks are scheduled first.")
    priority_class_name = models.CharField(max_length=100, unique=True,
                                           validators=priority_class_name_validators)
    priority_value = models.IntegerField(help_text="Value of the Kubernetes PriorityClass.")
    preemptible = models.BooleanField(default=True)
    min_runtime_seconds = models.PositiveIntegerField(
        default=0, help_text="A job of this tier is not preempted before it has run this long."
    )
    # Rule T1. False by default: a tier staff add is closed until they open it or grant
    # it. The migration that added the field kept existing preemptible tiers open.
    open_to_all_teams = models.BooleanField(
        default=False, db_default=False,
        help_text="Every team may submit jobs of this tier (rule T1); otherwise only the "
                  "teams granted it below.",
    )
    # Rules U1-U4 (docs/scheduling.md, "Idle GPUs"): a running job whose GPUs stay below
    # `idle_threshold_percent` SM activity for `idle_window_minutes` is flagged; with
    # `idle_action` requeue or fail it is reclaimed `idle_grace_minutes` later.
    idle_threshold_percent = models.FloatField(
        default=5.0, db_default=5.0,
        validators=[MinValueValidator(0.0), MaxValueValidator(100.0)],
        help_text="A running job whose GPUs' SM activity stays below this percentage for the "
                  "window is idle (rule U2); 0 turns the rule off for this tier.",
    )
    idle_window_minutes = models.PositiveIntegerField(
        default=30, db_default=30, validators=[MinValueValidator(1)],
        help_text="Minutes below the threshold before the job is flagged idle (rule U2).",
    )
    idle_action = models.CharField(
        max_length=16, choices=IdleAction.choices, default=IdleAction.FLAG,
        db_default=IdleAction.FLAG,
        help_text="What happens to an idle job once the grace period is over (rule U3): only "
                  "flagged, stopped and requeued as a new attempt, or failed with reason "
                  "'idle'.",
    )
    idle_grace_minutes = models.PositiveIntegerField(
        default=10, db_default=10,
        help_text="Minutes between the flag and the reclaim (rule U3).",
    )

    flavor_fallback = models.CharField(
        max_length=16, choices=FLAVOR_FALLBACK_CHOICES, default=FlavorFallback.BORROW.value,
        db_default=FlavorFallback.BORROW.value,
        help_text="A job accepting several GPU types, whose preferred type has room only by "
                  "borrowing beyond its team's quota: borrow there, or first try the next "
                  "type within quota (a team may override it).",
    )

    max_termination_grace_seconds = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="The longest termination grace period (seconds) a job of this tier may "
                  "ask for (its pods' terminationGracePeriodSeconds); empty: "
                  "FAIRQ_PREEMPTIBLE_MAX_TERMINATION_GRACE_SECONDS for a preemptible tier "
                  "(rule R10), no cap otherwise.",
    )

    # Graceful stop and owed claims (docs/scheduling.md, rules R9 and R11), per tier:
    # how eager its jobs are to preempt.
    preemption_lost_per_wait = models.FloatField(
        null=True, blank=True,
        help_text="Rule R9 for this tier's jobs: the most GPU-hours a preemption may lose "
                  "per GPU-hour the preemptor waited; empty: FAIRQ_PREEMPTION_LOST_PER_WAIT; "
                  "-1: no R9 check for this tier.",
    )
    owed_preempts_at_once = models.BooleanField(
        default=True, db_default=True,
        help_text="A job of this tier owed its GPUs (rule R11: within its team's quota) "
                  "preempts at once; off: it waits by the ordinary rules, R9 included.",
    )

    class Meta:
        ordering = ["-rank"]
        constraints = [
            models.CheckConstraint(
                condition=Q(idle_threshold_percent__gte=0) & Q(idle_threshold_percent__lte=100),
                name="tier_idle_threshold_0_100"),
            models.CheckConstraint(condition=Q(idle_window_minutes__gte=1),
                                   name="tier_idle_window_gte_1"),
            models.CheckConstraint(
                condition=Q(preemption_lost_per_wait__isnull=True)
                | Q(preemption_lost_per_wait=-1) | Q(preemption_lost_per_wait__gte=0),
                name="tier_lost_per_wait_gte_0_or_off"),
        ]

    def __str__(self) -> str:
        return self.slug

    def clean(self) -> None:
        """Rule R9's per-tier ratio: empty, -1 (off) or at least 0."""
        super().clean()
        ratio = self.preemption_lost_per_wait
        if ratio is not None and ratio != -1 and not ratio >= 0:
            raise ValidationError({"preemption_lost_per_wait": ValidationError(
                "At least 0, -1 for no R9 check, or empty for the global setting.",
                code="lost_per_wait")})


class TierGrant(models.Model):
    """Rule T1: `team` may submit jobs of `tier` although the tier is not open to all."""

    tier = models.ForeignKey(Tier, on_delete=models.CASCADE, related_name="grants")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="tier_grants")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tier__rank", "team__slug"]
        constraints = [
            models.UniqueConstraint(fields=["tier", "team"], name="one_grant_per_tier_team")
        ]

    def __str__(self) -> str:
        return f"{self.tier.slug} for {self.team.slug}"


class Quota(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="quotas")
    gpu_type = models.ForeignKey(GpuType, on_delete=models.CASCADE, related_name="quotas")
    nominal = models.PositiveIntegerField(default=0, help_text="GPUs guaranteed to the team.")
    borrowing_limit = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="GPUs the team may use beyond nominal while others leave them idle; "
        "empty = unlimited.",
    )
    lending_limit = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="GPUs of the unused nominal others may borrow; empty = all of it.",
    )

    class Meta:
        ordering = ["team__slug", "gpu_type__slug"]
        constraints = [
            models.UniqueConstraint(fields=["team", "gpu_type"], name="one_quota_per_team_gpu_type"),
            models.CheckConstraint(condition=Q(nominal__gte=0), name="quota_nominal_gte_0"),
            models.CheckConstraint(
                condition=Q(borrowing_limit__isnull=True) | Q(borrowing_limit__gte=0),
                name="quota_borrowing_gte_0",
            ),
            models.CheckConstraint(
                condition=Q(lending_limit__isnull=True) | Q(lending_limit__gte=0),
                name="quota_lending_gte_0",
            ),
            # Rule Q1: a team lends at most its nominal (empty = all of it).
            models.CheckConstraint(
                condition=Q(lending_limit__isnull=True) | Q(lending_limit__lte=F("nominal")),
                name="quota_lending_lte_nominal",
                violation_error_message="A quota cannot lend more than its nominal.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.team.slug}/{self.gpu_type.slug}: {self.nominal}"

    def clean(self) -> None:
        """Rule Q1 as a field error on `lending_limit` (the check constraint
        `quota_lending_lte_nominal` holds it in the database, for writes that skip this)."""
        super().clean()
        if (self.lending_limit is not None and self.nominal is not None
                and self.lending_limit > self.nominal):
            raise ValidationError({"lending_limit": ValidationError(
                f"Cannot lend more than the nominal {self.nominal}.", code="lending_above_nominal")})


JOB_STATUS_CHOICES = [(s.value, s.value.title()) for s in JobState]
STOP_SIGNAL_CHOICES = [(name, name) for name in STOP_SIGNALS]


class JobArray(models.Model):
    """An array job (`POST /jobs/bulk/`, `fairq submit -a N%M`): `count` members, each a
    Job with `array` and `array_index`; at most `max_running` of them hold GPUs at once
    (rule A8; NULL = no limit)."""

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="job_arrays")
    name = models.CharField(max_length=63)
    count = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    max_running = models.PositiveIntegerField(null=True, blank=True,
                                              validators=[MinValueValidator(1)])
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="job_arrays")
    created_at = models.DateTimeField()
    # Stored compactly (docs/scheduling.md "Arrays"): members 0..materialized-1
    # are Job rows; the rest exist only here until the cycle needs them
    # (services/arrays.py::arrays_top_up). `spec` is the template's Job columns by
    # attname (every member's but for its name, env index and array index); `events` the
    # array's own history ({at, kind, actor, reason, data}: "submitted N tasks", the
    # rest cancelled); `rest_cancelled_at`: the members never materialized were cancelled
    # then (they count as CANCELLED and get no row).
    spec = models.JSONField(default=dict, db_default={}, blank=True)
    materialized = models.PositiveIntegerField(default=0, db_default=0)
    rest_cancelled_at = models.DateTimeField(null=True, blank=True)
    events = models.JSONField(default=list, db_default=[], blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.CheckConstraint(condition=Q(count__gte=1), name="job_array_count_gte_1"),
            models.CheckConstraint(condition=Q(materialized__lte=models.F("count")),
                                   name="job_array_materialized_lte_count"),
            models.CheckConstraint(condition=Q(max_running__isnull=True) | Q(max_running__gte=1),
                                   name="job_array_max_running_gte_1"),
        ]
        # The cycle's top-up reads only the arrays with members not yet written
        # (services/arrays.py::arrays_top_up): a few rows, however many arrays ended.
        indexes = [models.Index(fields=["id"], name="job_array_unwritten_idx",
                                condition=Q(rest_cancelled_at__isnull=True,
                                            materialized__lt=models.F("count")))]

    def __str__(self) -> str:
        return f"array {self.pk} {self.name} ({self.count})"

    @property
    def unmaterialized(self) -> int:
        """Members with no Job row yet (0 once the rest was cancelled: they never get one)."""
        return 0 if self.rest_cancelled_at is not None else self.count - self.materialized

    @property
    def never_materialized(self) -> int:
        """Members that will never get a Job row: cancelled before they were needed."""
        return self.count - self.materialized if self.rest_cancelled_at is not None else 0


class Job(models.Model):

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="jobs")
    submitter = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="jobs"
    )
    name = models.CharField(max_length=63)
    image = models.CharField(max_length=512)
    command = models.JSONField(default=list, blank=True)
    args = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)
    # The GPU type of the current (or last) admitted attempt: the one the plan chose among
    # `gpu_types`, what usage, billing weight, prices, quotas and the pod's node selector
    # count; before the first admission the first accepted. `gpu_types`: every type the
    # job accepts, by slug, most preferred first, the same GPUs per replica on each
    # (docs/api.md, "Several GPU types"); [] = only `gpu_type`.
    gpu_type = models.ForeignKey(GpuType, on_delete=models.PROTECT, related_name="jobs")
    gpu_types = models.JSONField(default=list, db_default=[], blank=True)
    gpus_per_replica = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    replicas = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])
    # Shared GPUs: 0 = each replica asks `gpus_per_replica` whole devices; k >= 1 = each
    # replica asks k slices of ONE GPU of a time-sliced or MPS type (k < its
    # slices_per_gpu; gpus_per_replica is then 1): the fraction k / slices_per_gpu.
    # `gpu_slots` (rule H1): the GPU indexes on its nodes (placement) the plan packed it
    # on, replica after replica - one per replica for a fraction, each of its GPUs for
    # whole GPUs of a time-sliced or MPS type ([0, 1, 2, 3]: 2 replicas of 2 GPUs);
    # [] = another type, not admitted, or its pods run elsewhere than planned.
    gpu_slices = models.PositiveSmallIntegerField(default=0, db_default=0)
    gpu_slots = models.JSONField(default=list, db_default=[], blank=True)
    tier = models.ForeignKey(Tier, on_delete=models.PROTECT, related_name="jobs")
    max_runtime_seconds = models.PositiveIntegerField(null=True, blank=True)
    # Per replica, requests = limits (docs/api.md, "Resources"): the quantities as the
    # submitter wrote them (or the team's defaults), {"cpu": "4", "memory": "16Gi", ...},
    # for display and resubmit; the values the manifest and the rules use are the
    # normalised integers below (NULL: not set, the pod gets no such request).
    resources = models.JSONField(default=dict, blank=True)
    cpu_millicores = models.BigIntegerField(null=True, blank=True)
    memory_bytes = models.BigIntegerField(null=True, blank=True)
    ephemeral_storage_bytes = models.BigIntegerField(null=True, blank=True)
    # A memory-backed emptyDir at /dev/shm of this size ("" / NULL: none).
    shm_size = models.CharField(max_length=32, blank=True, default="")
    shm_size_bytes = models.BigIntegerField(null=True, blank=True)
    # Rule A7: the replicas in one domain of this topology level of the GPU type
    # ("" = no request); `required` waits for such a domain, `preferred` does not.
    topology_level = models.CharField(max_length=63, blank=True, default="")
    topology_mode = models.CharField(max_length=16, blank=True, default="",
                                     choices=[("required", "required"),
                                              ("preferred", "preferred")])
    # Storage, secrets and pod metadata (docs/api.md, "Volumes, secrets and metadata"),
    # normalised by queueing.validation.workload_check: references to PVCs and Secrets of
    # the team's namespace (never their values), the pull secret, the working directory,
    # the job's own labels and annotations (USER_LABEL_PREFIX on the pod) and the grace
    # period its pods get when stopped (NULL: FAIRQ_K8S_TERMINATION_GRACE_SECONDS).
    # db_default too: rows written by code that predates the fields (a rolling upgrade)
    # get the same empty values, not a NOT NULL violation.
    volumes = models.JSONField(default=list, db_default=[], blank=True)
    secrets = models.JSONField(default=list, db_default=[], blank=True)
    image_pull_secret = models.CharField(max_length=253, blank=True, default="", db_default="")
    working_dir = models.CharField(max_length=256, blank=True, default="", db_default="")
    labels = models.JSONField(default=dict, db_default={}, blank=True)
    annotations = models.JSONField(default=dict, db_default={}, blank=True)
    termination_grace_seconds = models.PositiveIntegerField(null=True, blank=True)
    # Graceful stop (docs/api.md, "Checkpoints and graceful stop"): the signal its
    # program gets first when stopped (then, after the grace, SIGKILL), and how often it
    # says it checkpoints (NULL: not declared). `checkpointed_at`: the newest checkpoint
    # the current attempt reported (NULL: none), kept on the row so the cycle's snapshot
    # reads it with the job (RunningJob.checkpointed_at) and a report re-reads one row.
    stop_signal = models.CharField(max_length=8, choices=STOP_SIGNAL_CHOICES,
                                   default="SIGTERM", db_default="SIGTERM")
    checkpoint_interval_seconds = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(MIN_CHECKPOINT_INTERVAL_SECONDS)])
    checkpointed_at = models.DateTimeField(null=True, blank=True)
    # Rules D1-D3: [{"type": "after_ok" | "after_any" | "after_not_ok", "job": id} or
    # {..., "array": id}], jobs and arrays of the same team, all to be met.
    dependencies = models.JSONField(default=list, db_default=[], blank=True)
    array = models.ForeignKey(JobArray, null=True, blank=True, on_delete=models.PROTECT,
                              related_name="members")
    array_index = models.PositiveIntegerField(null=True, blank=True)
    # Where a signed POST goes on each state change of this job (docs/webhooks.md): an
    # URL under one of the team's `allowed_notify_url_prefixes`, checked at submit.
    notify_url = models.CharField(max_length=2000, blank=True, default="", db_default="")
    status = models.CharField(max_length=16, choices=JOB_STATUS_CHOICES, default=JobState.QUEUED.value)
    attempt = models.PositiveIntegerField(default=1)
    # NULL, not "", means "no key": the partial unique constraint skips NULLs.
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001

    created_at = models.DateTimeField(db_index=True)  # submit time; kept across requeues
    updated_at = models.DateTimeField(auto_now=True)
    admitted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)  # of the current attempt
    finished_at = models.DateTimeField(null=True, blank=True)

    # Rule K3: a job may pin one cluster, or ask for clusters carrying labels; rule K4:
    # a job of a non-preemptible tier runs on spot nodes only when it opts in.
    requested_cluster = models.ForeignKey(Cluster, null=True, blank=True,
                                          on_delete=models.PROTECT, related_name="pinned_jobs")
    cluster_selector = models.JSONField(default=dict, db_default={}, blank=True,
                                        validators=[validate_cluster_labels])
    allow_spot = models.BooleanField(default=False, db_default=False)

    # Where the current attempt runs and what the cluster said.
    cluster = models.ForeignKey(Cluster, null=True, blank=True, on_delete=models.PROTECT,
                                related_name="jobs")
    # Rules K4, C4: the current attempt runs on spot nodes (its cost is the pool's price).
    on_spot = models.BooleanField(default=False, db_default=False)
    # Rule C4: the `NodePool`s of the current attempt's spot nodes, {pool name: GPUs}
    # ("" = nodes in no pool), recorded when the plan admits it and when the cluster
    # binds or moves its pods: it is charged at their GPU-weighted price.
    spot_pools = models.JSONField(default=dict, db_default={}, blank=True)
    placement = models.JSONField(default=list, blank=True)
    submitted_to_backend_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    message = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["team", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="one_job_per_team_idempotency_key",
            ),
            models.UniqueConstraint(fields=["array", "array_index"],
                                    condition=Q(array__isnull=False),
                                    name="one_job_per_array_index"),
            models.CheckConstraint(condition=Q(gpus_per_replica__gte=1), name="job_gpus_gte_1"),
            models.CheckConstraint(condition=Q(replicas__gte=1), name="job_replicas_gte_1"),
            *[models.CheckConstraint(condition=Q(**{f"{f}__isnull": True}) | Q(**{f"{f}__gte": 1}),
                                     name=f"job_{f}_gte_1")
              for f in ("cpu_millicores", "memory_bytes", "ephemeral_storage_bytes",
                        "shm_size_bytes")],
        ]
        indexes = [
            models.Index(fields=["status", "tier", "created_at"], name="job_queue_idx"),
            # The pages' reads of a team's jobs, newest first, all or by status
            # (migration 0034; docs/performance.md, "pages with 1,000,000 jobs").
            models.Index(fields=["team", "id"], name="job_team_id_idx"),
            models.Index(fields=["team", "status", "id"], name="job_team_status_id_idx"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.name}"

    @property
    def topology(self) -> dict[str, str] | None:
        """The topology request as the API writes it (rule A7): {"level", "mode"}, or
        None."""
        if not self.topology_level:
            return None
        return {"level": self.topology_level, "mode": self.topology_mode or "required"}

    @property
    def state(self) -> JobState:
        return JobState(self.status)

    @property
    def accepted_gpu_types(self) -> list[str]:
        """Every GPU type it accepts, most preferred first (never empty)."""
        return [str(t) for t in self.gpu_types] if self.gpu_types else [self.gpu_type.slug]

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_replica * self.replicas

    @property
    def units_per_replica(self) -> int:
        """Per replica, the policy's units of its GPU type: its slices when a fraction,
        else its devices x the type's `units_per_device`."""
        if self.gpu_slices:
            return self.gpu_slices
        return self.gpus_per_replica * self.gpu_type.units_per_device

    @property
    def gpu_share(self) -> float:
        """GPU-equivalents it holds while running (quotas shown, fair share, costs):
        units x replicas / the type's slices_per_gpu; a whole-GPU job's total_gpus."""
        t = self.gpu_type
        return self.units_per_replica * self.replicas / t.slices_per_gpu

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def backend_name(self) -> str:
        """The deterministic cluster name of the current attempt (`workload_name`)."""
        return workload_name(self.pk, self.attempt)

    def runtime_seconds(self, now: datetime) -> float | None:
        if self.started_at is None:
            return None
        end = self.finished_at or now
        return max(0.0, (end - self.started_at).total_seconds())


class JobLog(models.Model):
    """The tail of one replica's log in one attempt (services/logs.py): web processes read
    only this. While the attempt runs, `text` is the worker's last copy (bounded by
    FAIRQ_LOG_ARCHIVE_LINES, FAIRQ_LOG_ARCHIVE_MAX_BYTES); once it ended, the tail
    (FAIRQ_LOG_ARCHIVE_BYTES) is kept in the "fairq-logs" storage under `stored` and
    `text` is emptied. Kept after the pod is gone."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="logs")
    attempt = models.PositiveIntegerField()
    replica = models.PositiveIntegerField(default=0)
    text = models.TextField(blank=True, default="")
    fetched_at = models.DateTimeField()
    # Set once the attempt ended and its tail was kept: never read from the cluster again.
    final = models.BooleanField(default=False)
    # The archive's name in the "fairq-logs" storage ("" until final) and its size.
    stored = models.CharField(max_length=300, blank=True, default="")
    size = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "attempt", "replica"],
                                               name="one_log_per_job_attempt_replica")]

    def __str__(self) -> str:
        return f"{self.job_id}/{self.attempt}/{self.replica} ({self.size or len(self.text)} bytes)"


class JobEvent(models.Model):
    """One thing that happened to a job: a transition, a preemption, a wait reason."""

    class Kind(models.TextChoices):
        """What happened; the stored values are the API's `kind` and the metrics' labels."""

        TRANSITION = "transition"  # a move along rule S1's edges (from_status -> to_status)
        PREEMPTED = "preempted"  # on the victim, one per preemption (rule R5 counts these)
        PREEMPTING = "preempting"  # on the preemptor: "preempted N jobs"
        CHARGED = "charged"  # pods ran after fairq had decided: their run time is billed
        WAITING = "waiting"  # why the cluster holds an admitted job back (when it changes)
        MOVED = "moved"  # a running job's pods moved to other nodes
        POD_RESTARTED = "pod_restarted"  # a pod replaced or a container restarted
        SUBMIT_ERROR = "submit_error"  # the cluster refused the workload (one per distinct error)
        IDLE = "idle"  # rules U2-U4: flagged idle, reclaimed, or busy again
        LOGS_PRUNED = "logs_pruned"  # an attempt's kept logs deleted (FAIRQ_LOG_RETENTION_DAYS)
        DEPENDENCIES = "dependencies"  # rule D3: its dependencies were changed
        CLUSTER_UNREACHABLE = "cluster_unreachable"  # rule K5: its cluster cannot be read
        SPOT_RECLAIMED = "spot_reclaimed"  # rule K6: its spot node was reclaimed (requeued)
        CHECKPOINT = "checkpoint"  # a checkpoint in a preempted attempt's grace saved its work
        SESSION = "session"  # a notebook session was started (docs/sessions.md)

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(db_index=True)
    kind = models.CharField(max_length=40, choices=Kind.choices)
    from_status = models.CharField(max_length=16, blank=True, default="")
    to_status = models.CharField(max_length=16, blank=True, default="")
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    actor_label = models.CharField(max_length=100, default="", blank=True)  # "scheduler", ...
    reason = models.CharField(max_length=500, default="", blank=True)
    attempt = models.PositiveIntegerField(default=1)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "id"]
        # The dashboard's recent preemptions of a team (migration 0034): the few
        # "preempted" events of the last day, not every event of it.
        indexes = [models.Index(fields=["at"], name="jobevent_preempted_at_idx",
                                condition=Q(kind="preempted"))]

    def __str__(self) -> str:
        return f"{self.job_id}: {self.from_status}->{self.to_status} {self.reason}"


class Checkpoint(models.Model):
    """A checkpoint an attempt of a job reported (`POST /api/v1/jobs/<id>/checkpoints/`
    with its attempt's token): when (`created_at`, the server's clock), and what the job
    said of it - its step, progress in 0..1 and where it wrote it (all optional). The
    newest of the current attempt is also `Job.checkpointed_at`."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="checkpoints")
    attempt = models.PositiveIntegerField()
    created_at = models.DateTimeField()
    step = models.BigIntegerField(null=True, blank=True)
    progress = models.FloatField(null=True, blank=True,
                                 validators=[MinValueValidator(0.0), MaxValueValidator(1.0)])
    path = models.CharField(max_length=1024, blank=True, default="")

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(progress__isnull=True) | (Q(progress__gte=0) & Q(progress__lte=1)),
                name="checkpoint_progress_0_1"),
        ]
        # "The newest of a job" (and of one attempt of it): an index scan from its end.
        indexes = [models.Index(fields=["job", "attempt", "created_at"],
                                name="checkpoint_job_attempt_at_idx"),
                   models.Index(fields=["job", "created_at"], name="checkpoint_job_at_idx")]

    def __str__(self) -> str:
        return f"{self.job_id}/{self.attempt} at {self.created_at:%Y-%m-%d %H:%M:%S}"


class UsageRecord(models.Model):
    """GPU time of one attempt interval: the raw history fair-share is computed from."""

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="usage_records")
    gpu_type = models.ForeignKey(GpuType, on_delete=models.PROTECT, related_name="usage_records")
    job = models.ForeignKey(
        Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="usage_records"
    )
    attempt = models.PositiveIntegerField(null=True, blank=True)
    # GPU-equivalents the attempt held (`Job.gpu_share`): a fraction of a shared GPU its
    # share (0.25), so its GPU-hours are exact (docs/scheduling.md, "Shared GPUs").
    gpus = models.FloatField(validators=[MinValueValidator(0.0)])
    billing_weight = models.FloatField(default=1.0)  # of the GPU type when recorded
    start = models.DateTimeField()
    end = models.DateTimeField()
    gpu_seconds = models.FloatField()
    source = models.CharField(max_length=20, default="scheduler")  # scheduler | import
    # Rule C4: where the attempt ran, and a spot attempt's own price per GPU-hour (its
    # pool's when charged, frozen; None: rule C1's price list of the GPU type).
    cluster = models.ForeignKey(Cluster, null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="usage_records")
    spot = models.BooleanField(default=False, db_default=False)
    price_per_gpu_hour = models.DecimalField(max_digits=12, decimal_places=4, null=True,
                                             blank=True)
    # A preempted attempt's lost work (docs/api.md, "Checkpoints and graceful stop"):
    # its GPUs x (the preemption - the later of its start and its newest checkpoint
    # reported by the end of its grace), in GPU-hours; NULL: it was not preempted.
    # Lowered when a checkpoint arrives during the grace (services/checkpoints.py).
    lost_gpu_hours = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["start", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "attempt"], condition=Q(job__isnull=False),
                name="one_usage_record_per_attempt",
            ),
            models.CheckConstraint(condition=Q(end__gte=models.F("start")), name="usage_end_gte_start"),
            models.CheckConstraint(condition=Q(gpus__gte=0), name="usage_gpus_gte_0"),
        ]
        indexes = [models.Index(fields=["team", "start"], name="usage_team_start_idx"),
                   # The reports' records priced apart (rule C4: spot, or a price of
                   # their own), a few among every record (migration 0034).
                   models.Index(fields=["start"], name="usage_priced_start_idx",
                                condition=Q(spot=True) | Q(price_per_gpu_hour__isnull=False))]

    def __str__(self) -> str:
        return f"{self.team_id}/{self.gpu_type_id}: {self.gpus:g} GPUs {self.start:%Y-%m-%d %H:%M}+"


class FairShareAccumulator(models.Model):
    """A team's decayed usage (weighted GPU-hours) as of `as_of` (rule F1).

    Updated when usage is recorded; decayed analytically when read, so standings never
    scan the usage history.
    """

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="fairshare")
    value = models.FloatField(default=0.0)
    as_of = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.team_id}: {self.value:.3f} GPU-h as of {self.as_of:%Y-%m-%d %H:%M}"


class FairShareSnapshot(models.Model):
    """The standings at one instant, for charts of usage over time.

    One row per snapshot (not per team): `standings` maps each team slug to
    [usage, normalized usage U, share S, factor F], rounded to 6 significant digits.
    """

    at = models.DateTimeField(unique=True)
    half_life_hours = models.FloatField()
    standings = models.JSONField(default=dict)

    class Meta:
        ordering = ["at"]

    def __str__(self) -> str:
        return f"standings at {self.at:%Y-%m-%d %H:%M}"


# An attempt's SM-activity histogram (rule U5): one bin per whole percent, 0..100.
UTIL_HIST_BINS = 101


class AttemptUtilization(models.Model):
    """The GPU utilization of one job attempt (docs/scheduling.md, "Idle GPUs"; written
    by services/utilization.py once per minute of readings). Readers (accounting, cost
    reports) use the summary columns: `sm_mean` and `sm_p95` (SM activity in percent,
    averaged over the attempt's GPUs each minute), `mem_mean_bytes` and `mem_max_bytes`
    (frame buffer used, summed over its GPUs), over `samples` minutes from `first_at` to
    `last_at`. The per-minute series is `UtilizationSample`."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="utilization")
    attempt = models.PositiveIntegerField()
    first_at = models.DateTimeField()
    last_at = models.DateTimeField()  # the minute of the last sample
    samples = models.PositiveIntegerField(default=0)
    sm_sum = models.FloatField(default=0.0)
    mem_sum = models.FloatField(default=0.0)
    # Minutes per whole SM-activity percent seen ({"37": 5, ...}; 0..100): the p95
    # without reading the series.
    sm_hist = models.JSONField(default=dict, blank=True)
    sm_last = models.FloatField(default=0.0)
    sm_mean = models.FloatField(default=0.0)
    sm_p95 = models.FloatField(default=0.0)
    mem_last_bytes = models.BigIntegerField(default=0)
    mem_mean_bytes = models.BigIntegerField(default=0)
    mem_max_bytes = models.BigIntegerField(default=0)
    # Rule U1: the first minute of the current run below the tier's threshold (None: the
    # last sample was not below it). Rule U2: when the job was flagged idle (None: not).
    below_since = models.DateTimeField(null=True, blank=True)
    idle_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job_id", "attempt"]
        constraints = [
            models.UniqueConstraint(fields=["job", "attempt"], name="one_utilization_per_attempt"),
        ]

    def __str__(self) -> str:
        return f"{self.job_id}/{self.attempt}: {self.sm_mean:.0f}% over {self.samples} min"


class UtilizationSample(models.Model):
    """One minute of one attempt's GPU readings (SM activity in percent, the mean over its
    GPUs; frame buffer bytes, the sum): the job page's chart. Kept
    FAIRQ_UTIL_RETENTION_DAYS, then archived and deleted (`history_prune`)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="utilization_samples")
    attempt = models.PositiveIntegerField()
    minute = models.DateTimeField(db_index=True)
    sm = models.FloatField()
    mem_bytes = models.BigIntegerField()

    class Meta:
        ordering = ["job_id", "attempt", "minute"]
        constraints = [
            models.UniqueConstraint(fields=["job", "attempt", "minute"],
                                    name="one_utilization_sample_per_minute"),
        ]

    def __str__(self) -> str:
        return f"{self.job_id}/{self.attempt} {self.minute:%H:%M}: {self.sm:.0f}%"


class GpuPrice(models.Model):
    """What one GPU of a type costs per hour from `effective_from` (a UTC date) until the
    type's next price (docs/scheduling.md, rule C1): a change never reprices the months
    before it. The currency is the FAIRQ_CURRENCY setting."""

    gpu_type = models.ForeignKey(GpuType, on_delete=models.CASCADE, related_name="prices")
    price_per_gpu_hour = models.DecimalField(max_digits=12, decimal_places=4)
    effective_from = models.DateField(help_text="The first UTC day at this price.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["gpu_type_id", "effective_from"]
        constraints = [
            models.UniqueConstraint(fields=["gpu_type", "effective_from"],
                                    name="one_gpu_price_per_type_and_day"),
            models.CheckConstraint(condition=Q(price_per_gpu_hour__gte=0),
                                   name="gpu_price_gte_0"),
        ]

    def __str__(self) -> str:
        return f"{self.gpu_type_id}: {self.price_per_gpu_hour}/GPU-hour from {self.effective_from}"


class BudgetPolicy(models.TextChoices):
    NONE = "none", "warn only"
    DOWNGRADE = "downgrade", "new jobs drop to the lowest tier (rule B3)"


class TeamBudget(models.Model):
    """A team's monthly GPU budget in FAIRQ_CURRENCY (rules B1-B3): warnings at 80% and
    100% of the calendar month's (UTC) cost, and optionally the downgrade policy."""

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="budget")
    monthly_amount = models.DecimalField(max_digits=14, decimal_places=2)
    policy = models.CharField(max_length=16, choices=BudgetPolicy.choices,
                              default=BudgetPolicy.NONE)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(monthly_amount__gt=0),
                                   name="team_budget_amount_gt_0"),
        ]

    def __str__(self) -> str:
        return f"{self.team_id}: {self.monthly_amount}/month ({self.policy})"


class BudgetWarning(models.Model):
    """A budget warning given (rule B2): once per team, month and level."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="budget_warnings")
    month = models.DateField(help_text="The first day of the UTC month.")
    level = models.PositiveSmallIntegerField(help_text="Percent of the budget: 80 or 100.")
    at = models.DateTimeField()
    cost = models.DecimalField(max_digits=14, decimal_places=2)
    budget = models.DecimalField(max_digits=14, decimal_places=2)

    class Meta:
        ordering = ["month", "team_id", "level"]
        constraints = [
            models.UniqueConstraint(fields=["team", "month", "level"],
                                    name="one_budget_warning_per_level_and_month"),
        ]

    def __str__(self) -> str:
        return f"{self.team_id} {self.month:%Y-%m}: {self.level}%"


class UsageDay(models.Model):
    """GPU-hours of charged attempts per UTC day, team and GPU type (the reports page's
    roll-up; docs/dashboard.md, "Reports"): added by `services.reports.usage_days_roll_up`
    from the usage records after `UsageRollup.last_record_id`, never priced (a day has one
    price, rule C1, applied when read)."""

    day = models.DateField()
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="usage_days")
    gpu_type = models.ForeignKey(GpuType, on_delete=models.CASCADE, related_name="usage_days")
    allocated_gpu_hours = models.FloatField(default=0.0)
    used_gpu_hours = models.FloatField(default=0.0)
    idle_gpu_hours = models.FloatField(default=0.0)
    preempted_gpu_hours = models.FloatField(default=0.0)
    # Of the preempted attempts ended that day, the work lost (UsageRecord.lost_gpu_hours).
    lost_gpu_hours = models.FloatField(default=0.0, db_default=0.0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["day", "team", "gpu_type"],
                                    name="one_usage_day_per_team_and_type"),
        ]
        indexes = [models.Index(fields=["team", "day"], name="usage_day_team_day_idx")]

    def __str__(self) -> str:
        return f"{self.day} {self.team_id}/{self.gpu_type_id}: {self.allocated_gpu_hours:.1f} GPU-h"


class UsageRollup(models.Model):
    """The one row saying which usage records `UsageDay` holds: ids up to
    `last_record_id` (records are only ever added, with growing ids)."""

    last_record_id = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"usage days up to record {self.last_record_id}"



class UsagePruned(models.Model):
    """A team's usage records archived and deleted by `history_prune` (docs/deployment.md,
    "History retention"), as rule F1 needs them: their decayed weighted GPU-hours `value`
    as of `as_of` (every one of them ended by then), so the recompute from the raw
    records (`raw_decayed_usage`) adds this instead of the records and stays exact. Also
    how many, their GPU-seconds and the first one's start (the reports' first day)."""

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="usage_pruned")
    value = models.FloatField(default=0.0)
    as_of = models.DateTimeField()
    records = models.BigIntegerField(default=0)
    gpu_seconds = models.FloatField(default=0.0)
    first_start = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return (f"{self.team_id}: {self.records} records pruned, {self.value:.3f} GPU-h "
                f"as of {self.as_of:%Y-%m-%d}")


class HistoryPrune(models.Model):
    """One run of `history_prune` (docs/deployment.md, "History retention"): the
    retentions it applied, and per table the rows archived and deleted and the archive
    files written; `error` when it stopped early (a re-run finishes it)."""

    started_at = models.DateTimeField(db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    actor_label = models.CharField(max_length=100, default="", blank=True)  # "beat", ...
    retention = models.JSONField(default=dict, blank=True)  # setting -> days
    tables = models.JSONField(default=dict, blank=True)  # table -> {rows, deleted, files}
    error = models.CharField(max_length=500, default="", blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]

    def __str__(self) -> str:
        rows = sum(int(t.get("deleted", 0)) for t in self.tables.values())
        return f"history prune at {self.started_at:%Y-%m-%d %H:%M}: {rows} rows deleted"

# --- webhooks (docs/webhooks.md) -----------------------------------------------------

# The Standard Webhooks `type` of each move to a job state: "job.running", ...
WEBHOOK_EVENT_TYPES: tuple[str, ...] = tuple(f"job.{s.value.lower()}" for s in JobState)


def validate_webhook_url(value: object) -> None:
    """Model validator of a webhook URL (`validation.webhook_url_problem`)."""
    problem = webhook_url_problem(value)
    if problem:
        raise ValidationError(problem)


def validate_webhook_event_types(value: object) -> None:
    """An endpoint's event types: a list of WEBHOOK_EVENT_TYPES (empty: every one)."""
    if not isinstance(value, list) or any(t not in WEBHOOK_EVENT_TYPES for t in value):
        raise ValidationError(f"A list of: {', '.join(WEBHOOK_EVENT_TYPES)} (empty: every one).")


class WebhookEndpoint(models.Model):
    """A URL a team admin registered: a signed POST (Standard Webhooks) on each state
    change of the team's jobs whose kind it takes. The signing secret is shown once, in
    the answer that created or rotated it, and kept here, encrypted (queueing/sealing.py),
    because signing needs it."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="webhooks")
    url = models.CharField(max_length=2000, validators=[validate_webhook_url])
    description = models.CharField(max_length=200, blank=True, default="")
    enabled = models.BooleanField(default=True)
    # Event types it takes ("job.running", ...); empty: every one.
    event_types = models.JSONField(default=list, blank=True,
                                   validators=[validate_webhook_event_types])
    secret = models.CharField(max_length=500)  # encrypted (queueing/sealing.py)
    secret_rotated_at = models.DateTimeField()
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["team_id", "id"]

    def __str__(self) -> str:
        return f"{self.team_id}: {self.url[:150]}"

    def takes(self, event_type: str) -> bool:
        return self.enabled and (not self.event_types or event_type in self.event_types)


class TeamNotifySecret(models.Model):
    """The secret that signs the POSTs to jobs' own `notify_url` of one team (shown once,
    when a team admin creates or rotates it)."""

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="notify_secret")
    secret = models.CharField(max_length=500)  # encrypted (queueing/sealing.py)
    rotated_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"notify secret of {self.team_id}"


class WebhookDelivery(models.Model):
    """One message (one `webhook-id`, one payload) to one URL: a registered endpoint or a
    job's `notify_url`. Tried until a 2xx answer or FAIRQ_WEBHOOK_RETRY_SECONDS runs out;
    each try is a WebhookAttempt."""

    class Status(models.TextChoices):
        PENDING = "pending"  # waiting for its next try (`next_attempt_at`)
        SUCCEEDED = "succeeded"
        FAILED = "failed"  # every try failed, or the URL is refused (no more tries)

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="webhook_deliveries")
    endpoint = models.ForeignKey(WebhookEndpoint, null=True, blank=True,
                                 on_delete=models.CASCADE, related_name="deliveries")
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.SET_NULL,
                            related_name="webhook_deliveries")
    event = models.ForeignKey(JobEvent, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="webhook_deliveries")
    url = models.CharField(max_length=2000)
    message_id = models.CharField(max_length=64, unique=True)
    event_type = models.CharField(max_length=40)
    payload = models.JSONField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True, db_index=True)
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "webhook deliveries"
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(fields=["endpoint", "event"],
                                    condition=Q(endpoint__isnull=False, event__isnull=False),
                                    name="one_webhook_delivery_per_endpoint_event"),
            models.UniqueConstraint(fields=["job", "event"],
                                    condition=Q(endpoint__isnull=True, event__isnull=False),
                                    name="one_notify_delivery_per_event"),
        ]
        indexes = [models.Index(fields=["status", "next_attempt_at"],
                                name="webhook_delivery_due_idx")]

    def __str__(self) -> str:
        return f"{self.message_id} {self.event_type} -> {self.url[:100]} ({self.status})"


class WebhookAttempt(models.Model):
    """One POST of a delivery: what came back (status code, the start of the body) or
    what went wrong, how long it took, and when the next try is due (None: no more)."""

    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE,
                                 related_name="attempt_log")
    number = models.PositiveIntegerField()
    at = models.DateTimeField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    response_excerpt = models.CharField(max_length=500, blank=True, default="")
    error = models.CharField(max_length=500, blank=True, default="")
    duration_ms = models.PositiveIntegerField(default=0)
    next_retry_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["delivery_id", "number"]
        constraints = [models.UniqueConstraint(fields=["delivery", "number"],
                                               name="one_webhook_attempt_per_number")]

    def __str__(self) -> str:
        return f"{self.delivery_id} #{self.number}: {self.status_code or self.error[:40]}"


class NotebookSession(models.Model):
    """An interactive notebook session (docs/sessions.md): a Job of the `interactive`
    tier running a JupyterLab server, plus what fairq knows of the server. It shares its
    job's id (the primary key), so `/sessions/<job id>/lab/` names both. The server's
    token is never stored: `services.sessions.notebook_token` derives it from the job id.
    Time limit: the job's `max_runtime_seconds`."""

    job = models.OneToOneField(Job, primary_key=True, on_delete=models.CASCADE,
                               related_name="notebook")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL,
                              related_name="notebook_sessions")
    # Rules N1-N4: idle this long (no kernel activity and GPUs under the tier's
    # threshold) -> stopped; warned `warn_lead_minutes` before.
    idle_limit_minutes = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    warn_lead_minutes = models.PositiveIntegerField(default=10)
    # Where the server listens: the pod's address as its backend reports it ("" = none
    # yet), the port fixed at start; the path it serves under (its base_url).
    host = models.CharField(max_length=255, blank=True, default="")
    host_attempt = models.PositiveIntegerField(default=0)  # the attempt `host` is of
    port = models.PositiveIntegerField(default=8888)
    url_path = models.CharField(max_length=200)
    root_dir = models.CharField(max_length=256, blank=True, default="")
    created_at = models.DateTimeField()
    # What the last check read (rule N1): the server's last activity and when the
    # session became idle by both measures (None: busy, or not read yet).
    last_checked_at = models.DateTimeField(null=True, blank=True)
    last_activity_at = models.DateTimeField(null=True, blank=True)
    gpu_idle_since = models.DateTimeField(null=True, blank=True)
    idle_since = models.DateTimeField(null=True, blank=True)
    check_error = models.CharField(max_length=300, blank=True, default="")
    warned_at = models.DateTimeField(null=True, blank=True)
    culled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-job_id"]
        constraints = [
            models.CheckConstraint(condition=Q(idle_limit_minutes__gte=1),
                                   name="session_idle_limit_gte_1"),
        ]

    def __str__(self) -> str:
        return f"session {self.job_id}"

    def idle_minutes(self, now: datetime) -> float:
        """Minutes the session has been idle by rule N1 (0 while busy)."""
        if self.idle_since is None:
            return 0.0
        return max(0.0, (now - self.idle_since).total_seconds() / 60)


class Reservation(models.Model):
    """GPUs booked ahead (docs/reservations.md; rules in docs/scheduling.md, "Booked
    GPUs"): `gpus` units of `gpu_type` for `team` from `starts_at` to `ends_at`, once
    or repeated by `recurrence` (an RFC 5545 RRULE, e.g. "FREQ=WEEKLY;COUNT=12"; ""
    = once) at the same wall-clock time in `timezone`. The admission pass sees its
    occurrences as `policy.bookings.Booking`s."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="reservations")
    gpu_type = models.ForeignKey(GpuType, on_delete=models.PROTECT, related_name="reservations")
    gpus = models.PositiveIntegerField(
        validators=[MinValueValidator(1)],
        help_text="Units of the GPU type booked (slices on a time-sliced type).")
    name = models.CharField(max_length=200, blank=True, default="")
    starts_at = models.DateTimeField(help_text="The first window's start.")
    ends_at = models.DateTimeField(help_text="The first window's end.")
    recurrence = models.CharField(
        max_length=300, blank=True, default="",
        help_text='An RFC 5545 RRULE, e.g. "FREQ=WEEKLY;COUNT=12"; empty = once.')
    timezone = models.CharField(
        max_length=64, default="UTC",
        help_text="The IANA time zone a recurring window keeps its wall-clock time in.")
    # Unused booked GPUs may run other teams' preemptible jobs, taken back at once when
    # the team's jobs need them.
    lend_unused = models.BooleanField(default=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["starts_at", "id"]
        indexes = [models.Index(fields=["gpu_type", "cancelled_at"], name="reservation_type_live")]
        constraints = [
            models.CheckConstraint(condition=Q(gpus__gte=1), name="reservation_gpus_gte_1"),
            models.CheckConstraint(condition=Q(ends_at__gt=F("starts_at")),
                                   name="reservation_ends_after_start",
                                   violation_error_message="A window must end after it starts."),
        ]

    def __str__(self) -> str:
        return f"{self.team.slug}: {self.gpus} {self.gpu_type.slug} from {self.starts_at:%Y-%m-%d %H:%M}"
