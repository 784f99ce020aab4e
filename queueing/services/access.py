"""Who may do what: the access checks every front end calls and every service that takes
an `actor` runs itself (zulip's `access_*` pattern).

Each `check_*` either returns what was asked for or raises a domain error
(queueing/errors.py): `NotFound` where telling "not yours" from "does not exist" would
disclose something (jobs, teams), `PermissionDenied` where the caller may see the thing
but not change it. The API maps both once (queueing/api/errors.py); the web pages turn
them into Django's 404 and 403. `actor=None` is fairq itself (a cycle, a migration, a
test's setup): services skip their checks for it, front ends never pass it.
"""

from __future__ import annotations

from typing import Any

from django.db import connection

from accounts.models import Membership, Team
from accounts.selectors import is_team_admin, team_get_for_user
from queueing import rawsql
from queueing.errors import DomainError, NotFound, PermissionDenied
from queueing.models import Job, Tier, TierGrant
from queueing.selectors.jobs import job_get_for_actor

TEAM_ADMIN_ONLY = "Only a team admin of this team (or staff) may do this."
STAFF_ONLY = "Only staff may do this."


def check_job_access(*, actor: Any, job_id: int) -> Job:
    """The job if `actor` may see it (a member of its team, or staff); NotFound (404)
    otherwise, the same answer as for a job that does not exist."""
    return job_get_for_actor(actor=actor, job_id=job_id)


def may_cancel(*, actor: Any, team: Team, submitter_id: int | None) -> bool:
    """Who may cancel a job (or an array) of `team` that `actor` may see (docs/api.md,
    "Who may cancel"; Slurm's `scancel`: the owner and operators): its submitter, a
    team admin of the team, staff; every member when the team's `any_member_may_cancel`
    is on. One query at most."""
    if actor.is_staff or (submitter_id is not None and submitter_id == actor.pk):
        return True
    if team.any_member_may_cancel:
        return Membership.objects.filter(user=actor, team=team).exists()
    return is_team_admin(user=actor, team=team)


def cancel_refused_message(team: Team) -> str:
    return (f"Only its submitter, a team admin of {team.slug} or staff may cancel this job "
            f"(a team admin may let every member of {team.slug} cancel the team's jobs: "
            "the team's any_member_may_cancel).")


def check_job_cancel(*, actor: Any, job: Job) -> None:
    """PermissionDenied (403) unless `actor` may cancel `job` (`may_cancel`); callers have
    shown the job to `actor` already (check_job_access: 404 for another team's)."""
    if not may_cancel(actor=actor, team=job.team, submitter_id=job.submitter_id):
        raise PermissionDenied(cancel_refused_message(job.team))


def check_team_member(*, actor: Any, slug: str) -> Team:
    """The team if `actor` is in it (or staff); NotFound whether it exists or not."""
    team = team_get_for_user(user=actor, slug=slug)
    if team is None:
        raise NotFound(f"team {slug} not found")
    return team


def check_team_admin(*, actor: Any, team: Team) -> None:
    """PermissionDenied (403) unless `actor` is a team admin of `team` or staff. Callers
    have shown the team to `actor` already (check_team_member): its existence is no secret."""
    if not is_team_admin(user=actor, team=team):
        raise PermissionDenied(TEAM_ADMIN_ONLY)


def check_staff(*, actor: Any, doing: str = "") -> None:
    """PermissionDenied (403) unless `actor` is staff; `doing` names what was refused
    ("change quotas": "Only staff may change quotas.")."""
    if not actor.is_staff:
        raise PermissionDenied(f"Only staff may {doing}." if doing else STAFF_ONLY)


def unknown_team_message(slug: str) -> str:
    # The same words whether the team exists or not: no disclosure.
    return f"Unknown team {slug!r}, or you are not in it."


def submit_allowed_sql(*, actor: Any, team: Team, tier: Tier) -> tuple[str, str, list[Any]]:
    """The two conditions of `check_submit` as SQL: (rule T1's tier condition, the
    membership condition, their parameters in that order). The job INSERT of a submit
    carries them in its WHERE (services/jobs.py), so the check and the write are one
    statement; `check_submit` reads them to say which one refused."""
    member_sql = "TRUE"
    params: list[Any] = [tier.pk, team.pk]
    if not actor.is_staff:
        member_sql = (f"EXISTS (SELECT 1 FROM {rawsql.table(Membership)} m "
                      "WHERE m.team_id = %s AND m.user_id = %s)")
        params += [team.pk, actor.pk]
    tier_sql = (f"EXISTS (SELECT 1 FROM {rawsql.table(Tier)} t WHERE t.id = %s AND "
                f"(t.open_to_all_teams OR EXISTS (SELECT 1 FROM {rawsql.table(TierGrant)} g "
                "WHERE g.tier_id = t.id AND g.team_id = %s)))")
    return tier_sql, member_sql, params


def check_submit(*, actor: Any, team: Team, tier: Tier) -> None:
    """`actor` may queue jobs for `team` in `tier`: a member of the team (or staff), and
    rule T1, the tier is open to every team or granted to this one, whoever submits
    (staff too: they grant first, so the grants alone say which teams may use a tier).
    A 400 on `team` or on `tier` otherwise.

    Both in one round trip, from the database on every call (never a memo: a revoked
    grant or membership holds from the next submit on), in plain SQL: it runs on every
    submit (queueing/rawsql.py says why)."""
    tier_sql, member_sql, params = submit_allowed_sql(actor=actor, team=team, tier=tier)
    with connection.cursor() as cur:
        cur.execute(f"SELECT {tier_sql}, {member_sql}", params)
        tier_allowed, member = cur.fetchone()
    if not member:
        message = unknown_team_message(team.slug)
        raise DomainError(message, fields={"team": [message]})
    if not tier_allowed:
        message = (f"Team {team.slug} may not use tier {tier.slug}: it is not open to every "
                   "team and not granted to this one (rule T1); staff grant tiers.")
        raise DomainError(message, fields={"tier": [message]})
