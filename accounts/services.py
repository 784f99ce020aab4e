"""State changes of accounts: tokens, service accounts, memberships, audit."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.db import models, transaction
from django.utils import timezone

from .models import ApiToken, AuditEntry, Membership, Role, ServiceAccount, Team


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    key: str  # the secret: shown once, never stored


@transaction.atomic
def token_issue(
    *, user: User, name: str = "default", expires_at: datetime | None = None
) -> IssuedToken:
    """Create a token for `user`; the returned key is the only copy of the secret."""
    prefix = secrets.token_hex(4)
    key = f"fq_{prefix}_{secrets.token_urlsafe(24)}"
    token = ApiToken.objects.create(
        user=user, name=name, prefix=prefix, key_hash=ApiToken.hash_key(key),
        expires_at=expires_at,
    )
    audit_record(actor=None, action="create", instance=token, changes={"user": [None, str(user)]})
    return IssuedToken(token=token, key=key)


@transaction.atomic
def token_revoke(*, token: ApiToken, actor: User | None) -> None:
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        audit_record(actor=actor, action="update", instance=token,
                     changes={"revoked_at": [None, token.revoked_at.isoformat()]})


@transaction.atomic
def service_account_create(
    *, team: Team, name: str, actor: User | None = None
) -> ServiceAccount:
    """A pipeline identity for `team`: a password-less user who is a member of the team."""
    user_model = get_user_model()
    user = user_model.objects.create(username=f"sa-{team.slug}-{name}")
    user.set_unusable_password()
    user.save(update_fields=["password"])
    Membership.objects.create(user=user, team=team, role=Role.MEMBER)
    sa = ServiceAccount.objects.create(team=team, name=name, user=user)
    audit_record(actor=actor, action="create", instance=sa, changes={"team": [None, team.slug]})
    return sa


def _jsonable(value: Any) -> Any:
    if isinstance(value, models.Model):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if value is None or isinstance(value, (bool, int, float, str, list, dict)):
        return value
    return str(value)


def model_changes(old: models.Model | None, new: models.Model) -> dict[str, list[Any]]:
    """field -> [old, new] for the concrete fields that differ (all of them for a create)."""
    changes: dict[str, list[Any]] = {}
    for f in new._meta.concrete_fields:
        if f.primary_key:
            continue
        after = getattr(new, f.attname)
        before = getattr(old, f.attname) if old is not None else None
        if old is None or before != after:
            changes[f.name] = [_jsonable(before), _jsonable(after)]
    return changes


def audit_record(
    *, actor: User | None, action: str, instance: models.Model,
    changes: dict[str, list[Any]],
) -> AuditEntry:
    return AuditEntry.objects.create(
        actor=actor if actor is not None and actor.is_authenticated else None,
        action=action,
        object_type=instance._meta.label,
        object_id=str(instance.pk),
        object_repr=str(instance)[:200],
        changes=changes,
    )
