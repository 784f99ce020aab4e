"""platform/Dockerfile copies everything the running app reads: its Python packages,
templates and static files (a missing `static/` once shipped a dashboard without CSS,
htmx or charts, since collectstatic in the image found nothing to collect)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent


def _copied() -> set[str]:
    copied: set[str] = set()
    for line in (ROOT / "platform" / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            *sources, _dest = line.split()[1:]
            copied.update(s.rstrip("/") for s in sources)
    return copied


def test_the_image_copies_every_package_and_the_templates_and_static_files() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]
                ["include"]}
    needed = packages | {"manage.py"}
    for directory in [*settings.TEMPLATES[0]["DIRS"], *settings.STATICFILES_DIRS]:
        needed.add(Path(directory).relative_to(ROOT).parts[0])
    assert needed - _copied() == set()


def test_the_web_workers_are_set_by_web_concurrency() -> None:
    """gunicorn takes its worker count from WEB_CONCURRENCY when --workers is absent, so a
    deployment sizes it to its CPU (docs/api.md, "Performance notes")."""
    text = (ROOT / "platform" / "Dockerfile").read_text()
    assert "ENV WEB_CONCURRENCY=" in text
    cmd = next(line for line in text.splitlines() if line.startswith("CMD "))
    assert "gunicorn" in cmd and "--workers" not in cmd


def _image_command() -> list[str]:
    """The Dockerfile's CMD (a JSON array, possibly continued over lines)."""
    import json

    text = (ROOT / "platform" / "Dockerfile").read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.startswith("CMD "))
    return list(json.loads(line[4:]))


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_images_gunicorn_serves_submits_on_one_kept_connection(world: Any) -> None:
    """The image's own gunicorn command (balanced gthread workers, keep-alive) in front of
    config.wsgi (the submit lane): two submits and a refusal on one kept-alive connection,
    each answered as the API answers."""
    import http.client
    import json
    import os
    import socket
    import subprocess
    import sys
    import time

    from django.db import connection

    from accounts.services import token_issue
    from queueing.models import Job
    from tests.conftest import job_body

    key = token_issue(user=world.member, name="image").key
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = _image_command()
    assert cmd[:2] == ["gunicorn", "config.wsgi"]
    assert cmd[cmd.index("--worker-class") + 1] == "config.gunicorn_worker.BalancedThreadWorker"
    cmd[0] = str(Path(sys.executable).parent / "gunicorn")
    cmd[cmd.index("--bind") + 1] = f"127.0.0.1:{port}"
    db = connection.settings_dict
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test",
           "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
           "WEB_CONCURRENCY": "1", "DJANGO_ALLOWED_HOSTS": "127.0.0.1"}
    server = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, \
                    server.stderr.read() if server.stderr else "gunicorn did not start"
                time.sleep(0.2)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        headers = {"Authorization": f"Token {key}", "Content-Type": "application/json"}
        answers, sockets = [], []
        for body in (job_body(), job_body(name="second"), job_body(gpus=0)):
            conn.request("POST", "/api/v1/jobs/", json.dumps(body), headers)
            sockets.append(conn.sock)
            r = conn.getresponse()
            answers.append((r.status, json.loads(r.read())))
            assert conn.sock is not None  # not closed by the server (no Connection: close)
        assert [a[0] for a in answers] == [201, 201, 400], answers
        assert sockets[0] is sockets[1] is sockets[2]  # one connection throughout
        assert "gpus" in answers[2][1]["error"]["fields"]
        assert sorted(Job.objects.values_list("name", flat=True)) == \
            ["resnet-sweep-3", "second"]
        conn.close()
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=15)
