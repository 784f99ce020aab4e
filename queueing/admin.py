from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin

from accounts.admin import AuditedAdmin
from accounts.services import hierarchy_lock
from queueing.selectors.clusters import cluster_state_words
from queueing.selectors.gpu_share import gpu_type_jobs_not_final
from queueing.selectors.quota_tree import carve_problems
from queueing.services.cluster_admin import cluster_config_problems, labels_problem
from queueing.validation import gpu_sharing_problems

from .models import (
    BudgetWarning,
    Checkpoint,
    Cluster,
    GpuPrice,
    GpuType,
    HistoryPrune,
    Job,
    JobEvent,
    NodePool,
    Quota,
    TeamBudget,
    Tier,
    TierGrant,
    UsageRecord,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
)


class GpuTypeAdminForm(forms.ModelForm):  # type: ignore[type-arg]
    """Shared GPUs: exclusive has 1 slice per GPU, mig / time-sliced / mps 2 to 64
    (`validation.gpu_sharing_problems`); neither changes while jobs of the type are
    queued, admitted or running (their slices and their nodes' units are counted in
    them): docs/api.md, "Fractions of a GPU"."""

    class Meta:
        model = GpuType
        fields = ["slug", "name", "resource_name", "node_labels", "billing_weight",
                  "topology_levels", "sharing", "slices_per_gpu"]
        help_texts = {
            "sharing": "time-sliced and mps: NO memory isolation between the jobs sharing a "
                       "GPU (one job's out-of-memory or crash can take the others down). "
                       "mig: each device an isolated instance of one profile.",
        }

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        sharing, slices = data.get("sharing"), data.get("slices_per_gpu")
        if sharing is None or slices is None:
            return data
        for field, message in gpu_sharing_problems(sharing, slices).items():
            self.add_error(field, message)
        old = self.instance
        if old.pk and (old.sharing, old.slices_per_gpu) != (sharing, slices):
            busy = gpu_type_jobs_not_final(old.pk)
            if busy:
                self.add_error("sharing", (
                    f"{busy} job{'s' if busy != 1 else ''} of {old.slug} "
                    f"{'are' if busy != 1 else 'is'} queued, admitted or running: sharing "
                    "and slices per GPU change only when none is (their slices are counted "
                    "in them). Drain the type first, or add a new type."))
        return data


@admin.register(GpuType)
class GpuTypeAdmin(AuditedAdmin):
    form = GpuTypeAdminForm
    list_display = ["slug", "name", "resource_name", "sharing", "slices_per_gpu",
                    "billing_weight", "topology_levels"]


class TierGrantInline(admin.TabularInline):  # type: ignore[type-arg]
    """Rule T1: the teams a closed tier is granted to (saved and deleted audited, by
    AuditedAdmin.save_formset)."""

    model = TierGrant
    extra = 0
    fields = ["team"]
    autocomplete_fields = ["team"]


@admin.register(Tier)
class TierAdmin(AuditedAdmin):
    list_display = ["slug", "rank", "priority_class_name", "priority_value", "preemptible",
                    "min_runtime_seconds", "max_termination_grace_seconds", "open_to_all_teams",
                    "idle_threshold_percent", "idle_window_minutes", "idle_action",
                    "idle_grace_minutes", "flavor_fallback", "preemption_lost_per_wait",
                    "owed_preempts_at_once"]
    list_filter = ["open_to_all_teams", "idle_action", "flavor_fallback",
                   "owed_preempts_at_once"]
    inlines = [TierGrantInline]


class ClusterAdminForm(forms.ModelForm):  # type: ignore[type-arg]
    """The API's rules of a cluster's configuration (`cluster_config_problems`), on the
    admin's fields."""

    class Meta:
        model = Cluster
        fields = ["name", "backend", "kubeconfig", "context", "in_cluster", "sim_nodes",
                  "enabled", "labels", "cost_rank"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        problems = cluster_config_problems(data, exclude_pk=self.instance.pk)
        for field, messages in problems.items():
            for message in messages:
                self.add_error(field if field in self.fields else None, message)
        return data


class NodePoolInlineForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = NodePool
        fields = ["name", "gpu_type", "spot", "node_labels", "price_per_gpu_hour"]

    def clean_node_labels(self) -> Any:
        labels = self.cleaned_data.get("node_labels") or {}
        problem = labels_problem(labels, what="node label")
        if problem:
            raise forms.ValidationError(problem)
        return labels


class NodePoolInline(admin.TabularInline):  # type: ignore[type-arg]
    """Rule K4: a cluster's pools of one GPU type; spot pools at their own price (saved
    and deleted audited, by AuditedAdmin.save_formset)."""

    model = NodePool
    form = NodePoolInlineForm
    extra = 0
    fields = ["name", "gpu_type", "spot", "node_labels", "price_per_gpu_hour"]


@admin.register(Cluster)
class ClusterAdmin(AuditedAdmin):
    """Rules K1-K8 (docs/scheduling.md): the clusters fairq schedules onto. Disable one
    rather than delete it (jobs keep naming it): it drains (rule K8), its jobs run on and
    nothing new goes there; `unreachable_since`, `last_seen_at` and `drained_at` are the
    scheduler's."""

    form = ClusterAdminForm
    list_display = ["name", "backend", "enabled", "state", "cost_rank", "labels",
                    "unreachable_since", "last_seen_at"]
    list_filter = ["backend", "enabled"]
    search_fields = ["name"]
    readonly_fields = ["state", "unreachable_since", "last_seen_at", "drained_at",
                       "created_at"]
    inlines = [NodePoolInline]

    @admin.display(description="state")
    def state(self, obj: Cluster) -> str:
        """Rule K8: enabled, draining (disabled, with the jobs still there) or drained."""
        return cluster_state_words(obj)


class QuotaAdminForm(forms.ModelForm):  # type: ignore[type-arg]
    """Rule Q8: a department's teams' nominals fit in its own row; checked here as the
    services check it (`quota_set`), in turn with every other quota and parent change."""

    class Meta:
        model = Quota
        fields = ["team", "gpu_type", "nominal", "borrowing_limit", "lending_limit"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        team, gpu_type, nominal = data.get("team"), data.get("gpu_type"), data.get("nominal")
        if team is None or gpu_type is None or nominal is None:
            return data
        old = self.instance
        if old.pk and (old.team_id, old.gpu_type_id, old.nominal) == (team.pk, gpu_type.pk,
                                                                      nominal):
            return data
        hierarchy_lock()  # the admin saves in the same transaction
        for message in carve_problems(quota=(team.slug, gpu_type.slug, nominal)):
            self.add_error("nominal", message)
        return data


@admin.register(Quota)
class QuotaAdmin(AuditedAdmin):
    form = QuotaAdminForm
    list_display = ["team", "gpu_type", "nominal", "borrowing_limit", "lending_limit"]
    list_filter = ["gpu_type", "team"]


class JobEventInline(admin.TabularInline):  # type: ignore[type-arg]
    model = JobEvent
    extra = 0
    can_delete = False
    readonly_fields = ("at", "kind", "from_status", "to_status", "actor_label", "reason", "attempt")
    fields = readonly_fields

    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


class CheckpointInline(admin.TabularInline):  # type: ignore[type-arg]
    """The checkpoints the job's attempts reported (read-only: only a job reports them)."""

    model = Checkpoint
    extra = 0
    can_delete = False
    readonly_fields = ("created_at", "attempt", "step", "progress", "path")
    fields = readonly_fields

    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Read-only: jobs change state only through the services (cancel via the API)."""

    list_display = ["id", "name", "team", "tier", "gpu_type", "gpus_per_replica", "replicas",
                    "status", "attempt", "created_at"]
    list_filter = ["status", "tier", "gpu_type", "team"]
    search_fields = ["name"]
    inlines = [JobEventInline, CheckpointInline]

    def get_readonly_fields(self, request, obj=None):  # type: ignore[no-untyped-def]
        return [f.name for f in Job._meta.fields]

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["team", "gpu_type", "gpus", "start", "end", "gpu_seconds", "source",
                    "lost_gpu_hours"]
    list_filter = ["team", "gpu_type", "source"]

    def get_readonly_fields(self, request, obj=None):  # type: ignore[no-untyped-def]
        return [f.name for f in UsageRecord._meta.fields]


@admin.register(HistoryPrune)
class HistoryPruneAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Each run of `history_prune` (docs/deployment.md, "History retention"): read only."""

    list_display = ["started_at", "finished_at", "actor_label", "error"]

    def get_readonly_fields(self, request, obj=None):  # type: ignore[no-untyped-def]
        return [f.name for f in HistoryPrune._meta.fields]

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False


@admin.register(GpuPrice)
class GpuPriceAdmin(AuditedAdmin):
    """Rule C1: a price per GPU type and hour from a UTC day (FAIRQ_CURRENCY)."""

    list_display = ["gpu_type", "effective_from", "price_per_gpu_hour"]
    list_filter = ["gpu_type"]
    ordering = ["gpu_type__slug", "-effective_from"]


@admin.register(TeamBudget)
class TeamBudgetAdmin(AuditedAdmin):
    """Rules B1-B3: a team's monthly budget and its policy."""

    list_display = ["team", "monthly_amount", "policy"]
    list_filter = ["policy"]
    autocomplete_fields = ["team"]


@admin.register(BudgetWarning)
class BudgetWarningAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Rule B2's warnings, as given (read-only: the budget check writes them)."""

    list_display = ["team", "month", "level", "at", "cost", "budget"]
    list_filter = ["level", "month"]

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False


# --- webhooks (docs/webhooks.md) ----------------------------------------------------


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(AuditedAdmin):
    """Changes audited; the secret is never shown nor audited. Endpoints are created (and
    secrets rotated) through the API or the team page, where the secret is shown once."""

    list_display = ["id", "team", "url", "enabled", "event_types", "secret_rotated_at"]
    list_filter = ["enabled", "team"]
    search_fields = ["url", "description"]
    fields = ["team", "url", "description", "enabled", "event_types", "secret_rotated_at",
              "created_at", "updated_at"]
    readonly_fields = ["team", "secret_rotated_at", "created_at", "updated_at"]
    audit_exclude = ("secret",)

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False


class WebhookAttemptInline(admin.TabularInline):  # type: ignore[type-arg]
    model = WebhookAttempt
    extra = 0
    can_delete = False
    readonly_fields = ("number", "at", "status_code", "response_excerpt", "error",
                       "duration_ms", "next_retry_at")
    fields = readonly_fields

    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """The delivery log, read-only."""

    list_display = ["id", "team", "event_type", "url", "job", "status", "attempts",
                    "next_attempt_at", "created_at"]
    list_filter = ["status", "event_type", "team"]
    search_fields = ["message_id", "url"]
    inlines = [WebhookAttemptInline]

    def get_readonly_fields(self, request, obj=None):  # type: ignore[no-untyped-def]
        return [f.name for f in WebhookDelivery._meta.fields]

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False
