"""`fairq cancel` of a job the caller may see but not cancel (docs/api.md, "Who may
cancel"): the API's 403 message on one line, exit 1, the job left as it was."""

from __future__ import annotations

import pytest

from accounts.services import token_issue
from queueing.models import Job
from tests.conftest import World, job_body

from .conftest import Cli

pytestmark = pytest.mark.django_db


def test_cancelling_a_teammates_job_shows_the_403_readably(world: World, cli: Cli) -> None:
    r = world.client(world.admin).post("/api/v1/jobs/", job_body(), format="json")
    job_id = r.json()["id"]  # submitted by alice, the team admin
    cli.token = token_issue(user=world.member).key  # dave, a member of vision
    out = cli("cancel", str(job_id))
    assert out.code == 1
    assert out.err == (
        "fairq: Only its submitter, a team admin of vision or staff may cancel this job (a "
        "team admin may let every member of vision cancel the team's jobs: the team's "
        "any_member_may_cancel)\n")
    assert Job.objects.get(pk=job_id).status == "QUEUED"
