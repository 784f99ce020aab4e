from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db import models, transaction
from django.http import HttpRequest

from .models import ApiToken, AuditEntry, Membership, ServiceAccount, Team
from .services import audit_record, model_changes


class AuditedAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Every save and delete through the admin writes an AuditEntry (who, when, old → new)
    in the same transaction as the change."""

    def save_model(self, request: HttpRequest, obj: models.Model, form: Any, change: bool) -> None:
        with transaction.atomic():
            old = type(obj)._default_manager.filter(pk=obj.pk).first() if change else None
            super().save_model(request, obj, form, change)
            changes = model_changes(old, obj)
            if changes:
                audit_record(actor=request.user, action="update" if change else "create",  # type: ignore[arg-type]
                             instance=obj, changes=changes)

    def delete_model(self, request: HttpRequest, obj: models.Model) -> None:
        with transaction.atomic():
            audit_record(actor=request.user, action="delete", instance=obj,  # type: ignore[arg-type]
                         changes={k: [v[1], None] for k, v in model_changes(None, obj).items()})
            super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for obj in queryset:
            self.delete_model(request, obj)


class MembershipInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(AuditedAdmin):
    list_display = ["slug", "name", "weight", "parent"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(AuditedAdmin):
    list_display = ["user", "team", "role"]
    list_filter = ["role", "team"]
    autocomplete_fields = ["user", "team"]


@admin.register(ServiceAccount)
class ServiceAccountAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["team", "name", "user", "created_at"]
    readonly_fields = ["user"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Tokens are issued by `manage.py issue_token` or the API (the secret is shown once);
    the admin lists and revokes them but never shows or sets a secret."""

    list_display = ["prefix", "name", "user", "created_at", "expires_at", "revoked_at", "last_used_at"]
    readonly_fields = ["prefix", "key_hash", "user", "created_at", "last_used_at"]
    search_fields = ["prefix", "user__username", "name"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["at", "actor", "action", "object_type", "object_repr"]
    list_filter = ["action", "object_type"]
    readonly_fields = [f.name for f in AuditEntry._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
