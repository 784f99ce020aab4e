"""`manage.py check --database default`: rows whose names Kubernetes would refuse; and
`check --deploy`: no registry allow-list (`registry_allowlist_check`, fairq.W002).

Tier.priority_class_name (a PriorityClass name), Tier.slug (a label value) and Team.slug
(part of a namespace name) are validated in the models since migration 0004, but rows
written before, or by code that skips `full_clean` (`update()`, raw SQL), may break the
rules. They are reported, not rewritten: renaming a tier's class or a team's namespace
is an operator's decision. `sync_cluster` reports the same objects as failed and syncs
the rest.
"""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import ValidationError


def _problem(value: str, validators: Any) -> str | None:
    for validator in validators:
        try:
            validator(value)
        except ValidationError as exc:
            return "; ".join(exc.messages)
    return None


@checks.register(checks.Tags.database)
def kubernetes_names(databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """One error per Tier or Team row with a name the cluster would refuse."""
    if not databases:
        return []
    from django.db import DatabaseError

    from accounts.models import Team, slug_validator
    from queueing.models import Tier, priority_class_name_validators

    out: list[checks.CheckMessage] = []
    try:
        tiers = list(Tier.objects.values_list("pk", "slug", "priority_class_name"))
        teams = list(Team.objects.values_list("pk", "slug"))
    except DatabaseError:
        return []  # not migrated yet: nothing to check
    for pk, slug, pc_name in tiers:
        for field, value, validators in (
                ("priority_class_name", pc_name, priority_class_name_validators),
                ("slug", slug, [slug_validator])):
            problem = _problem(value, validators)
            if problem:
                out.append(checks.Error(
                    f"Tier {pk} has {field} {value!r}: {problem}",
                    hint="Rename it (admin or API); sync_cluster skips it until then.",
                    obj=f"Tier {pk}", id="fairq.E101"))
    for pk, slug in teams:
        problem = _problem(slug, [slug_validator])
        if problem:
            out.append(checks.Error(
                f"Team {pk} has slug {slug!r}: {problem}",
                hint="Its namespace cannot exist; sync_cluster reports it as failed.",
                obj=f"Team {pk}", id="fairq.E102"))
    return out


@checks.register(checks.Tags.security, deploy=True)
def webhook_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """`check --deploy`: the webhook settings a production install should set
    (docs/webhooks.md)."""
    from django.conf import settings

    out: list[checks.CheckMessage] = []
    if not settings.FAIRQ_WEBHOOK_SECRET_KEYS:
        out.append(checks.Warning(
            "FAIRQ_WEBHOOK_SECRET_KEYS is unset: the signing secrets are encrypted with a "
            "key derived from DJANGO_SECRET_KEY, and changing that key loses them.",
            hint="Set FAIRQ_WEBHOOK_SECRET_KEYS to a Fernet key of its own, then run "
                 "`manage.py reencrypt_webhook_secrets` (docs/webhooks.md).",
            id="fairq.W010"))
    if not settings.FAIRQ_PUBLIC_URL:
        out.append(checks.Warning(
            "FAIRQ_PUBLIC_URL is unset: webhook payloads carry \"url\": null instead of "
            "the job's page, and notice e-mails a link without a host (/jobs/12/).",
            hint="Set FAIRQ_PUBLIC_URL to the dashboard's address, e.g. https://fairq.example.com.",
            id="fairq.W011"))
    return out


@checks.register(checks.Tags.security, deploy=True)
def registry_allowlist_check(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """`check --deploy`: images may come from any registry while FAIRQ_REGISTRY_ALLOWLIST
    is empty (docs/deployment.md): a member could run any public image on the GPUs."""
    from django.conf import settings

    if settings.FAIRQ_REGISTRY_ALLOWLIST:
        return []
    return [checks.Warning(
        "FAIRQ_REGISTRY_ALLOWLIST is empty: jobs may run images from any registry.",
        hint="Set it to the registries (or registry/path prefixes) your jobs may pull from, "
             "e.g. FAIRQ_REGISTRY_ALLOWLIST=ghcr.io/acme,registry.example.com "
             "(docs/deployment.md).",
        id="fairq.W002")]
