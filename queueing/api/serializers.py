"""Request validation and response shapes of API v1. No state changes here."""

from __future__ import annotations

import threading
from functools import cached_property
from typing import Any

from django.conf import settings
from rest_framework import serializers

from accounts.models import Team
from queueing import validation as v
from queueing.models import GpuType, Job, JobEvent, Tier
from queueing.selectors.cluster import largest_node_gpus
from queueing.selectors.lookups import gpu_types_by_slug, team_for_submitter, tiers_by_slug
from queueing.services.jobs import JobInput

from .strict import StrictFieldsMixin

_shared_fields_lock = threading.Lock()


class JobCreateSerializer(StrictFieldsMixin, serializers.Serializer[Any]):
    """A job as pipelines post it; `gpus` is per replica."""

    # The fields are deep-copied and bound once per class, not per request (~10 % of a
    # submit's CPU): validating reads them and keeps no state in them, and none uses the
    # context (the validate_* methods read the serializer's own).
    @cached_property
    def fields(self) -> Any:
        cls = type(self)
        shared = cls.__dict__.get("_shared_fields")
        if shared is None:
            with _shared_fields_lock:
                shared = cls.__dict__.get("_shared_fields")
                if shared is None:
                    template = cls()
                    shared = serializers.Serializer.fields.func(template)  # type: ignore[attr-defined]
                    cls._shared_fields = shared  # type: ignore[attr-defined]
        return shared

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
    gpu_type = serializers.CharField(max_length=40)
    gpus = serializers.IntegerField(min_value=1, help_text="GPUs per replica.")
    replicas = serializers.IntegerField(min_value=1, max_value=v.MAX_REPLICAS, default=1,
                                        help_text="Gang size: all replicas start together.")
    tier = serializers.CharField(max_length=40, required=False)
    max_runtime_seconds = serializers.IntegerField(
        min_value=1, max_value=v.MAX_RUNTIME_SECONDS, required=False, allow_null=True,
        default=None,
    )

    def validate_team(self, value: str) -> Team:
        team = team_for_submitter(user=self.context["request"].user, slug=value)
        if team is None:
            # The same message whether the team exists or not: no disclosure.
            raise serializers.ValidationError(f"Unknown team {value!r}, or you are not in it.")
        return team

    def validate_name(self, value: str) -> str:
        if not v.JOB_NAME_RE.match(value):
            raise serializers.ValidationError(
                "Use at most 63 lower-case letters, digits and '-', starting and ending "
                "with a letter or digit (a Kubernetes name)."
            )
        return value

    def validate_image(self, value: str) -> str:
        if not v.IMAGE_RE.match(value):
            raise serializers.ValidationError("Not a valid container image reference.")
        problem = v.registry_problem(value, settings.FAIRQ_REGISTRY_ALLOWLIST)
        if problem:
            raise serializers.ValidationError(problem)
        return value

    def validate_env(self, value: dict[str, str]) -> dict[str, str]:
        if len(value) > v.MAX_ENV_ITEMS:
            raise serializers.ValidationError(f"At most {v.MAX_ENV_ITEMS} variables.")
        bad = [k for k in value if not v.ENV_NAME_RE.match(k) or len(k) > 253]
        if bad:
            raise serializers.ValidationError(f"Invalid variable names: {', '.join(sorted(bad))}.")
        reserved = [k for k in value if v.env_name_reserved(k)]
        if reserved:
            raise serializers.ValidationError(
                f"These names are reserved: {', '.join(sorted(reserved))} (NVIDIA_*, KUBERNETES_*, "
                "CUDA_VISIBLE_DEVICES, LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT and FAIRQ_* "
                f"except {', '.join(sorted(v.ALLOWED_FAIRQ_ENV))})."
            )
        problems = v.sim_env_problems(value)
        if problems:
            raise serializers.ValidationError(problems)
        return value

    def validate_gpu_type(self, value: str) -> GpuType:
        types = gpu_types_by_slug()
        gpu_type = types.get(value)
        if gpu_type is None:
            known = ", ".join(sorted(types))
            raise serializers.ValidationError(f"Unknown GPU type {value!r}; known: {known}.")
        return gpu_type

    def validate_tier(self, value: str) -> Tier:
        tiers = tiers_by_slug()
        tier = tiers.get(value)
        if tier is None:
            known = ", ".join(sorted(tiers))
            raise serializers.ValidationError(f"Unknown tier {value!r}; known: {known}.")
        return tier

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "tier" not in attrs:
            tier = tiers_by_slug().get(settings.FAIRQ_DEFAULT_TIER)
            if tier is None:
                raise serializers.ValidationError({"tier": ["This field is required."]})
            attrs["tier"] = tier
        largest = largest_node_gpus(attrs["gpu_type"].slug)
        # None: no cluster view published yet; the scheduler's own check (rule A3) decides.
        if largest is not None and attrs["gpus"] > largest:
            raise serializers.ValidationError({"gpus": [
                f"No {attrs['gpu_type'].slug} node holds {attrs['gpus']} GPUs "
                f"(the largest has {largest})." if largest else
                f"The cluster has no {attrs['gpu_type'].slug} nodes."
            ]})
        if v.spec_size(attrs["command"], attrs["args"], attrs["env"]) > v.MAX_SPEC_BYTES:
            raise serializers.ValidationError({"non_field_errors": [
                f"command, args and env together exceed {v.MAX_SPEC_BYTES // 1024} KiB."
            ]})
        return attrs

    def to_input(self) -> JobInput:
        d = self.validated_data
        return JobInput(
            team=d["team"], name=d["name"], image=d["image"], command=d["command"],
            args=d["args"], env=d["env"], gpu_type=d["gpu_type"], gpus_per_replica=d["gpus"],
            replicas=d["replicas"], tier=d["tier"], max_runtime_seconds=d["max_runtime_seconds"],
        )


class JobEventSerializer(serializers.ModelSerializer[JobEvent]):
    actor = serializers.CharField(source="actor_label")
    # Declared so the schema does not depend on the database's integer range.
    attempt = serializers.IntegerField(read_only=True)

    class Meta:
        model = JobEvent
        fields = ["at", "kind", "from_status", "to_status", "actor", "reason", "attempt", "data"]


class JobSerializer(serializers.ModelSerializer[Job]):
    team = serializers.CharField(source="team.slug")
    gpu_type = serializers.CharField(source="gpu_type.slug")
    tier = serializers.CharField(source="tier.slug")
    gpus = serializers.IntegerField(source="gpus_per_replica")
    total_gpus = serializers.IntegerField(read_only=True)
    submitter = serializers.CharField(source="submitter.username", default=None)

    class Meta:
        model = Job
        fields = [
            "id", "team", "name", "image", "command", "args", "env", "gpu_type", "gpus",
            "replicas", "total_gpus", "tier", "max_runtime_seconds", "status", "attempt",
            "submitter", "created_at", "updated_at", "admitted_at", "started_at",
            "finished_at", "placement", "exit_code", "message",
        ]
        read_only_fields = fields


class JobDetailSerializer(JobSerializer):
    events = JobEventSerializer(many=True, read_only=True)
    priority = serializers.SerializerMethodField(
        help_text="Priority per factor: factor in [0, 1], weight, weighted value, and the "
                  "total (rule P1, like sprio).")
    queue = serializers.SerializerMethodField(
        help_text="For a queued job: position (rule P2), jobs ahead and why it waits "
                  "(rule P3); null otherwise.")

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "events", "priority", "queue"]
        read_only_fields = fields

    def _explain(self, job: Job) -> dict[str, Any]:
        from django.utils import timezone

        from queueing.selectors.queue_plan import job_explain

        # One explanation per job and serializer; context {"explain_queue": False} skips
        # the queue part (it runs the admission plan over the whole queue).
        cache: dict[int, dict[str, Any]] = self.__dict__.setdefault("_explained", {})
        if job.pk not in cache:
            cache[job.pk] = job_explain(job=job, now=timezone.now(),
                                        with_queue=self.context.get("explain_queue", True))
        return cache[job.pk]

    def get_priority(self, job: Job) -> dict[str, Any]:
        return dict(self._explain(job)["priority"])

    def get_queue(self, job: Job) -> dict[str, Any] | None:
        queue = self._explain(job)["queue"]
        return dict(queue) if queue is not None else None


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
