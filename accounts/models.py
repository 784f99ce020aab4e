"""Teams, memberships, API tokens and the audit log."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.db.models import F, Q

from queueing.validation import allowlist_problem, notify_prefixes_problem

slug_validator = RegexValidator(
    # \Z, not $: `$` would also take "red\n".
    r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?\Z",
    "Use 1-40 lower-case letters, digits or '-', starting and ending with a letter or digit "
    "(it becomes part of Kubernetes names).",
)


# A team's resource policy: field suffixes of Team's `default_*` and `max_*` columns, by
# the name jobs use (`resources` keys and `shm_size`).
TEAM_RESOURCE_FIELDS = {"cpu": "cpu_millicores", "memory": "memory_bytes",
                        "ephemeral_storage": "ephemeral_storage_bytes",
                        "shm_size": "shm_size_bytes"}

def allowlist_validator(value: Any) -> None:
    """A team allowlist: distinct Kubernetes names of the team's own namespace."""
    problem = allowlist_problem(value)
    if problem:
        raise ValidationError(problem, code="allowlist")


def notify_prefixes_validator(value: Any) -> None:
    """A team's notify URL allowlist (docs/webhooks.md)."""
    problem = notify_prefixes_problem(value)
    if problem:
        raise ValidationError(problem, code="allowlist")


# A team's allowlists (Team fields), by the name the API gives them.
TEAM_ALLOWLIST_FIELDS = ("allowed_pvcs", "allowed_secrets", "allowed_pull_secrets")

# Team.flavor_fallback's values besides "" (the tier's): queueing.models'
# FLAVOR_FALLBACK_CHOICES, the tier's (the policy's FlavorFallback).
TEAM_FLAVOR_FALLBACK_CHOICES = [("borrow", "borrow in a preferred type first"),
                                ("next_type", "try the next type's own quota first")]

_MILLI = "Per replica, in millicores (1000 = one CPU); empty: none."
_BYTES = "Per replica, in bytes (17179869184 = 16Gi); empty: none."


class Team(models.Model):
    slug = models.CharField(max_length=40, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    weight = models.FloatField(
        default=1.0,
        validators=[MinValueValidator(0.0001)],
        help_text="Fair-share weight (> 0): the team's share is weight / sum of weights.",
    )
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="children",
        help_text="Optional parent (a department) for hierarchical fair-share.",
    )
    # Teams created from now on run non-root; the migration that added the field left
    # existing teams as they ran (False), so no running pipeline broke (docs/kubernetes.md).
    # db_default too: rows written by code that predates the field (a rolling upgrade,
    # an older migration's historical model) get the same default.
    # Jobs accepting several GPU types (docs/scheduling.md, "Several GPU types"): whether
    # a preferred type is borrowed in before the next type is tried; "" = the tier's.
    flavor_fallback = models.CharField(
        max_length=16, blank=True, default="", db_default="",
        choices=TEAM_FLAVOR_FALLBACK_CHOICES,
        help_text="Empty: each tier's setting.",
    )
    run_as_non_root = models.BooleanField(
        default=True, db_default=True,
        help_text="The team's pods run with runAsNonRoot (the image's user must not be root) "
                  "and its namespace enforces the 'restricted' Pod Security level; "
                  "otherwise 'baseline'.",
    )
    # Workload policy (docs/api.md, "Resources"): per replica, the default a job gets when
    # it names none and the most it may ask, normalised (millicores, bytes). NULL: no
    # default / no maximum. Set by team admins and staff (team_resources_set, audited).
    default_cpu_millicores = models.BigIntegerField(null=True, blank=True, help_text=_MILLI)
    max_cpu_millicores = models.BigIntegerField(null=True, blank=True, help_text=_MILLI)
    default_memory_bytes = models.BigIntegerField(null=True, blank=True, help_text=_BYTES)
    max_memory_bytes = models.BigIntegerField(null=True, blank=True, help_text=_BYTES)
    default_ephemeral_storage_bytes = models.BigIntegerField(null=True, blank=True,
                                                             help_text=_BYTES)
    max_ephemeral_storage_bytes = models.BigIntegerField(null=True, blank=True, help_text=_BYTES)
    default_shm_size_bytes = models.BigIntegerField(null=True, blank=True, help_text=_BYTES)
    max_shm_size_bytes = models.BigIntegerField(null=True, blank=True, help_text=_BYTES)
    # Which PVCs, Secrets and image pull secrets of the team's namespace its jobs may
    # name (docs/kubernetes.md, "Volumes and secrets"): explicit lists team admins and
    # staff set (team_workload_policy_set, audited), so a submit is decided without
    # asking the cluster. Empty: none. (db_default: rows written by code that predates
    # the fields, a rolling upgrade or an older migration's historical model.)
    allowed_pvcs = models.JSONField(
        default=list, db_default=[], blank=True, validators=[allowlist_validator],
        help_text='PersistentVolumeClaims its jobs may mount, e.g. ["imagenet", "ckpt"].')
    allowed_secrets = models.JSONField(
        default=list, db_default=[], blank=True, validators=[allowlist_validator],
        help_text="Secrets its jobs may read (as env or files).")
    allowed_pull_secrets = models.JSONField(
        default=list, db_default=[], blank=True, validators=[allowlist_validator],
        help_text="Image pull secrets its jobs may name.")
    # docs/webhooks.md: a job's `notify_url` must start with one of these.
    allowed_notify_url_prefixes = models.JSONField(
        default=list, db_default=[], blank=True, validators=[notify_prefixes_validator],
        help_text='URL prefixes its jobs\' notify_url may start with, e.g. '
                  '["https://ci.example.com/hooks/"].')
    # Who may cancel the team's jobs (docs/api.md, "Who may cancel"): the submitter, the
    # team's admins and staff; with this on, every member too. Set by team admins and
    # staff (team_update, audited).
    any_member_may_cancel = models.BooleanField(
        default=False, db_default=False,
        help_text="Every member may cancel any job of the team; off: only the job's "
                  "submitter, the team's admins and staff may.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.CheckConstraint(condition=Q(weight__gt=0), name="team_weight_gt_0"),
            *[models.CheckConstraint(
                condition=Q(**{f"{kind}_{r}__isnull": True}) | Q(**{f"{kind}_{r}__gte": 1}),
                name=f"team_{kind}_{r}_gte_1")
              for r in TEAM_RESOURCE_FIELDS.values() for kind in ("default", "max")],
            *[models.CheckConstraint(
                condition=Q(**{f"default_{r}__isnull": True}) | Q(**{f"max_{r}__isnull": True})
                | Q(**{f"default_{r}__lte": F(f"max_{r}")}),
                name=f"team_default_{r}_lte_max")
              for r in TEAM_RESOURCE_FIELDS.values()],
        ]

    def __str__(self) -> str:
        return self.slug

    def clean(self) -> None:
        """Rule F4: the hierarchy is a forest. A team cannot be its own parent nor the
        parent of any of its ancestors (A -> B -> A). One query per level above."""
        super().clean()
        if self.parent_id is None or self.pk is None:
            return  # a new team has no descendants yet
        if self.parent_id == self.pk:
            raise ValidationError({"parent": ValidationError(
                "A team cannot be its own parent.", code="parent_cycle")})
        seen: set[int] = set()
        ancestor: int | None = self.parent_id
        while ancestor is not None and ancestor not in seen:  # `seen`: a cycle above (raw SQL)
            if ancestor == self.pk:
                raise ValidationError({"parent": ValidationError(
                    f"{self.parent} is below {self.slug} in the hierarchy: a team cannot "
                    "be its own ancestor.", code="parent_cycle")})
            seen.add(ancestor)
            ancestor = Team.objects.filter(pk=ancestor).values_list("parent_id", flat=True).first()


class Role(models.TextChoices):
    MEMBER = "member", "Member"
    TEAM_ADMIN = "team-admin", "Team admin"


class Membership(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=20, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "team"], name="one_membership_per_user_team")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class ServiceAccount(models.Model):
    """A pipeline identity of one team: a user with no password, a member of the team."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="service_accounts")
    name = models.CharField(max_length=40, validators=[slug_validator])
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="service_account"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="one_service_account_name")
        ]

    def __str__(self) -> str:
        return f"{self.team.slug}/{self.name}"


class ApiToken(models.Model):
    """An API token. The secret is shown once; only its SHA-256 is stored.

    A key reads `fq_<prefix>_<secret>`; the prefix finds the row, the hash proves it.
    SHA-256 (not a slow password hash) is right for 190 random bits.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, default="default")
    prefix = models.CharField(max_length=12, unique=True)
    key_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @staticmethod
    def hash_key(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()

    def is_active(self, now: datetime) -> bool:
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or self.expires_at > now


class AuditEntry(models.Model):
    """Who changed what configuration, when: old -> new values per field."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    action = models.CharField(max_length=20)  # create | update | delete
    object_type = models.CharField(max_length=100)
    object_id = models.CharField(max_length=64)
    object_repr = models.CharField(max_length=200)
    changes = models.JSONField(default=dict, help_text="field -> [old, new]")
    ip = models.GenericIPAddressField(
        null=True, blank=True, help_text="The client's address (accounts.client_ip); "
                                         "empty outside a web request")

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M} {self.actor} {self.action} {self.object_repr}"


class IdempotencyRecord(models.Model):
    """The first response to a POST carrying an `Idempotency-Key`, replayed for retries.

    Claimed (status_code NULL) before the view runs, so a concurrent retry with the same
    key gets 409 instead of doing the work twice; filled in after the view answers.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="idempotency_records"
    )
    key = models.CharField(max_length=200)
    fingerprint = models.CharField(max_length=64, help_text="SHA-256 of method, path and body")
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    body = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "key"], name="one_idempotency_record_per_key")
        ]

    def __str__(self) -> str:
        return f"{self.user_id}:{self.key} -> {self.status_code}"
