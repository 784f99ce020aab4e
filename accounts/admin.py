from __future__ import annotations

from collections import defaultdict
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect

from queueing.errors import Conflict, DomainError
from queueing.selectors.quota_tree import carve_problems

from .models import (
    TEAM_ALLOWLIST_FIELDS,
    TEAM_RESOURCE_FIELDS,
    ApiToken,
    AuditEntry,
    Membership,
    Role,
    ServiceAccount,
    Team,
)
from .services import (
    audit_record,
    hierarchy_lock,
    membership_check_keeps_admin,
    membership_remove,
    membership_set,
    model_changes,
    token_revoke,
)


class AuditedAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Every save and delete through the admin, inline rows included, writes an
    AuditEntry (who, when, old → new) in the same transaction as the change.
    Memberships are saved and deleted through their services, which audit them and keep
    each team's last team admin; a DomainError a service raises becomes an
    error message, with nothing changed."""

    audit_exclude: tuple[str, ...] = ()  # fields never copied into the audit log

    def _changes(self, old: models.Model | None, new: models.Model) -> dict[str, list[Any]]:
        return {k: v for k, v in model_changes(old, new).items() if k not in self.audit_exclude}

    def save_model(self, request: HttpRequest, obj: models.Model, form: Any, change: bool) -> None:
        with transaction.atomic():
            old = type(obj)._default_manager.filter(pk=obj.pk).first() if change else None
            super().save_model(request, obj, form, change)
            changes = self._changes(old, obj)
            if changes:
                audit_record(actor=request.user, action="update" if change else "create",  # type: ignore[arg-type]
                             instance=obj, changes=changes)

    def delete_model(self, request: HttpRequest, obj: models.Model) -> None:
        with transaction.atomic():
            audit_record(actor=request.user, action="delete", instance=obj,  # type: ignore[arg-type]
                         changes={k: [v[1], None] for k, v in self._changes(None, obj).items()})
            super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        with transaction.atomic():  # all or nothing, so a refusal leaves every row
            for obj in queryset:
                self.delete_model(request, obj)

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        if formset.model is Membership:
            _save_membership_formset(request, formset)
            return
        with transaction.atomic():
            model = formset.model
            # Read the rows as stored: validation has already written the POST into
            # each form's instance.
            before = model._default_manager.in_bulk(
                [f.instance.pk for f in formset.initial_forms if f.instance.pk is not None])
            instances = formset.save(commit=False)  # collects deletions, saves nothing
            for obj in formset.deleted_objects:
                old = before.get(obj.pk, obj)
                audit_record(actor=request.user, action="delete", instance=old,  # type: ignore[arg-type]
                             changes={k: [v[1], None]
                                      for k, v in self._changes(None, old).items()})
                obj.delete()
            for obj in instances:
                old = before.get(obj.pk) if obj.pk is not None else None
                obj.save()
                changes = self._changes(old, obj)
                if changes:
                    audit_record(actor=request.user,  # type: ignore[arg-type]
                                 action="update" if old is not None else "create",
                                 instance=obj, changes=changes)
            formset.save_m2m()

    # The admin's own views run in a transaction: a refusal raised inside rolls it all
    # back (the admin's history entry too), then we say why instead of answering 500.

    def changeform_view(self, request: HttpRequest, object_id: str | None = None,
                        form_url: str = "", extra_context: Any = None) -> HttpResponse:
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except DomainError as exc:
            self.message_user(request, exc.message, messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())

    def delete_view(self, request: HttpRequest, object_id: str,
                    extra_context: Any = None) -> HttpResponse:
        try:
            return super().delete_view(request, object_id, extra_context)
        except DomainError as exc:
            self.message_user(request, exc.message, messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())

    def response_action(self, request: HttpRequest, queryset: Any,
                        *args: Any, **kwargs: Any) -> HttpResponse | None:
        try:
            with transaction.atomic():
                return super().response_action(request, queryset, *args, **kwargs)
        except DomainError as exc:
            self.message_user(request, exc.message, messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())


# --- memberships: through the services ---------------------------------------------------


def _save_membership_formset(request: HttpRequest, formset: Any) -> None:
    """Apply an inline formset of memberships through the services (audited, last-admin rule).
    Additions and promotions go first, demotions and deletions last, so a team that ends
    with a team admin has one at every step (the formset's clean() checked the end)."""
    actor: Any = request.user
    formset.save(commit=False)  # fills new/changed/deleted_objects for the admin's history
    saved = []
    for obj in formset.new_objects:
        membership, _ = membership_set(actor=actor, team=obj.team, user=obj.user, role=obj.role)
        saved.append(membership)
    formset.new_objects = saved
    for obj, _fields in sorted(formset.changed_objects,
                               key=lambda change: change[0].role != Role.TEAM_ADMIN):
        membership_set(actor=actor, team=obj.team, user=obj.user, role=obj.role)
    for obj in formset.deleted_objects:
        membership_remove(actor=actor, membership=obj)


class MembershipForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = Membership
        fields = ["user", "team", "role"]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.instance.pk is not None:
            for name in ("user", "team"):
                if name in self.changed_data:
                    self.add_error(name, "A membership cannot move to another user or team; "
                                         "delete it and add a new one.")
        return cleaned


class MembershipFormSet(BaseInlineFormSet):  # type: ignore[type-arg]
    def clean(self) -> None:
        """Refuse, before anything is saved, a set of changes that leaves a team that has
        a team admin with none (the last-admin rule of accounts.services)."""
        super().clean()
        if any(self.errors):
            return
        leaving: dict[Team, set[int]] = defaultdict(set)
        joining: dict[Team, set[int]] = defaultdict(set)
        for form in self.forms:
            inst = form.instance
            if inst.team_id is None or inst.user_id is None:
                continue  # an empty extra row, or a row of a team not created yet
            was = form.initial.get("role") if inst.pk is not None else None
            now = None if form in self.deleted_forms else form.cleaned_data.get("role")
            if was == Role.TEAM_ADMIN and now != Role.TEAM_ADMIN:
                leaving[inst.team].add(inst.user_id)
            elif now == Role.TEAM_ADMIN and was != Role.TEAM_ADMIN:
                joining[inst.team].add(inst.user_id)
        for team, user_ids in leaving.items():
            try:
                membership_check_keeps_admin(team=team, leaving_user_ids=user_ids,
                                             joining_user_ids=joining[team])
            except Conflict as exc:
                raise ValidationError(exc.message) from exc


class MembershipInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Membership
    form = MembershipForm
    formset = MembershipFormSet
    extra = 0
    autocomplete_fields = ["user"]


class TeamAdminForm(forms.ModelForm):  # type: ignore[type-arg]
    """Rule Q8 on a parent change: under its new parent the team's nominals fit in each
    department's own quota row above it (as `team_update` checks it)."""

    class Meta:
        model = Team
        fields = ["slug", "name", "parent"]  # the admin passes its fieldsets' fields

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        old = self.instance
        parent = data.get("parent")
        if not old.pk or "parent" not in data or old.parent_id == (parent.pk if parent else None):
            return data
        hierarchy_lock()  # the admin saves in the same transaction
        for message in carve_problems(parent=(old.slug, parent.slug if parent else None)):
            self.add_error("parent", message)
        return data


@admin.register(Team)
class TeamAdmin(AuditedAdmin):
    form = TeamAdminForm
    list_display = ["slug", "name", "weight", "parent", "run_as_non_root", "any_member_may_cancel"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]
    fieldsets = [
        (None, {"fields": ["slug", "name", "weight", "parent", "run_as_non_root",
                           "any_member_may_cancel", "flavor_fallback"]}),
        ("Resources per replica: defaults and maxima (the API and the team page take "
         "quantities such as 16Gi)", {"fields": [
             f"{kind}_{column}" for column in TEAM_RESOURCE_FIELDS.values()
             for kind in ("default", "max")]}),
        ("Names of the team's namespace its jobs may use (JSON lists, e.g. [\"imagenet\"])",
         {"fields": list(TEAM_ALLOWLIST_FIELDS)}),
    ]


class MembershipAdminForm(MembershipForm):
    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        inst = self.instance
        if (inst.pk is not None and self.initial.get("role") == Role.TEAM_ADMIN
                and cleaned.get("role") != Role.TEAM_ADMIN):
            try:
                membership_check_keeps_admin(team=inst.team, leaving_user_ids=[inst.user_id])
            except Conflict as exc:
                raise ValidationError(exc.message) from exc
        return cleaned


@admin.register(Membership)
class MembershipAdmin(AuditedAdmin):
    """Saves and deletes go through the membership services (audited there, last-admin rule)."""

    form = MembershipAdminForm
    list_display = ["user", "team", "role"]
    list_filter = ["role", "team"]
    autocomplete_fields = ["user", "team"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return ["user", "team"] if obj is not None else []

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        membership, _ = membership_set(actor=request.user, team=obj.team, user=obj.user,
                                       role=obj.role)
        obj.pk = membership.pk

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        membership_remove(actor=request.user, membership=obj)


@admin.register(ServiceAccount)
class ServiceAccountAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["team", "name", "user", "created_at"]
    readonly_fields = ["user"]


@admin.register(ApiToken)
class ApiTokenAdmin(AuditedAdmin):
    """Tokens are issued by `manage.py issue_token` or the API (the secret is shown once);
    the admin lists and revokes them but never shows or sets a secret. Revoking goes
    through the service (audited); `revoked_at` is not editable, so a revoked token
    cannot be brought back."""

    list_display = ["prefix", "name", "user", "created_at", "expires_at", "revoked_at", "last_used_at"]
    readonly_fields = ["prefix", "key_hash", "user", "created_at", "revoked_at", "last_used_at"]
    search_fields = ["prefix", "user__username", "name"]
    actions = ["revoke_tokens"]
    audit_exclude = ("key_hash",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke_tokens(self, request: HttpRequest, queryset: Any) -> None:
        actor: Any = request.user
        revoked = 0
        for token in queryset:
            if token.revoked_at is None:
                token_revoke(token=token, actor=actor)
                revoked += 1
        self.message_user(request, f"{revoked} token(s) revoked.", messages.SUCCESS)


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["at", "actor", "ip", "action", "object_type", "object_repr"]
    list_filter = ["action", "object_type"]
    readonly_fields = [f.name for f in AuditEntry._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
