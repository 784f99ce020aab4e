"""State changes of accounts: tokens, service accounts, memberships, audit."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, models, transaction
from django.utils import timezone

from queueing import validation as v
from queueing.errors import Conflict, DomainError
from queueing.selectors.quota_tree import carve_problems
from queueing.services.access import check_staff, check_team_admin

from .client_ip import current_client_ip
from .models import (
    TEAM_ALLOWLIST_FIELDS,
    TEAM_RESOURCE_FIELDS,
    ApiToken,
    AuditEntry,
    IdempotencyRecord,
    Membership,
    Role,
    ServiceAccount,
    Team,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    key: str  # the secret: shown once, never stored


KEY_SHOWN_ONCE = ("The key was shown once, in the answer that created this token, and is "
                  "stored nowhere; if it is lost, revoke the token and issue a new one.")


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
    """Revoke `token`; `actor` must be its owner or staff (PermissionDenied otherwise)."""
    if actor is not None and actor.pk != token.user_id:
        check_staff(actor=actor)
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        audit_record(actor=actor, action="update", instance=token,
                     changes={"revoked_at": [None, token.revoked_at.isoformat()]})


TOKEN_TOUCH_SECONDS = 60  # last_used_at moves at most this often: a write per request is waste


def token_touch(*, token: ApiToken, now: datetime) -> None:
    """Record that `token` authenticated at `now`: `last_used_at`, written at most once per
    TOKEN_TOUCH_SECONDS (the object is updated too, so a token a process remembers is not
    written again within the minute)."""
    last = token.last_used_at
    if last is not None and (now - last).total_seconds() <= TOKEN_TOUCH_SECONDS:
        return
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    token.last_used_at = now


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
        ip=current_client_ip(),
    )


M = TypeVar("M", bound=models.Model)


def audited_upsert(*, actor: Any, model: type[M], lookup: dict[str, Any],
                   values: dict[str, Any]) -> tuple[M, bool]:
    """The row of `model` that `lookup` names, created or changed to `values` (locked
    while it changes, checked by `full_clean`), with an audit entry of the fields that
    changed. Returns (row, created). Run it inside `transaction.atomic`; the caller has
    checked who may do it."""
    row = model._default_manager.select_for_update().filter(**lookup).first()
    before = model._default_manager.get(pk=row.pk) if row is not None else None
    created = row is None
    if row is None:
        row = model(**lookup)
    for name, value in values.items():
        setattr(row, name, value)
    row.full_clean()
    row.save()
    audit_record(actor=actor, action="create" if created else "update", instance=row,
                 changes=model_changes(before, row))
    return row, created


IDEMPOTENCY_TTL_SECONDS = 24 * 3600


@dataclass(frozen=True)
class IdempotencyClaim:
    """The outcome of claiming a key: `record` is ours to fill when `replay` is None;
    otherwise `replay` is the earlier record (finished, or still in progress)."""

    record: Any
    replay: Any = None


def idempotency_claim(
    *, user: User, key: str, fingerprint: str, now: datetime | None = None
) -> IdempotencyClaim:
    """Claim `key` for `user` before the request does its work. A record older than a day
    is forgotten and claimed afresh. Two racing requests: the unique constraint lets one
    win; the other sees its record (in progress) and must not do the work."""

    now = now or timezone.now()
    for _ in range(2):
        existing = IdempotencyRecord.objects.filter(user=user, key=key).first()
        if existing is not None:
            if (now - existing.created_at).total_seconds() < IDEMPOTENCY_TTL_SECONDS:
                return IdempotencyClaim(record=None, replay=existing)
            existing.delete()
        try:
            with transaction.atomic():
                record = IdempotencyRecord.objects.create(
                    user=user, key=key, fingerprint=fingerprint, created_at=now
                )
            return IdempotencyClaim(record=record)
        except IntegrityError:
            continue  # a concurrent request claimed it first: read theirs
    existing = IdempotencyRecord.objects.get(user=user, key=key)
    return IdempotencyClaim(record=None, replay=existing)


def idempotency_complete(*, record: Any, status_code: int, body: Any) -> None:
    """Remember the response so retries get it back."""
    type(record).objects.filter(pk=record.pk).update(status_code=status_code, body=body)


def idempotency_release(*, record: Any) -> None:
    """Forget a claim whose request failed for reasons worth retrying (5xx, throttled)."""
    type(record).objects.filter(pk=record.pk).delete()


def idempotency_purge(*, now: datetime, batch: int = 10_000) -> int:
    """Delete the records past IDEMPOTENCY_TTL_SECONDS (a claim reads them as gone
    already), in batches so a large backlog never holds long locks; returns how many.
    Beat runs it hourly (`idempotency-purge`)."""

    cutoff = now - timedelta(seconds=IDEMPOTENCY_TTL_SECONDS)
    deleted = 0
    while True:
        ids = list(IdempotencyRecord.objects.filter(created_at__lt=cutoff)
                   .values_list("pk", flat=True)[:batch])
        if not ids:
            return deleted
        deleted += IdempotencyRecord.objects.filter(pk__in=ids).delete()[0]


@transaction.atomic
def team_create(
    *, actor: Any, slug: str, name: str, weight: float = 1.0,
    parent: Team | None = None, run_as_non_root: bool = True,
) -> Team:
    """A new team; `actor` must be staff (PermissionDenied otherwise)."""
    if actor is not None:
        check_staff(actor=actor)
    team = Team(slug=slug, name=name, weight=weight, parent=parent,
                run_as_non_root=run_as_non_root)
    team.full_clean()
    team.save()
    audit_record(actor=actor, action="create", instance=team, changes=model_changes(None, team))
    return team


# The team fields its team admins may change as well as staff (`team_update`).
TEAM_ADMIN_FIELDS = frozenset({"any_member_may_cancel", "flavor_fallback"})

_TEAM_HIERARCHY_LOCK = 0x66717465616D73  # "fqteams": serializes parent and quota changes


def hierarchy_lock() -> None:
    """Take turns with every other change of the team tree's shape or its quotas (a
    transaction-scoped PostgreSQL advisory lock; nothing on SQLite, which writes one at
    a time): a parent change (rule F4) and a quota change (rule Q8) each check the tree
    as the other left it, never two at once against the same old state."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", [_TEAM_HIERARCHY_LOCK])


@transaction.atomic
def team_update(*, actor: Any, team: Team, **fields: Any) -> Team:
    """Change `name`, `weight`, `parent`, `run_as_non_root`, `any_member_may_cancel`
    (who may cancel its jobs: docs/api.md, "Who may cancel") or `flavor_fallback` (its
    jobs of several GPU types: docs/scheduling.md, "Several GPU types") of a team,
    audited field by field.

    Parent changes take turns (a transaction-scoped PostgreSQL advisory lock): two
    concurrent moves, A under B and B under A, each pass Team.clean() against the other's
    uncommitted state; without the turn PostgreSQL aborts one of them as a deadlock (a
    500), with it the second sees the first and is refused like any cycle (a 400).
    A new parent must also hold the team's nominals (rule Q8: each department above it
    with a quota row of a type holds its teams' nominals of that type): ValidationError
    on `parent` otherwise, nothing written.

    `actor` must be staff, or a team admin of the team when only `TEAM_ADMIN_FIELDS`
    change (PermissionDenied otherwise)."""
    if actor is not None:
        if set(fields) <= TEAM_ADMIN_FIELDS:
            check_team_admin(actor=actor, team=team)
        else:
            check_staff(actor=actor)
    if "parent" in fields:
        hierarchy_lock()
    before = Team.objects.select_for_update().get(pk=team.pk)
    for name, value in fields.items():
        if name not in {"name", "weight", "parent", "run_as_non_root", *TEAM_ADMIN_FIELDS}:
            raise ValueError(f"team field {name!r} cannot be changed")
        setattr(team, name, value)
    team.full_clean()
    if "parent" in fields and team.parent_id != before.parent_id:
        # Rule Q8: under its new parent, the team's nominals must fit in each
        # department's own quota row above it.
        problems = carve_problems(parent=(team.slug, team.parent.slug if team.parent else None))
        if problems:
            raise ValidationError({"parent": problems})
    team.save()
    audit_record(actor=actor, action="update", instance=team, changes=model_changes(before, team))
    return team


def team_resources(team: Team) -> dict[str, Any]:
    """The team's workload policy as the API and the team page show it: `default_<name>`
    and `max_<name>` for cpu, memory, ephemeral_storage and shm_size, each a Kubernetes
    quantity or None (no default, no maximum); and its allowlists (`allowed_pvcs`,
    `allowed_secrets`, `allowed_pull_secrets`: lists of names)."""
    out: dict[str, Any] = {}
    for name, column in TEAM_RESOURCE_FIELDS.items():
        for kind in ("default", "max"):
            amount = getattr(team, f"{kind}_{column}")
            out[f"{kind}_{name}"] = None if amount is None else v.format_resource(name, amount)
    for field in TEAM_ALLOWLIST_FIELDS:
        out[field] = list(getattr(team, field) or [])
    out["allowed_notify_url_prefixes"] = list(team.allowed_notify_url_prefixes or [])
    return out


team_workload_policy = team_resources


TEAM_RESOURCE_KEYS = tuple(f"{kind}_{name}" for name in TEAM_RESOURCE_FIELDS
                           for kind in ("default", "max"))


@transaction.atomic
def team_resources_set(*, actor: Any, team: Team, **quantities: Any) -> Team:
    """Set some of the team's workload policy, audited field by field in the same
    transaction: resource defaults and maxima (`TEAM_RESOURCE_KEYS`: a quantity, or None
    / "" to clear) and allowlists (`TEAM_ALLOWLIST_FIELDS`: a list of names of the team's
    namespace, replacing the old one; `allowed_notify_url_prefixes`, the URL prefixes
    jobs' `notify_url` may start with, docs/webhooks.md). A default above its maximum (as
    set now or before) is refused. Raises DomainError (400) naming every refused key, changing nothing.
    `actor` must be a team admin of `team` or staff (PermissionDenied otherwise). Jobs
    already submitted keep theirs."""
    if actor is not None:
        check_team_admin(actor=actor, team=team)
    before = Team.objects.select_for_update().get(pk=team.pk)
    team = Team.objects.get(pk=team.pk)
    problems: dict[str, list[str]] = {}
    for key, text in quantities.items():
        if key == "allowed_notify_url_prefixes":  # docs/webhooks.md
            problem = v.notify_prefixes_problem(text)
            if problem:
                problems[key] = [problem]
            else:
                team.allowed_notify_url_prefixes = sorted(text)
            continue
        if key in TEAM_ALLOWLIST_FIELDS:
            problem = v.allowlist_problem(text)
            if problem:
                problems[key] = [problem]
            else:
                setattr(team, key, sorted(text))
            continue
        if key not in TEAM_RESOURCE_KEYS:
            raise ValueError(f"team field {key!r} cannot be changed")
        kind, _, name = key.partition("_")
        try:
            amount = None if text in (None, "") else v.parse_resource(name, text)
        except ValueError as exc:
            problems[key] = [str(exc)]
            continue
        setattr(team, f"{kind}_{TEAM_RESOURCE_FIELDS[name]}", amount)
    for name, column in TEAM_RESOURCE_FIELDS.items():
        default, most = getattr(team, f"default_{column}"), getattr(team, f"max_{column}")
        if not problems and default is not None and most is not None and default > most:
            problems[f"default_{name}"] = [
                f"The default {v.format_resource(name, default)} is above the maximum "
                f"{v.format_resource(name, most)}."]
    if problems:
        raise DomainError("The request has invalid fields.", fields=problems)
    team.save()
    audit_record(actor=actor, action="update", instance=team, changes=model_changes(before, team))
    return team


team_workload_policy_set = team_resources_set


LAST_TEAM_ADMIN_MESSAGE = "team {slug} would have no team admin; make someone else team-admin first"


def membership_check_keeps_admin(
    *, team: Team, leaving_user_ids: Collection[int], joining_user_ids: Collection[int] = (),
) -> None:
    """The last-admin rule: a team that has a team admin keeps one. Raises Conflict (and changes
    nothing) when the team's team admins, minus `leaving_user_ids` (removed or demoted),
    plus `joining_user_ids` (added or promoted), would be none. It applies to everyone,
    staff included: staff promote someone else first. A team that has no team admin yet
    (a new team) may gain and lose members freely.

    Takes no lock: the membership services call it with the team row locked; the admin's
    membership form calls it to show the error before anything is saved."""
    admins = set(Membership.objects.filter(team=team, role=Role.TEAM_ADMIN)
                 .values_list("user_id", flat=True))
    if admins and not ((admins - set(leaving_user_ids)) | set(joining_user_ids)):
        raise Conflict(LAST_TEAM_ADMIN_MESSAGE.format(slug=team.slug))


def _lock_team(team: Team) -> None:
    # Membership changes of one team take turns on the team row: two admins demoting each
    # other at once would otherwise each see the other one remain, and leave none.
    Team.objects.select_for_update().filter(pk=team.pk).exists()


@transaction.atomic
def membership_set(
    *, actor: Any, team: Team, user: User, role: str
) -> tuple[Membership, bool]:
    """Add `user` to `team` with `role`, or change the role of a member. (membership, created).
    Demoting the team's last team admin raises Conflict (the last-admin rule). `actor` must
    be a team admin of `team` or staff (PermissionDenied otherwise)."""
    if actor is not None:
        check_team_admin(actor=actor, team=team)
    _lock_team(team)
    membership = Membership.objects.select_for_update().filter(team=team, user=user).first()
    if membership is None:
        membership = Membership.objects.create(team=team, user=user, role=role)
        audit_record(actor=actor, action="create", instance=membership,
                     changes={"team": [None, team.slug], "user": [None, str(user)],
                              "role": [None, role]})
        return membership, True
    if membership.role != role:
        if membership.role == Role.TEAM_ADMIN:
            membership_check_keeps_admin(team=team, leaving_user_ids=[user.pk])
        old = membership.role
        membership.role = role
        membership.save(update_fields=["role"])
        audit_record(actor=actor, action="update", instance=membership,
                     changes={"role": [old, role]})
    return membership, False


@transaction.atomic
def membership_remove(*, actor: Any, membership: Membership) -> None:
    """Remove a membership (the member themselves may be the actor). Removing the team's
    last team admin raises Conflict (the last-admin rule); a membership already gone is a no-op.
    `actor` must be a team admin of the team or staff (PermissionDenied otherwise)."""
    team = membership.team
    if actor is not None:
        check_team_admin(actor=actor, team=team)
    _lock_team(team)
    current = Membership.objects.select_for_update().filter(pk=membership.pk).first()
    if current is None:
        return
    if current.role == Role.TEAM_ADMIN:
        membership_check_keeps_admin(team=team, leaving_user_ids=[current.user_id])
    current.team = team
    audit_record(actor=actor, action="delete", instance=current,
                 changes={"team": [team.slug, None], "user": [str(current.user), None],
                          "role": [current.role, None]})
    current.delete()


# --- single sign-on (docs/deployment.md, "Single sign-on") ------------------------------

@dataclass(frozen=True)
class SsoTeams:
    """What the identity provider's groups claim says: role per team slug, and whether
    the user is fairq staff (in the staff group, FAIRQ_OIDC_STAFF_GROUP)."""

    roles: dict[str, str]
    staff: bool = False


def sso_teams_from_groups(
    groups: Collection[str], *, prefix: str, admin_suffix: str, staff_group: str = "",
) -> SsoTeams:
    """Map a groups claim to teams: a group `<prefix><team slug>` makes a member,
    `<prefix><team slug><admin_suffix>` a team admin (admin wins when both are there).
    Groups without the prefix are someone else's; teams that do not exist are ignored
    (sign-on never creates teams). The group named exactly `staff_group` (when set) makes
    fairq staff; it is matched whole, never as a team."""
    staff = bool(staff_group) and staff_group in groups
    roles: dict[str, str] = {}
    for group in groups:
        if not isinstance(group, str) or not group.startswith(prefix):
            continue
        name = group[len(prefix):]
        role = Role.MEMBER
        if admin_suffix and name.endswith(admin_suffix):
            name, role = name[: -len(admin_suffix)], Role.TEAM_ADMIN
        if name and roles.get(name) != Role.TEAM_ADMIN:
            roles[name] = role
    existing = set(Team.objects.filter(slug__in=roles).values_list("slug", flat=True))
    return SsoTeams(roles={slug: role for slug, role in roles.items() if slug in existing},
                    staff=staff)


def sso_user_sync(
    *, username: str, email: str, first_name: str, last_name: str, teams: SsoTeams,
    user: User | None, sync_staff: bool = False,
) -> User | None:
    """Create (user None) or update a single-sign-on user, and make their memberships the
    ones `teams` names: added, role changed, removed (each audited, actor: the system).
    With `sync_staff` (a staff group is configured), staff rights follow the claim too:
    granted in the group, taken away outside it. Superusers are never made by sign-on.
    An SSO user has no usable password. A removal or demotion the last-admin rule refuses
    is kept (logged). Returns None, changing nothing, when `username` is taken by an
    account with a password: sign-on never takes over a password (break-glass) account."""
    with transaction.atomic():
        if user is None:
            if get_user_model().objects.filter(username=username).exists():
                log.warning("sso: %r is a password account; single sign-on refused", username)
                return None
            user = get_user_model().objects.create_user(
                username=username, email=email, first_name=first_name, last_name=last_name)
            user.set_unusable_password()
            user.save(update_fields=["password"])
            audit_record(actor=None, action="create", instance=user,
                         changes={"username": [None, username], "via": [None, "sso"]})
        wanted: dict[str, Any] = {"email": email, "first_name": first_name,
                                  "last_name": last_name}
        if sync_staff:
            wanted["is_staff"] = teams.staff
        changes = {f: [getattr(user, f), new] for f, new in wanted.items()
                   if getattr(user, f) != new}
        if changes:
            for field, (_, new) in changes.items():
                setattr(user, field, new)
            user.save(update_fields=list(changes))
            audit_record(actor=None, action="update", instance=user, changes=changes)
        current = {m.team.slug: m for m in Membership.objects.filter(user=user)
                   .select_related("team")}
        for slug, membership in current.items():
            if slug not in teams.roles:
                try:
                    with transaction.atomic():
                        membership_remove(actor=None, membership=membership)
                except Conflict as exc:
                    log.warning("sso: %s keeps %s: %s", username, slug, exc)
        for team in Team.objects.filter(slug__in=teams.roles).order_by("slug"):
            try:
                with transaction.atomic():
                    membership_set(actor=None, team=team, user=user, role=teams.roles[team.slug])
            except Conflict as exc:
                log.warning("sso: %s keeps their role in %s: %s", username, team.slug, exc)
    return user
