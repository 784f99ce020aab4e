"""The access checks (queueing/services/access.py) and the services that run them on
their `actor` themselves: a front end that forgot a check still gets a refusal, and the
refusal says no more than the front ends do (404 across teams, 403 within)."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from accounts.models import Membership, Role
from accounts.services import (
    membership_remove,
    membership_set,
    team_create,
    team_update,
    token_issue,
    token_revoke,
)
from queueing.errors import DomainError, NotFound, PermissionDenied
from queueing.models import Job, Tier, TierGrant
from queueing.selectors.queue_plan import _PLAN_KEY, queue_plan
from queueing.services.access import (
    check_job_access,
    check_staff,
    check_submit,
    check_team_admin,
    check_team_member,
)
from queueing.services.jobs import (
    JOB_SPEC_FIELDS,
    RESOURCE_COLUMNS,
    JobInput,
    job_cancel,
    job_input_build,
    job_spec,
    job_submit,
)
from tests.conftest import World, job_body
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def _job(world: World, **over: Any) -> Job:
    job: Job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal, **over)
    return job


def test_check_job_access_answers_the_same_for_another_teams_job_and_none(
        world: World) -> None:
    job = _job(world)
    assert check_job_access(actor=world.member, job_id=job.pk) == job
    assert check_job_access(actor=world.staff, job_id=job.pk) == job
    with pytest.raises(NotFound) as theirs:
        check_job_access(actor=world.outsider, job_id=job.pk)
    with pytest.raises(NotFound) as missing:
        check_job_access(actor=world.outsider, job_id=job.pk + 1000)
    assert (theirs.value.status_code, missing.value.status_code) == (404, 404)


def test_check_team_member_answers_404_whether_the_team_exists_or_not(world: World) -> None:
    assert check_team_member(actor=world.member, slug="vision") == world.vision
    assert check_team_member(actor=world.staff, slug="nlp") == world.nlp
    for slug in ("nlp", "no-such-team"):
        with pytest.raises(NotFound):
            check_team_member(actor=world.member, slug=slug)


def test_check_team_admin_and_check_staff_refuse_with_403(world: World) -> None:
    check_team_admin(actor=world.admin, team=world.vision)
    check_team_admin(actor=world.staff, team=world.vision)
    with pytest.raises(PermissionDenied) as refused:
        check_team_admin(actor=world.member, team=world.vision)
    assert (refused.value.status_code, refused.value.code) == (403, "permission_denied")
    check_staff(actor=world.staff)
    with pytest.raises(PermissionDenied):
        check_staff(actor=world.admin)


def test_check_submit_needs_a_membership_and_the_tier(world: World) -> None:
    check_submit(actor=world.member, team=world.vision, tier=world.normal)
    check_submit(actor=world.staff, team=world.nlp, tier=world.normal)
    with pytest.raises(DomainError) as outsider:
        check_submit(actor=world.outsider, team=world.vision, tier=world.normal)
    assert list(outsider.value.fields) == ["team"]
    Tier.objects.filter(pk=world.critical.pk).update(open_to_all_teams=False)
    with pytest.raises(DomainError) as closed:
        check_submit(actor=world.staff, team=world.vision, tier=world.critical)
    assert list(closed.value.fields) == ["tier"]
    TierGrant.objects.create(tier=world.critical, team=world.vision)
    check_submit(actor=world.member, team=world.vision, tier=world.critical)


def test_the_submit_service_refuses_a_team_the_actor_is_not_in(world: World) -> None:
    data = JobInput(team=world.vision, name="x", image="ghcr.io/acme/train:1", command=[],
                    args=[], env={}, gpu_type=world.h100, gpus_per_replica=1, replicas=1,
                    tier=world.normal, max_runtime_seconds=None)
    with pytest.raises(DomainError) as refused:
        job_submit(actor=world.outsider, data=data)
    assert list(refused.value.fields) == ["team"]
    assert not Job.objects.exists()


def test_it_rejects_cross_team_cancel_in_the_service(world: World) -> None:
    job = _job(world)
    with pytest.raises(NotFound):
        job_cancel(actor=world.outsider, job=job)
    job.refresh_from_db()
    assert job.status == "QUEUED"


def test_membership_and_team_services_check_their_actor(world: World) -> None:
    with pytest.raises(PermissionDenied):
        membership_set(actor=world.member, team=world.vision, user=world.outsider,
                       role=Role.MEMBER)
    m = Membership.objects.get(team=world.vision, user=world.admin)
    with pytest.raises(PermissionDenied):
        membership_remove(actor=world.member, membership=m)
    with pytest.raises(PermissionDenied):
        team_update(actor=world.admin, team=world.vision, weight=5.0)
    with pytest.raises(PermissionDenied):
        team_create(actor=world.admin, slug="x", name="x")
    issued = token_issue(user=world.member, name="ci")
    with pytest.raises(PermissionDenied):
        token_revoke(token=issued.token, actor=world.admin)
    token_revoke(token=issued.token, actor=world.member)
    assert issued.token.revoked_at is not None
    world.vision.refresh_from_db()
    assert world.vision.weight != 5.0
    assert not Membership.objects.filter(user=world.outsider, team=world.vision).exists()


def test_a_job_spec_builds_the_input_of_the_same_job(world: World) -> None:
    # A job as submitted now: its grace and memory filled in (the settings,
    # job_input_build: every pod has a memory limit, 32Gi per GPU by default).
    job = _job(world, env={"SEED": "3"}, command=["python"], args=["-u"], replicas=2,
               max_runtime_seconds=60,
               termination_grace_seconds=django_settings.FAIRQ_K8S_TERMINATION_GRACE_SECONDS,
               resources={"memory": "32Gi"}, memory_bytes=32 * 2**30,
               volumes=[{"name": "s", "empty_dir": {"size_limit": "1Gi"}, "mount_path": "/s"}],
               labels={"run": "a"})
    spec = job_spec(job)
    assert set(spec) == set(JOB_SPEC_FIELDS)
    data = job_input_build(actor=world.member, **spec)
    for name, value in data.job_values().items():
        assert getattr(job, name) == value, name
    # The spec's fields and the quantities normalised from it (resources, shm_size); the
    # topology request as its two columns; the dependencies, which are not part of the
    # spec (`job_input_with_dependencies` sets them; a resubmit does not copy them); the
    # cluster fields (rules K3-K4), set by `job_input_with_clusters`; a fraction's slices,
    # read from `gpus` on its GPU type (docs/api.md, "Fractions of a GPU").
    assert set(data.job_values()) == (set(JOB_SPEC_FIELDS.values()) - {"topology"}) | set(
        RESOURCE_COLUMNS.values()) | {"topology_level", "topology_mode", "dependencies",
                                      "requested_cluster", "cluster_selector", "allow_spot",
                                      "gpu_slices"}


@pytest.mark.django_db(transaction=True)
def test_a_submit_keeps_the_shared_plan_its_job_refreshes_it_and_a_cancel_drops_it(
        world: World) -> None:
    """The same for every front end (here the API): a submit keeps the plan (a burst of
    submits must not re-plan the queue once per submit); the new job's standing, newer
    than the plan, refreshes it; a cancel drops it on commit."""
    c = world.client(world.member)
    queue_plan(now=timezone.now())
    cached = cache.get(_PLAN_KEY)
    job_id = c.post("/api/v1/jobs/", job_body(), format="json").json()["id"]
    assert cache.get(_PLAN_KEY) == cached and job_id not in cached.entries
    detail = c.get(f"/api/v1/jobs/{job_id}/").json()
    assert detail["queue"]["position"] == 1
    assert job_id in cache.get(_PLAN_KEY).entries
    with transaction.atomic():
        assert c.post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 200
        assert cache.get(_PLAN_KEY) is not None  # not before the commit
    assert cache.get(_PLAN_KEY) is None
