"""The two functions the notebook proxy calls: who may open a session, where its
server is (docs/sessions.md, "Opening a session")."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser
from django.utils import timezone

from queueing.models import NotebookSession
from queueing.policy.states import JobState
from queueing.services.sessions import (
    can_open_session,
    notebook_token,
    notebook_upstream,
)
from tests.factories import JobFactory


def _session(world: Any, *, owner: Any, status: str = JobState.RUNNING, host: str = "10.0.3.7",
             attempt: int = 1) -> Any:
    job = JobFactory(team=world.vision, submitter=owner, gpu_type=world.a100,
                     tier=world.normal, status=status, attempt=attempt)
    NotebookSession.objects.create(job=job, owner=owner, idle_limit_minutes=60, host=host,
                                   host_attempt=attempt, port=8888, url_path=f"/sessions/{job.pk}/lab/",
                                   created_at=timezone.now())
    return job


@pytest.mark.django_db
def test_it_gives_the_running_server_with_its_token(world: Any) -> None:
    job = _session(world, owner=world.member, attempt=2)
    up = notebook_upstream(job)
    assert up is not None
    assert up.base_url == "http://10.0.3.7:8888"
    assert up.prefix == f"/sessions/{job.pk}/lab/"
    assert up.token == notebook_token(job_id=job.pk, attempt=2)
    assert len(up.token) == 40
    assert up.token != notebook_token(job_id=job.pk, attempt=1)
    assert up.token not in repr(up)


@pytest.mark.django_db
@pytest.mark.parametrize(("status", "host"), [(JobState.QUEUED, ""), (JobState.ADMITTED, ""),
                                         (JobState.RUNNING, ""),
                                         (JobState.CANCELLED, "10.0.3.7")])
def test_it_gives_none_without_an_address_or_a_run(world: Any, status: str, host: str) -> None:
    assert notebook_upstream(_session(world, owner=world.member, status=status,
                                      host=host)) is None


@pytest.mark.django_db
def test_it_gives_none_for_a_job_that_is_no_session(world: Any) -> None:
    job = JobFactory(team=world.vision, submitter=world.member, status=JobState.RUNNING)
    assert notebook_upstream(job) is None
    assert not can_open_session(world.member, job)


@pytest.mark.django_db
def test_it_gives_none_for_an_address_of_an_earlier_attempt(world: Any) -> None:
    job = _session(world, owner=world.member, attempt=2)
    NotebookSession.objects.filter(job_id=job.pk).update(host_attempt=1)
    job.refresh_from_db()
    assert notebook_upstream(job) is None


@pytest.mark.django_db
def test_it_brackets_an_ipv6_pod_address(world: Any) -> None:
    up = notebook_upstream(_session(world, owner=world.member, host="fd00::7"))
    assert up is not None and up.base_url == "http://[fd00::7]:8888"


@pytest.mark.django_db
def test_only_the_owner_and_staff_may_open_a_session(world: Any) -> None:
    job = _session(world, owner=world.member)
    assert can_open_session(world.member, job)
    assert can_open_session(world.staff, job)
    assert not can_open_session(world.admin, job)  # team admin of vision: may stop, not open
    assert not can_open_session(world.outsider, job)
    assert not can_open_session(AnonymousUser(), job)
    assert not can_open_session(None, job)
    world.member.is_active = False
    assert not can_open_session(world.member, job)
