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


def test_cancelling_several_goes_on_past_a_refusal_and_exits_1(world: World, cli: Cli) -> None:
    """As scancel: the member's own jobs are cancelled though the one between them is
    not theirs; the refusal is one line naming that job."""
    member = world.client(world.member)
    first = member.post("/api/v1/jobs/", job_body(), format="json").json()["id"]
    teammates = world.client(world.admin).post("/api/v1/jobs/", job_body(),
                                               format="json").json()["id"]
    last = member.post("/api/v1/jobs/", job_body(), format="json").json()["id"]
    cli.token = token_issue(user=world.member).key
    out = cli("cancel", str(first), str(teammates), str(last))
    assert out.code == 1
    assert out.out.splitlines() == [f"Cancelled job {first} (resnet-sweep-3)",
                                    f"Cancelled job {last} (resnet-sweep-3)"]
    assert out.err.startswith(f"fairq: job {teammates}: Only its submitter, a team admin")
    assert out.err.count("\n") == 1
    statuses = dict(Job.objects.values_list("pk", "status"))
    assert (statuses[first], statuses[teammates], statuses[last]) == \
        ("CANCELLED", "QUEUED", "CANCELLED")
