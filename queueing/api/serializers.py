"""Request validation and response shapes of API v1. No state changes here."""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import ErrorDetail
from rest_framework.fields import SkipField
from rest_framework.settings import api_settings

from queueing import validation as v
from queueing.models import Job, JobEvent
from queueing.policy.dependencies import MAX_DEPENDENCIES, DependencyKind
from queueing.selectors.attempts import job_attempts
from queueing.selectors.checkpoints import newest_checkpoint
from queueing.selectors.clusters import cluster_name
from queueing.selectors.utilization import idle_since, job_utilization

from .fields import GpusField
from .strict import StrictFieldsMixin


def _quantity(help_text: str) -> serializers.CharField:
    return serializers.CharField(max_length=v.MAX_QUANTITY_LEN, required=False,
                                 help_text=help_text)


# Shapes only (strings of at most 32 characters): whether each is a quantity, and the
# team's defaults and maxima, are `job_input_build`'s.
class ResourcesSerializer(StrictFieldsMixin, serializers.Serializer[Any]):
    """Per replica, requests = limits (Guaranteed QoS), as Kubernetes quantities; one not
    given takes the team's default, if it has one."""

    cpu = _quantity('CPUs: "4", "500m", "0.5".')
    memory = _quantity('Memory: "16Gi", "500M"; not given: the team default, else '
                       "FAIRQ_DEFAULT_MEMORY_PER_GPU per GPU (every pod has a memory limit).")
    ephemeral_storage = _quantity('Ephemeral (node-local) storage: "50Gi".')


class TopologySerializer(StrictFieldsMixin, serializers.Serializer[Any]):
    """Rule A7 (docs/scheduling.md): pack the replicas into one domain of a topology level
    of the job's GPU type."""

    level = serializers.CharField(max_length=63, help_text='A level of the GPU type, e.g. "rack".')
    mode = serializers.ChoiceField(
        choices=list(v.TOPOLOGY_MODES), default="required",
        help_text="required: all replicas in one domain, or wait; preferred: as few "
                  "domains as there is room for.")
# Shapes only (types, lengths, no unknown key at any depth): names, paths, allowlists and
# sizes are `validation.workload_check`'s, called by `job_input_build`.
class EmptyDirSerializer(StrictFieldsMixin, serializers.Serializer[Any]):
    """Node-local scratch (an emptyDir on the node's disk), gone with the pod."""

    size_limit = serializers.CharField(
        max_length=v.MAX_QUANTITY_LEN,
        help_text='The most it may hold, a quantity: "100Gi" (at most FAIRQ_MAX_SCRATCH_BYTES).')


class VolumeSerializer(StrictFieldsMixin, serializers.Serializer[Any]):
    """A volume mounted in every replica: exactly one of `pvc` and `empty_dir`."""

    name = serializers.CharField(max_length=63, help_text="A DNS-1123 label, unique in the job.")
    pvc = serializers.CharField(
        max_length=v.MAX_DNS_SUBDOMAIN_LEN, required=False,
        help_text="A PersistentVolumeClaim of the team's namespace, in the team's "
                  "allowed_pvcs (its name alone: never \"namespace/name\").")
    empty_dir = EmptyDirSerializer(required=False)
    mount_path = serializers.CharField(
        max_length=v.MAX_PATH_LEN, trim_whitespace=False,
        help_text="Absolute and normalised; not /, not at, over or under another mount, "
                  f"nor {', '.join(v.FORBIDDEN_MOUNTS)}.")
    read_only = serializers.BooleanField(  # type: ignore[assignment] # Field.read_only, not ours
        required=False, help_text="Mount the PVC read-only (pvc only).")


class SecretRefSerializer(StrictFieldsMixin, serializers.Serializer[Any]):
    """A Secret of the team's namespace (in its allowed_secrets), by reference only: one
    key as an environment variable ({secret, key, env}) or every key as a read-only file
    under `mount_path` ({secret, mount_path})."""

    secret = serializers.CharField(max_length=v.MAX_DNS_SUBDOMAIN_LEN,
                                   help_text="The Secret's name (never \"namespace/name\").")
    key = serializers.CharField(max_length=253, required=False,
                                help_text="The key of its data to read (env form).")
    env = serializers.CharField(max_length=253, required=False,
                                help_text="The environment variable to set (env form).")
    mount_path = serializers.CharField(
        max_length=v.MAX_PATH_LEN, required=False, trim_whitespace=False,
        help_text="Where its files appear, read-only (file form).")


def _metadata(help_text: str, value_len: int) -> serializers.DictField:
    return serializers.DictField(
        child=serializers.CharField(max_length=value_len, allow_blank=True,
                                    trim_whitespace=False),
        required=False, default=dict, help_text=help_text)


class DependencySerializer(StrictFieldsMixin, serializers.Serializer[Any]):
    """Rule D1: wait for one job, or every member of one array, of the same team."""

    type = serializers.ChoiceField(choices=[k.value for k in DependencyKind],
                                   help_text="after_ok: it succeeded; after_any: it ended; "
                                             "after_not_ok: it failed or was cancelled.")
    job = serializers.IntegerField(min_value=1, required=False, help_text="A job id.")
    array = serializers.IntegerField(min_value=1, required=False,
                                     help_text="An array id (all its members).")


# Shapes only: the rules that need the database or settings (the team, GPU type and tier,
# the registry, the simulator's knobs, a gang no node holds) are `job_input_build`'s
# (queueing/services/jobs.py). (A comment: the schema shows the docstring.)
class JobCreateSerializer(StrictFieldsMixin, serializers.Serializer[Any]):
    """A job as pipelines post it; `gpus` is per replica."""

    team = serializers.CharField(max_length=40)
    name = serializers.CharField(max_length=63)
    image = serializers.CharField(max_length=v.MAX_IMAGE_LEN)
    command = serializers.ListField(
        child=serializers.CharField(max_length=v.MAX_ARG_LEN, allow_blank=True, trim_whitespace=False),
        max_length=v.MAX_ARGV_ITEMS, required=False, default=list,
    )
    args = serializers.ListField(
        child=serializers.CharField(max_length=v.MAX_ARG_LEN, allow_blank=True, trim_whitespace=False),
        max_length=v.MAX_ARGV_ITEMS, required=False, default=list,
    )
    env = serializers.DictField(
        child=serializers.CharField(max_length=v.MAX_ENV_VALUE_LEN, allow_blank=True,
                                    trim_whitespace=False),
        required=False, default=dict,
    )
    gpu_type = serializers.CharField(
        max_length=40, required=False,
        help_text="The GPU type; with gpu_types, its first (may then be left out).")
    gpu_types = serializers.ListField(
        child=serializers.CharField(max_length=40), max_length=v.MAX_GPU_TYPES, required=False,
        help_text='Every GPU type the job accepts, most preferred first, e.g. ["h100", '
                  '"a100"]: the plan admits it on one of them (docs/scheduling.md, "Several '
                  'GPU types"), and gpu_type then says which. Each must hold the job with '
                  "the same gpus per replica.")
    gpus = GpusField(
        help_text="GPUs per replica: whole GPUs (2), or on a time-sliced or MPS GPU type "
                  "(no memory isolation between the jobs sharing a GPU) a fraction of one "
                  'GPU, a multiple of 1/slices_per_gpu: 0.25, 0.5 or "1/4" (docs/api.md, '
                  '"Fractions of a GPU").')
    replicas = serializers.IntegerField(min_value=1, max_value=v.MAX_REPLICAS, default=1,
                                        help_text="Gang size: all replicas start together.")
    tier = serializers.CharField(max_length=40, required=False)
    max_runtime_seconds = serializers.IntegerField(
        min_value=1, max_value=v.MAX_RUNTIME_SECONDS, required=False, allow_null=True,
        default=None,
    )
    resources = ResourcesSerializer(required=False)
    shm_size = serializers.CharField(
        max_length=v.MAX_QUANTITY_LEN, required=False, allow_blank=True,
        help_text='Size of /dev/shm (a memory-backed emptyDir), e.g. "64Gi"; not given: the '
                  "team's default, if any. At most the replica's memory limit (it counts "
                  "against it).")
    topology = TopologySerializer(required=False, allow_null=True)
    volumes = serializers.ListField(child=VolumeSerializer(), max_length=v.MAX_VOLUMES,
                                    required=False, default=list)
    secrets = serializers.ListField(child=SecretRefSerializer(), max_length=v.MAX_SECRETS,
                                    required=False, default=list)
    image_pull_secret = serializers.CharField(
        max_length=v.MAX_DNS_SUBDOMAIN_LEN, required=False, allow_blank=True, default="",
        help_text="A Secret of the team's namespace (in its allowed_pull_secrets) the "
                  "kubelet pulls the image with.")
    working_dir = serializers.CharField(
        max_length=v.MAX_WORKING_DIR_LEN, required=False, allow_blank=True, default="",
        trim_whitespace=False,
        help_text="The container's working directory: an absolute, normalised path.")
    labels = _metadata(
        f"At most {v.MAX_LABELS} labels: plain keys (no prefix; {v.MAX_LABEL_KEY_LEN} "
        "characters), Kubernetes label values. On the pods as "
        f"{v.USER_LABEL_PREFIX}<key>; GET /jobs/?label=key=value filters on them.",
        v.MAX_LABEL_VALUE_LEN)
    annotations = _metadata(
        f"At most {v.MAX_ANNOTATIONS} annotations: plain keys, values of at most "
        f"{v.MAX_ANNOTATION_VALUE_LEN} characters, {v.MAX_ANNOTATIONS_BYTES // 1024} KiB "
        f"together. On the pods as {v.USER_LABEL_PREFIX}<key>.",
        v.MAX_ANNOTATION_VALUE_LEN)
    termination_grace_seconds = serializers.IntegerField(
        min_value=0, max_value=v.MAX_TERMINATION_GRACE_SECONDS, required=False,
        allow_null=True, default=None,
        help_text="Seconds the pods get between SIGTERM and SIGKILL when stopped (cancel, "
                  "preemption); not given: FAIRQ_K8S_TERMINATION_GRACE_SECONDS. At most "
                  "the tier's max_termination_grace_seconds, or for a preemptible tier "
                  "without one FAIRQ_PREEMPTIBLE_MAX_TERMINATION_GRACE_SECONDS (rule R10).")
    stop_signal = serializers.CharField(
        max_length=8, required=False,
        help_text=f"The signal its program gets first when stopped (preemption, cancel), "
                  f"then SIGKILL after the grace: one of {', '.join(v.STOP_SIGNALS)}; not "
                  "given: SIGTERM. In the pods as FAIRQ_STOP_SIGNAL.")
    checkpoint_interval_seconds = serializers.IntegerField(
        required=False, allow_null=True, default=None,
        help_text=f"How often the job checkpoints, in seconds (at least "
                  f"{v.MIN_CHECKPOINT_INTERVAL_SECONDS}); not given: not declared. It "
                  "reports each checkpoint to FAIRQ_CHECKPOINT_URL (docs/api.md, "
                  "\"Checkpoints\").")
    dependencies = serializers.ListField(
        child=DependencySerializer(), max_length=MAX_DEPENDENCIES, required=False,
        help_text="Jobs or arrays of the same team to wait for, all of them (rules D1-D3, "
                  "like Slurm's --dependency); one that can never be met fails the job.")
    notify_url = serializers.CharField(
        max_length=v.MAX_WEBHOOK_URL_LEN, required=False, allow_blank=True, default="",
        help_text="A signed POST (Standard Webhooks) goes here on each state change of the "
                  "job; it must start with one of the team's allowed_notify_url_prefixes "
                  "(docs/webhooks.md).")
    # Rules K3, K4: checked by queueing/services/cluster_rules.py (CLUSTER_SUBMIT_FIELDS);
    # no defaults, so a body without them shapes as before (job_input_build's fields).
    requested_cluster = serializers.CharField(
        max_length=40, required=False, allow_blank=True, allow_null=True,
        help_text="Run only in this cluster (a pin, rule K3): an enabled cluster with nodes "
                  "of the job's GPU type, or a 400 saying why not.")
    cluster_selector = serializers.DictField(
        child=serializers.CharField(max_length=63, allow_blank=True), required=False,
        help_text='Run only in clusters carrying all these labels, e.g. {"region": '
                  '"eu-west"} (rule K3); some enabled cluster with nodes of the GPU type '
                  "must match, or a 400 says why.")
    allow_spot = serializers.BooleanField(
        required=False,
        help_text="Let a job of a non-preemptible tier run on spot (interruptible) nodes "
                  "(rule K4); a preemptible tier's jobs may anyway. A spot node reclaimed "
                  "requeues it (rule K6).")


class JobDependenciesSerializer(StrictFieldsMixin, serializers.Serializer[Any]):
    """`PATCH /jobs/{id}/`: a queued job's new dependencies (all of them; [] for none)."""

    dependencies = serializers.ListField(child=DependencySerializer(),
                                         max_length=MAX_DEPENDENCIES)


@functools.cache
def shaper(serializer_class: type[serializers.Serializer[Any]]) -> serializers.Serializer[Any]:
    """One unbound instance per class and process, its fields built once: building them
    (a deep copy of every declared field) was ~10 % of a submit's CPU. `run_validation`
    keeps no state in the instance, and the fields use no context, so one instance serves
    every request and thread."""
    one = serializer_class()
    one.fields  # noqa: B018  # build them now, not racing in two threads
    return one


def shaped(serializer_class: type[serializers.Serializer[Any]],
           data: Any) -> dict[str, Any]:
    """`data` validated by `serializer_class`'s fields (DRF's public `run_validation`):
    the fields with their types and defaults, or ValidationError (a 400 naming them)."""
    try:
        value: Mapping[str, Any] = shaper(serializer_class).run_validation(data)
    except serializers.ValidationError as exc:
        detail: Any = exc.detail
        if isinstance(detail, list) and len(detail) == 1 and getattr(detail[0], "code", "") == "null":
            # A body of JSON null: what `is_valid()` says of it (Serializer.errors).
            detail = {api_settings.NON_FIELD_ERRORS_KEY: [
                ErrorDetail("No data provided", code="null")]}
        raise serializers.ValidationError(detail) from None
    return dict(value)


def shaped_partly(serializer_class: type[serializers.Serializer[Any]], data: Any, *,
                  refused: Collection[str]) -> dict[str, Any]:
    """The fields of `data` that pass their own shapes, leaving out the `refused` ones:
    what a front end checks further to name every refused field in one answer."""
    out: dict[str, Any] = {}
    if not isinstance(data, Mapping):
        return out
    for name, field in shaper(serializer_class).fields.items():
        if name in refused or field.read_only:
            continue
        try:
            out[name] = field.run_validation(field.get_value(data))
        except (serializers.ValidationError, SkipField):
            continue
    return out


class JobEventSerializer(serializers.ModelSerializer[JobEvent]):
    actor = serializers.CharField(source="actor_label")
    # Declared so the schema does not depend on the database's integer range.
    attempt = serializers.IntegerField(read_only=True)

    class Meta:
        model = JobEvent
        fields = ["id", "at", "kind", "from_status", "to_status", "actor", "reason", "attempt",
                  "data"]


class JobSerializer(serializers.ModelSerializer[Job]):
    team = serializers.CharField(source="team.slug")
    gpu_type = serializers.CharField(
        source="gpu_type.slug",
        help_text="The GPU type of its current (or last) admitted attempt, the one the plan "
                  "chose among gpu_types; until it is first admitted, the first of them.")
    gpu_types = serializers.ListField(
        source="accepted_gpu_types", child=serializers.CharField(), read_only=True,
        help_text="Every GPU type it accepts, most preferred first ([gpu_type] for a job "
                  "of one type).")
    tier = serializers.CharField(source="tier.slug")
    gpus = serializers.SerializerMethodField(
        help_text="GPUs per replica: a whole number, or the fraction of one GPU of a "
                  "time-sliced or MPS type (0.25: gpu_slices of its slices_per_gpu).")
    total_gpus = serializers.SerializerMethodField(
        help_text="GPUs of all replicas (a fraction's share of one GPU times replicas).")
    gpu_slices = serializers.IntegerField(
        read_only=True,
        help_text="Shared GPUs: slices of one GPU per replica (a fraction); 0: whole GPUs.")
    gpu_share = serializers.FloatField(
        read_only=True,
        help_text="GPU-equivalents it holds while running: what quotas, fair share and "
                  "costs count (0.25 for a quarter GPU; a MIG instance 1/slices_per_gpu).")
    gpu_sharing = serializers.CharField(
        source="gpu_type.sharing", read_only=True,
        help_text="How its GPU type shares a GPU: exclusive, mig, time-sliced or mps "
                  "(time-sliced and mps: no memory isolation between the jobs on a GPU).")
    slices_per_gpu = serializers.IntegerField(source="gpu_type.slices_per_gpu",
                                              read_only=True)
    gpu_slots = serializers.ListField(
        child=serializers.IntegerField(), read_only=True,
        help_text="A fraction's GPU index on its node, per replica, as the plan packed it "
                  "([] for whole GPUs or before admission).")
    submitter = serializers.CharField(source="submitter.username", default=None)
    resources = serializers.DictField(
        child=serializers.CharField(), read_only=True,
        help_text="Per replica, requests = limits: cpu, memory, ephemeral_storage as "
                  "submitted or from the team's defaults; a resource not set is absent.")
    shm_size = serializers.CharField(read_only=True,
                                     help_text='Size of /dev/shm ("": the runtime\'s default).')
    topology = serializers.DictField(
        child=serializers.CharField(), read_only=True, allow_null=True,
        help_text='Rule A7: {"level": "rack", "mode": "required"}, or null.')
    volumes = serializers.ListField(child=serializers.DictField(), read_only=True,
                                    help_text="As submitted (normalised).")
    secrets = serializers.ListField(child=serializers.DictField(), read_only=True,
                                    help_text="Secret references (never values).")
    labels = serializers.DictField(child=serializers.CharField(), read_only=True)
    annotations = serializers.DictField(child=serializers.CharField(), read_only=True)
    termination_grace_seconds = serializers.IntegerField(read_only=True, allow_null=True)
    dependencies = serializers.ListField(
        child=serializers.DictField(), read_only=True,
        help_text='Rules D1-D3: [{"type": "after_ok" | "after_any" | "after_not_ok", "job": '
                  'id} or {"type": ..., "array": id}], all to be met.')
    array_id = serializers.IntegerField(read_only=True, allow_null=True,
                                        help_text="The array job it is a member of, or null.")
    array_index = serializers.IntegerField(read_only=True, allow_null=True)
    cluster = serializers.SerializerMethodField(
        help_text="The cluster its current attempt runs in (rule K1); null while queued, "
                  "or with no clusters configured.")
    requested_cluster = serializers.SerializerMethodField(
        help_text="The cluster it is pinned to (rule K3), or null.")
    cluster_selector = serializers.DictField(
        child=serializers.CharField(), read_only=True,
        help_text="Labels its cluster must carry (rule K3); {} for any.")
    allow_spot = serializers.BooleanField(
        read_only=True, help_text="Opted in to spot nodes (rule K4).")
    stop_signal = serializers.CharField(
        read_only=True, help_text="The signal its program gets first when stopped.")
    checkpoint_interval_seconds = serializers.IntegerField(
        read_only=True, allow_null=True,
        help_text="How often it said it checkpoints (seconds); null: not declared.")
    checkpointed_at = serializers.DateTimeField(
        read_only=True, allow_null=True,
        help_text="The newest checkpoint its current attempt reported; null: none.")
    attempts = serializers.SerializerMethodField(
        help_text="Its attempts that were admitted, oldest first: attempt, admitted_at, "
                  "started_at, ended_at, ended_how (preempted, reclaimed, spot_reclaimed, "
                  "cluster_unreachable, failed, node_lost, requeued, succeeded, cancelled; "
                  "admitted or running for the current one), "
                  "preempted_by ({job, team, tier} or null), gpu_hours (charged; a running "
                  "attempt's so far) and charged; for a preempted attempt lost_gpu_hours, "
                  "checkpoint_at and lost_note (null otherwise).")

    class Meta:
        model = Job
        fields = [
            "id", "team", "name", "image", "command", "args", "env", "gpu_type", "gpu_types",
            "gpus", "gpu_slices", "gpu_share", "gpu_sharing", "slices_per_gpu", "gpu_slots",
            "replicas", "total_gpus", "tier", "max_runtime_seconds", "resources", "shm_size",
            "topology", "volumes", "secrets", "image_pull_secret", "working_dir", "labels",
            "annotations", "termination_grace_seconds", "notify_url", "status", "attempt",
            "submitter", "created_at", "updated_at", "admitted_at", "started_at",
            "finished_at", "placement", "exit_code", "message",
            "dependencies", "array_id", "array_index", "attempts",
            "cluster", "requested_cluster", "cluster_selector", "allow_spot",
            "stop_signal", "checkpoint_interval_seconds", "checkpointed_at",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.FloatField())
    def get_gpus(self, job: Job) -> int | float:
        if job.gpu_slices:
            return job.gpu_slices / job.gpu_type.slices_per_gpu
        return job.gpus_per_replica

    @extend_schema_field(serializers.FloatField())
    def get_total_gpus(self, job: Job) -> int | float:
        if job.gpu_slices:
            return job.gpu_slices * job.replicas / job.gpu_type.slices_per_gpu
        return job.total_gpus

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_cluster(self, job: Job) -> str | None:
        return cluster_name(job.cluster_id)

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_requested_cluster(self, job: Job) -> str | None:
        return cluster_name(job.requested_cluster_id)

    def get_attempts(self, job: Job) -> list[dict[str, Any]]:
        # A list passes every job's attempts in the context (two queries per page).
        given: dict[int, list[dict[str, Any]]] | None = self.context.get("attempts")
        if given is not None and job.pk in given:
            return given[job.pk]
        if job.attempt == 1 and job.admitted_at is None and job.started_at is None:
            return []  # never admitted (a job just submitted): no query
        # Read once per answer: `attempts` and the detail's `lost_gpu_hours` both use it.
        read: list[dict[str, Any]] | None = getattr(job, "_attempts_read", None)
        if read is None:
            read = job_attempts(job, now=timezone.now())
            job._attempts_read = read  # type: ignore[attr-defined]
        return read


_REASON_HELP = ("Rule E5: why it waits, the plan's main reason: {code, message, until?} "
                "(`until`, ISO 8601, when the wait ends at a known instant: rule E4); null "
                "unless queued.")


class JobListSerializer(JobSerializer):
    """A job of `GET /jobs/`: with, while queued, its place in the queue and the main
    reason it waits (rule E5), from the one cached plan of the queue; the view passes
    them in the context as {"briefs": {job id: {position, jobs_ahead, reason}}}."""

    position = serializers.SerializerMethodField(
        help_text="Queue position (rule P2), 1 = next; null unless queued.")
    jobs_ahead = serializers.SerializerMethodField(
        help_text="Queued jobs ahead of it asking for its GPU type (rule E1); null unless "
                  "queued.")
    reason = serializers.SerializerMethodField(help_text=_REASON_HELP)

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "position", "jobs_ahead", "reason"]
        read_only_fields = fields

    def _brief(self, job: Job) -> dict[str, Any]:
        briefs: dict[int, dict[str, Any]] = self.context.get("briefs", {})
        return briefs.get(job.pk) or {}

    def get_position(self, job: Job) -> int | None:
        return self._brief(job).get("position")

    def get_jobs_ahead(self, job: Job) -> int | None:
        return self._brief(job).get("jobs_ahead")

    @extend_schema_field(inline_serializer("WaitReason", {
        "code": serializers.CharField(), "message": serializers.CharField(),
        "until": serializers.DateTimeField(required=False)}, allow_null=True))
    def get_reason(self, job: Job) -> dict[str, Any] | None:
        return self._brief(job).get("reason")


class JobDetailSerializer(JobSerializer):
    events = JobEventSerializer(many=True, read_only=True)
    priority = serializers.SerializerMethodField(
        help_text="Priority per factor: factor in [0, 1], weight, weighted value, and the "
                  "total (rule P1, like sprio).")
    queue = serializers.SerializerMethodField(
        help_text="For a queued job: position (rule P2), jobs ahead and why it waits "
                  "(rule P3); null otherwise.")

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "events", "priority", "queue", "idle_since",
                  "utilization", "checkpoint", "lost_gpu_hours"]
        read_only_fields = fields

    checkpoint = serializers.SerializerMethodField(
        help_text="Its newest checkpoint, of any attempt: {id, attempt, created_at, step, "
                  "progress, path}; null: none reported.")
    lost_gpu_hours = serializers.SerializerMethodField(
        help_text="GPU-hours its preemptions lost: per preempted attempt, its GPUs x the "
                  "time from its newest checkpoint (or start) to the preemption; a "
                  "checkpoint reported during the grace saves all of it.")

    @extend_schema_field(inline_serializer("NewestCheckpoint", {
        "id": serializers.IntegerField(), "attempt": serializers.IntegerField(),
        "created_at": serializers.DateTimeField(),
        "step": serializers.IntegerField(allow_null=True),
        "progress": serializers.FloatField(allow_null=True),
        "path": serializers.CharField()}, allow_null=True))
    def get_checkpoint(self, job: Job) -> dict[str, Any] | None:
        c = newest_checkpoint(job)
        if c is None:
            return None
        return {"id": c.pk, "attempt": c.attempt, "created_at": c.created_at.isoformat(),
                "step": c.step, "progress": c.progress, "path": c.path}

    def get_lost_gpu_hours(self, job: Job) -> float:
        return round(sum(a.get("lost_gpu_hours") or 0.0 for a in self.get_attempts(job)), 6)

    idle_since = serializers.SerializerMethodField(
        help_text="When the running attempt was flagged idle (rule U2); null when it is not.")
    utilization = serializers.SerializerMethodField(
        help_text="Per attempt with GPU readings (rule U5): attempt, samples (minutes), "
                  "sm_mean and sm_p95 (SM activity, percent), mem_mean_bytes, "
                  "mem_max_bytes, first_at, last_at, idle_since, and series: "
                  "[{at, sm, mem_bytes}] per minute.")

    def get_idle_since(self, job: Job) -> str | None:
        since = idle_since(job)
        return since.isoformat() if since is not None else None

    def get_utilization(self, job: Job) -> list[dict[str, Any]]:
        return [{**a, **{k: a[k].isoformat() if a[k] is not None else None
                         for k in ("first_at", "last_at", "idle_since")},
                 "series": [{**p, "at": p["at"].isoformat()} for p in a["series"]]}
                for a in job_utilization(job)]

    # The view computes the explanation (`job_explain`: it plans the whole queue) and
    # passes it in the context as {"explain": {job id: explanation}}.
    def _explain(self, job: Job) -> dict[str, Any]:
        explained: dict[int, dict[str, Any]] = self.context["explain"]
        return explained[job.pk]

    def get_priority(self, job: Job) -> dict[str, Any]:
        return dict(self._explain(job)["priority"])

    def get_queue(self, job: Job) -> dict[str, Any] | None:
        queue = self._explain(job)["queue"]
        return dict(queue) if queue is not None else None


class UserUsageSerializer(serializers.Serializer[Any]):
    """One user's usage inside a team (`/fairshare/?users=1`, `fairq share -a`)."""

    user = serializers.CharField(allow_null=True, help_text="null: imported usage")
    usage_gpu_hours = serializers.FloatField(help_text="Decayed weighted GPU-hours (rule F1)")
    usage_fraction = serializers.FloatField(help_text="Of the team's usage")
    running_jobs = serializers.IntegerField()


class StandingSerializer(serializers.Serializer[Any]):
    """One team's standing; the same names as `manage.py fairshare --json`."""

    team = serializers.CharField()
    parent = serializers.CharField(allow_null=True)  # type: ignore[assignment]  # stubs: Field.parent
    weight = serializers.FloatField()
    share = serializers.FloatField(help_text="S: normalized share (rules F2, F4)")
    level_share = serializers.FloatField(help_text="weight / sum of active siblings' (rule F4)")
    usage_gpu_hours = serializers.FloatField(help_text="Decayed weighted GPU-hours (rule F1)")
    usage_fraction = serializers.FloatField(help_text="usage / all teams' usage (rule F2)")
    normalized_usage = serializers.FloatField(help_text="U (rule F2; effective, rule F4)")
    fair_share_factor = serializers.FloatField(help_text="F = 2^(-U/S) (rule F3)")
    active = serializers.BooleanField(help_text="Has usage or queued/running work (rule F2)")
