"""Real servers for the notebook proxy's tests: a JupyterLab server (PyPI `jupyterlab`)
under a session's base URL, and fairq's ASGI app (config/asgi.py) served by uvicorn,
as the web pod serves `/sessions/`."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def jupyter_available() -> bool:
    return shutil.which("jupyter", path=os.path.dirname(sys.executable)) is not None


def jupyter_argv(*, port: int, base_url: str, token_env: bool, root: Path) -> list[str]:
    """`jupyter lab` as a session's pod runs it (docs/sessions.md), on 127.0.0.1."""
    argv = [os.path.join(os.path.dirname(sys.executable), "jupyter"), "lab", "--no-browser",
            "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0",
            f"--ServerApp.base_url={base_url}", f"--ServerApp.root_dir={root}",
            "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if os.geteuid() == 0:  # this machine's tests run as root; a pod does not
        argv.append("--allow-root")
    return argv


@contextlib.contextmanager
def jupyter_lab(*, base_url: str, token: str, root: Path, log: Path) -> Iterator[str]:
    """A real JupyterLab server with `token` under `base_url`; yields its
    "http://127.0.0.1:PORT" once `/api/status` answers."""
    port = free_port()
    env = {**os.environ, "JUPYTER_TOKEN": token, "JUPYTER_PLATFORM_DIRS": "1",
           "JUPYTER_RUNTIME_DIR": str(log.parent / "jupyter-runtime")}
    with open(log, "ab") as out:
        proc = subprocess.Popen(jupyter_argv(port=port, base_url=base_url, token_env=True,
                                             root=root),
                                env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}{base_url}api/status", token=token, proc=proc, log=log)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def wait_http(url: str, *, token: str, proc: Any = None, log: Path | None = None,
              timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited {proc.returncode}: "
                               f"{log.read_text()[-2000:] if log else ''}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, headers={"Authorization": f"token {token}"},
                         timeout=2).status_code == 200:
                return
        time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer in {timeout} s")


@contextlib.contextmanager
def asgi_server() -> Iterator[str]:
    """config/asgi.py's application served by uvicorn in a thread of this process (the
    test's database, as pytest-django's live server); yields its base URL."""
    import uvicorn

    from config.asgi import application

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(application, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="on", ws="websockets-sansio"))
    thread = threading.Thread(target=server.run, name="asgi", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
