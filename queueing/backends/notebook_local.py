"""Real local JupyterLab servers for the simulated cluster's notebook sessions (the demo,
docs/sessions.md "In the demo").

A session workload on the simulated cluster runs no pod; with JupyterLab installed,
`LocalNotebooks.start` runs `jupyter lab` for it in a child process on a free port of
127.0.0.1, serving under the session's path with the session's token (JUPYTER_TOKEN),
its files in `<root>/<team>/<volume>`: per team and PVC name, so a later session of
the same PVC finds them, as it would on the cluster (the first PVC's name; a session
without one gets `session-<job id>`, kept too). `stop` ends the process (SIGTERM, then
SIGKILL after 5 s); the files stay.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

from .base import LaunchSpec

_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def jupyterlab_installed() -> bool:
    """JupyterLab importable in this Python (the dev extra installs it)."""
    return importlib.util.find_spec("jupyterlab") is not None


def free_port() -> int:
    """A TCP port of 127.0.0.1 free now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def lab_command(*, port: int, prefix: str, root_dir: str, ip: str = "0.0.0.0",
                python: str | None = None) -> list[str]:
    """The server's command line (the pod's, and a local one's with `python`): the token
    is not on it (JUPYTER_TOKEN in its env)."""
    head = [python, "-m", "jupyter", "lab"] if python else ["jupyter", "lab"]
    return [*head, f"--ip={ip}", f"--port={port}", "--no-browser",
            f"--ServerApp.base_url={prefix}", f"--ServerApp.root_dir={root_dir}"]


class LocalNotebooks:
    """The local servers of one simulated cluster, by workload name."""

    def __init__(self, root: str) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()
        self._procs: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
        atexit.register(self.stop_all)  # no server outlives the demo's process

    def root_dir(self, spec: LaunchSpec) -> Path:
        pvc = next((str(v.get("pvc")) for v in spec.volumes if v.get("pvc")), "")
        volume = pvc or f"session-{spec.job_id}"
        return self.root / _SAFE.sub("_", spec.team) / _SAFE.sub("_", volume)

    def start(self, spec: LaunchSpec) -> int:
        """Start the server of `spec` (a session's) unless it runs; its port."""
        with self._lock:
            if spec.name in self._procs:
                return self._procs[spec.name][1]
            root = self.root_dir(spec)
            root.mkdir(parents=True, exist_ok=True)
            port = free_port()
            log = open(root.parent / f".{spec.name}.log", "ab")  # noqa: SIM115  # the child's
            env = {**os.environ, "JUPYTER_TOKEN": spec.notebook_token,
                   "FAIRQ_JOB_ID": str(spec.job_id)}
            argv = lab_command(port=port, prefix=spec.notebook_prefix, root_dir=str(root),
                               ip="127.0.0.1", python=sys.executable)
            if os.geteuid() == 0:  # a container's root: the server refuses without it
                argv.append("--allow-root")
            proc = subprocess.Popen(  # fixed argv, no shell
                argv,
                # In the demo's process group: Ctrl-C on `make demo` ends the servers too.
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=str(root))
            log.close()
            self._procs[spec.name] = (proc, port)
            return port

    def running(self, name: str) -> int | None:
        """The port of `name`'s server while its process lives, else None."""
        with self._lock:
            entry = self._procs.get(name)
        if entry is None or entry[0].poll() is not None:
            return None
        return entry[1]

    def stop(self, name: str) -> None:
        """End `name`'s server; unknown names are a no-op."""
        with self._lock:
            entry = self._procs.pop(name, None)
        if entry is None:
            return
        proc = entry[0]
        # SIGTERM: the server shuts its kernels down and exits.
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout=5)

    def stop_all(self) -> None:
        for name in list(self._procs):
            self.stop(name)
