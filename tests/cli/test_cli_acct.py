"""`fairq acct` (like sacct) and `fairq share -a` (like sshare -a) against the API."""

from __future__ import annotations

from typing import Any

import pytest

from tests.accounting.history import seed
from tests.conftest import World

from .conftest import Cli


@pytest.fixture
def history(world: World) -> dict[str, Any]:
    return seed(world)


def test_acct_prints_a_table_like_sacct(cli: Cli, history: dict[str, Any]) -> None:
    r = cli("acct")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert lines[0].split() == ["JOBID", "JOBNAME", "USER", "TEAM", "TIER", "ALLOCGPUS",
                                "START", "END", "ELAPSED", "GPU-HOURS", "STATE", "EXITCODE",
                                "GPUEFF"]
    j1, j2, j4 = history["j1"].pk, history["j2"].pk, history["j4"].pk
    assert [line.split()[0] for line in lines[1:]] == [f"{j4}.1", f"{j2}.1", f"{j1}.2",
                                                       f"{j1}.1"]
    assert lines[1].split()[7] == "Unknown"  # running: no end yet
    assert lines[3].split() == [f"{j1}.2", "resnet", "alice", "vision", "normal", "2xh100",
                                "2026-10-01T03:00:00Z", "2026-10-01T06:00:00Z", "03:00:00",
                                "6.00", "SUCCEEDED", "0", "80.0%"]
    assert lines[4].split()[-1] == "PREEMPTED"  # no exit code, no efficiency


def test_acct_passes_the_filters(cli: Cli, history: dict[str, Any]) -> None:
    r = cli("acct", "-u", "dave", "-s", "failed", "-S", "2026-10-01", "-E",
            "2026-10-03T00:00")
    assert r.code == 0, r.err
    assert [line.split()[0] for line in r.out.splitlines()[1:]] == [f"{history['j2'].pk}.1"]
    _, path = cli.transport.calls[-1]
    assert "from=2026-10-01T00%3A00%3A00%2B00%3A00" in path and "state=FAILED" in path
    assert cli("acct", "-t", "nlp").code == 1  # not alice's team: the server's 404


def test_acct_json_and_a_bad_time(cli: Cli, history: dict[str, Any]) -> None:
    r = cli("--json", "acct", "-G", "a100")
    assert r.code == 0, r.err
    assert [(x["job_id"], x["state"]) for x in r.json] == [
        (history["j4"].pk, "RUNNING"), (history["j2"].pk, "FAILED")]
    bad = cli("acct", "-S", "last tuesday")
    assert bad.code == 2 and "bad --start" in bad.err


def test_acct_follows_pages_up_to_the_limit(cli: Cli, history: dict[str, Any]) -> None:
    r = cli("--json", "acct", "--limit", "3")
    assert len(r.json) == 3
    r = cli("--json", "acct", "--limit", "1")
    assert len(r.json) == 1


def test_share_all_lists_each_teams_users(cli: Cli, history: dict[str, Any]) -> None:
    r = cli("share", "-a")
    assert r.code == 0, r.err
    lines = [line.split() for line in r.out.splitlines()]
    assert lines[0] == ["TEAM", "USER", "PARENT", "WEIGHT", "NORMSHARES", "GPU-HOURS",
                        "NORMUSAGE", "FAIRSHARE", "RUNNING"]
    assert lines[1][0] == "vision"
    # October's attempts have decayed for weeks (rule F1); dave's job running now has
    # not: he leads his team's usage.
    assert [(line[0], line[-1]) for line in lines[2:]] == [("dave", "1"), ("alice", "0")]
    data = cli("--json", "share", "-a").json
    users = data["teams"][0]["users"]
    shares = {u["user"]: u["usage_fraction"] for u in users}
    assert shares["dave"] > shares["alice"] > 0
    assert abs(sum(shares.values()) - 1.0) < 1e-6
    team_usage = data["teams"][0]["usage_gpu_hours"]
    assert sum(u["usage_gpu_hours"] for u in users) == pytest.approx(team_usage, rel=1e-3)


def test_users_are_not_in_plain_share(cli: Cli, history: dict[str, Any]) -> None:
    data = cli("--json", "share").json
    assert "users" not in data["teams"][0]
    assert "USER" not in cli("share").out
