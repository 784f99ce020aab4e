"""Fixtures of the notebook proxy's tests: a real JupyterLab server behind a session of
`world.member`, fairq's ASGI app in front of it (tests/notebooks/servers.py)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.notebooks.servers import asgi_server, jupyter_available, jupyter_lab


@dataclass(frozen=True)
class StandInUpstream:
    base_url: str
    token: str
    prefix: str


@dataclass
class StandInSessions:
    """The two calls the proxy makes of queueing/services/sessions.py, over jobs the test
    names: `owners[job id]` may open it, `upstreams[job id]` is its server (absent: not
    running)."""

    owners: dict[int, int] = field(default_factory=dict)
    upstreams: dict[int, StandInUpstream] = field(default_factory=dict)

    def can_open_session(self, user: Any, job: Any) -> bool:
        return bool(user.is_authenticated) and self.owners.get(job.pk) == user.pk

    def notebook_upstream(self, job: Any) -> StandInUpstream | None:
        return self.upstreams.get(job.pk)


@dataclass
class Lab:
    url: str  # fairq's ASGI server
    job: Any  # the session's job (world.member's)
    prefix: str
    token: str
    root: Path
    server: str  # the JupyterLab server's own "http://127.0.0.1:PORT"
    sessions: StandInSessions


JOB_ID = 4242  # the session's job id: one server for the module, a new job row per test


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str, Path]]:
    """(fairq's URL, the server's URL, its token, its root directory): one real
    JupyterLab server (~10 s to start) and one uvicorn for a test module."""
    if not jupyter_available():
        pytest.skip("jupyterlab is not installed (pip install -e '.[dev]')")
    tmp = tmp_path_factory.mktemp("lab")
    root = tmp / "notebooks"
    root.mkdir()
    token = secrets.token_hex(20)
    with jupyter_lab(base_url=f"/sessions/{JOB_ID}/lab/", token=token, root=root,
                     log=tmp / "jupyter.log") as server, asgi_server() as url:
        yield url, server, token, root


@pytest.fixture
def lab(world: Any, servers: tuple[str, str, str, Path],
        monkeypatch: pytest.MonkeyPatch) -> Lab:
    from queueing.web import notebook_proxy
    from tests.factories import JobFactory

    url, server, token, root = servers
    job = JobFactory(id=JOB_ID, team=world.vision, submitter=world.member,
                     gpu_type=world.a100, status="RUNNING")
    prefix = f"/sessions/{job.pk}/lab/"
    stand_in = StandInSessions(owners={job.pk: world.member.pk},
                               upstreams={job.pk: StandInUpstream(server, token, prefix)})
    monkeypatch.setattr(notebook_proxy, "_sessions", lambda: stand_in)
    return Lab(url, job, prefix, token, root, server, stand_in)
