"""A notebook session end to end on the real control plane (Kubernetes 1.20,
tests/envtest), opened through fairq's proxy in headless Chromium (docs/sessions.md,
"Opening one"; rules N1-N4 of docs/scheduling.md).

`dave` starts a session through the API with his team's PVC as its root and an idle
limit of one minute. Fairq queues it in the `interactive` tier, the scheduler places
it, the Kubernetes backend creates its Job; kube-scheduler binds its pod, and the fake
kubelet's exec mode runs the container's command for real: `jupyter lab` from PyPI
with the session's base URL and token (JUPYTER_TOKEN), the PVC mapped to a temporary
directory. The backend reads the pod's IP (the fake kubelet reports 127.0.0.1 for an
exec-mode pod: where the process listens) and fairq records it as the session's
address. fairq's ASGI app (config/asgi.py under uvicorn, as the web pod serves
`/sessions/`) proxies it: Chromium logs in to fairq, opens `/sessions/<id>/lab/`,
JupyterLab's launcher renders, a notebook runs `print(6*7)` over the kernel's
WebSocket and is saved. Then nobody touches it: the culling task reads the server
(no activity for the idle limit) and stops the session, the pod is deleted, the
server's process ends, and the notebook is still in the PVC's directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, SCREENSHOTS, browser_or_skip
from tests.envtest.test_k8s_backend import Kube, job, kube, wait
from tests.notebooks.servers import asgi_server, free_port, jupyter_available
from tests.notebooks.test_notebook_browser import run_in_notebook

__all__ = ["kube"]  # the fixture, imported for this module

pytestmark = [pytest.mark.k8s, pytest.mark.browser, pytest.mark.django_db(transaction=True)]

IMAGE = "ghcr.io/acme/notebook-envtest:1"  # run for real by the fake kubelet
CLAIM = "vision-home"


def _pvc(kube: Kube, directory: Path) -> None:
    """A PersistentVolume bound to the PVC `vision-home` in vision's namespace, so
    kube-scheduler binds pods that mount it; the fake kubelet maps it to `directory`."""
    ns = kube.ns("vision")
    kube.core.create_persistent_volume({
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"pv-{ns}"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "storageClassName": "", "hostPath": {"path": str(directory)},
                 "claimRef": {"namespace": ns, "name": CLAIM}}})
    kube.core.create_namespaced_persistent_volume_claim(ns, {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                 "volumeName": f"pv-{ns}", "resources": {"requests": {"storage": "1Gi"}}}})
    wait(lambda: kube.core.read_namespaced_persistent_volume_claim(
        CLAIM, ns).status.phase == "Bound", cycle=False, what="the PVC bound")


def test_a_session_runs_jupyterlab_in_its_pod_opens_through_fairq_and_is_culled_when_idle(
    kube: Kube, world: Any, k8s_control_plane: Any, settings: Any, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    browser_or_skip(None if jupyter_available() else
                    "jupyterlab is not installed (pip install -e '.[dev]')")
    from kubernetes.client.exceptions import ApiException

    from queueing.models import JobEvent, NotebookSession
    from queueing.services.sessions import notebook_token
    from queueing.tasks import sessions_check_task

    settings.FAIRQ_NOTEBOOK_IMAGE = IMAGE
    settings.FAIRQ_NOTEBOOK_PORT = free_port()  # the pod's server listens on this machine
    settings.FAIRQ_SESSION_WARN_MINUTES = 0
    world.vision.allowed_pvcs = [CLAIM]
    world.vision.save()
    home = tmp_path / "pvc"
    home.mkdir()
    # This machine's tests run as root, a pod's server does not: jupyter_server reads
    # allow_root from its config directory under HOME (the fake kubelet passes HOME).
    jupyter_home = tmp_path / "home"
    (jupyter_home / ".jupyter").mkdir(parents=True)
    (jupyter_home / ".jupyter" / "jupyter_server_config.json").write_text(json.dumps(
        {"ServerApp": {"allow_root": True}, "LabApp": {"news_url": None}}))
    monkeypatch.setenv("HOME", str(jupyter_home))
    kubelet = k8s_control_plane.kubelet
    kubelet.exec_images.add(IMAGE)
    kubelet.exec_claims[CLAIM] = str(home)
    kubelet.exec_pod_ip = "127.0.0.1"
    try:
        _pvc(kube, home)
        started = world.client(world.member).post("/api/v1/sessions/", {
            "team": "vision", "gpu_type": "a100", "gpus": 1, "pvc": CLAIM,
            "idle_minutes": 1, "max_runtime_seconds": 3600}, format="json")
        assert started.status_code == 201, started.content
        sid = int(started.json()["id"])
        prefix = f"/sessions/{sid}/lab/"
        wait(lambda: job(sid).status == "RUNNING", timeout=60, what="the session RUNNING")
        [pod] = kube.pods("vision", f"fq-{sid}-1")
        container = pod["spec"]["containers"][0]
        assert container["image"] == IMAGE
        assert container["command"][:2] == ["jupyter", "lab"]
        assert f"--ServerApp.base_url={prefix}" in container["command"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        token = notebook_token(job_id=sid, attempt=1)
        assert env["JUPYTER_TOKEN"] == token  # in the pod's env, on no command line
        assert token not in json.dumps(container["command"]) + json.dumps(container.get("args"))
        # The backend reports the pod's IP; fairq records it as the session's address.
        session = wait(lambda: (s := NotebookSession.objects.get(job_id=sid)).host and s,
                       timeout=60, what="the session's address recorded")
        assert (session.host, session.port) == ("127.0.0.1", settings.FAIRQ_NOTEBOOK_PORT)
        print(f"session {sid}: pod {pod['metadata']['name']} on "
              f"{pod['spec']['nodeName']}, server at {session.host}:{session.port}")

        with asgi_server() as url:
            shot = _open_in_chromium(url, prefix, world.member.username)
            print(f"opened through fairq at {url}{prefix}: launcher, print(6*7) -> 42; {shot}")
        notebook = home / "proof.ipynb"
        cells = json.loads(notebook.read_text())["cells"]
        assert "".join(cells[0]["source"]) == "print(6*7)"
        assert cells[0]["outputs"][0]["text"] == ["42\n"]

        # Nobody touches it now. The culling task (beat, every minute) reads the server:
        # not yet idle for its minute; then, once the minute has passed, it stops it.
        first = sessions_check_task.delay().get()
        assert first["culled"] == 0 and job(sid).status == "RUNNING", first
        idle_from = time.monotonic()
        result = first
        while not result["culled"]:  # the beat's period is a minute; here every 5 s
            assert time.monotonic() - idle_from < 150, "the idle session was not culled"
            time.sleep(5)
            result = sessions_check_task.delay().get()
        print(f"culled {time.monotonic() - idle_from:.0f} s after the browser closed "
              f"(idle limit 60 s): {result}")
        stopped = job(sid)
        assert stopped.status == "CANCELLED"
        culled = JobEvent.objects.filter(job_id=sid).order_by("-at", "-pk").first()
        assert culled is not None and "idle" in culled.reason, culled.reason if culled else None
        print(f"event: {culled.kind}: {culled.reason}")
        wait(lambda: not kube.pods("vision", f"fq-{sid}-1"), timeout=60,
             what="the session's pod gone")
        wait(lambda: not _answers(session.port), cycle=False, timeout=30,
             what="the server's process ended")
        # The PVC and its files outlive the session.
        assert json.loads(notebook.read_text())["cells"][0]["outputs"][0]["text"] == ["42\n"]
        kube.core.read_namespaced_persistent_volume_claim(CLAIM, kube.ns("vision"))
        print(f"kept on the PVC: {sorted(p.name for p in home.iterdir())}")
    finally:
        kubelet.exec_images.discard(IMAGE)
        kubelet.exec_claims.pop(CLAIM, None)
        kubelet.exec_pod_ip = None
        with contextlib.suppress(ApiException):
            kube.core.delete_persistent_volume(f"pv-{kube.ns('vision')}")


def _answers(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _open_in_chromium(url: str, prefix: str, username: str) -> Path:
    """Log in to fairq, open the session, run print(6*7) in a notebook saved as
    proof.ipynb; the screenshot's path. The browser is closed on return (no more
    activity on the server)."""
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                         args=CHROMIUM_ARGS)
            context = browser.new_context(viewport={"width": 1280, "height": 860},
                                          base_url=url)
            context.set_default_timeout(30_000)
            pg = context.new_page()
            pg.goto(f"{prefix}lab")
            assert "/accounts/login/" in pg.url
            pg.get_by_label("Username").fill(username)
            pg.get_by_label("Password").fill("pw")
            pg.get_by_role("button", name="Log in").click()
            pg.wait_for_load_state()
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            if "Session starting" in pg.content():  # the server not up yet: it reloads
                pg.screenshot(path=str(SCREENSHOTS / "notebook-session-starting.png"))
            pg.wait_for_selector(".jp-Launcher", timeout=60_000)
            output = run_in_notebook(pg, "print(6*7)")
            output.filter(has_text="42").wait_for(timeout=60_000)
            assert output.inner_text().strip() == "42"
            pg.keyboard.press("Control+s")
            pg.get_by_role("dialog").get_by_role("textbox").fill("proof.ipynb")
            pg.get_by_role("button", name="Rename and Save").click()
            pg.get_by_text("Saving completed").wait_for(timeout=30_000)
            shot = SCREENSHOTS / "notebook-session-envtest.png"
            pg.screenshot(path=str(shot))
            context.close()
            browser.close()
            return shot
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous
