"""`fairq prio` with no job, Slurm's array ranges and the one way times are written,
through the real API in-process."""

from __future__ import annotations

from queueing.policy.states import JobState
from tests.conftest import World
from tests.factories import JobFactory

from .conftest import Cli


def test_prio_with_no_id_lists_every_pending_job_the_user_can_see(cli: Cli,
                                                                  world: World) -> None:
    """Like `sprio` with no job: the queued jobs of the caller's teams, in queue order,
    each with its priority per factor; not another team's, not a running one."""
    mine = [JobFactory(team=world.vision, gpu_type=world.h100, tier=t, submitter=world.admin)
            for t in (world.normal, world.high)]
    JobFactory(team=world.nlp, gpu_type=world.h100, tier=world.normal)  # not alice's team
    JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal,
               status=JobState.RUNNING)
    r = cli("prio")
    assert r.code == 0, r.err
    header, *rows = r.out.splitlines()
    assert header.split() == ["JOBID", "TEAM", "TIER", "POS", "PRIORITY", "FAIRSHARE", "AGE",
                              "SIZE"]
    assert [row.split()[:3] for row in rows] == [[str(mine[1].pk), "vision", "high"],
                                                 [str(mine[0].pk), "vision", "normal"]]
    # The same breakdown `fairq prio ID` gives (fair-share and size do not move with time).
    one = cli("prio", str(mine[0].pk)).out.splitlines()[1].split()
    listed = rows[1].split()
    assert listed[5] == one[5] and listed[7] == one[7]
    data = cli("--json", "prio").json
    assert [j["id"] for j in data] == [mine[1].pk, mine[0].pk]
    assert set(data[0]["priority"]["factors"]) == {"fair_share", "age", "size"}


def test_prio_with_no_id_and_nothing_pending_says_so(cli: Cli, world: World) -> None:
    r = cli("prio")
    assert (r.code, r.out, r.err) == (0, "", "fairq: no pending jobs\n")
