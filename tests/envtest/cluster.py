"""A real, throw-away Kubernetes control plane for tests ("envtest").

``ControlPlane`` runs etcd, kube-apiserver, kube-controller-manager and
kube-scheduler (built by ``tests/envtest/build.sh``) as child processes bound
to free ports on 127.0.0.1, in a private temp dir holding certificates, a
static token file, a kubeconfig and one log file per component. There is no
kubelet and no container runtime: nodes are API objects registered with
``add_gpu_node`` and pods are "run" by ``tests.envtest.fake_kubelet``.

Guarantees:
- ``start()`` returns only when every component answers its health check and
  the controllers have created the ``default`` service account; if a component
  dies or times out first, everything started so far is stopped and the
  ``ControlPlaneError`` message carries the tail of that component's log.
- ``stop()`` terminates (then kills) exactly the processes it started, in
  reverse order, and is idempotent. Children also get SIGKILL if the thread
  that started them dies (PR_SET_PDEATHSIG), so a crashed test run leaves no
  stray etcd/apiserver behind.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import datetime as dt
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, V1Node

    from tests.envtest.fake_kubelet import FakeKubelet

__all__ = [
    "DEFAULT_GPU_NODES",
    "FAKE_NODE_LABEL",
    "GPU_TAINT",
    "SECOND_GPU_NODES",
    "ControlPlane",
    "ControlPlaneError",
    "binaries_present",
    "default_bin_dir",
    "envtest_required",
    "missing_binaries",
    "wait_for",
]

BINARIES: tuple[str, ...] = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")

# Nodes carrying this label are the ones tests.envtest.fake_kubelet manages.
FAKE_NODE_LABEL = "envtest.fairq.io/fake-kubelet"

# GPU nodes in managed clusters (GKE, AKS, most on-prem setups) carry this
# taint so that CPU-only pods stay off them; a GPU workload must tolerate it.
GPU_TAINT: dict[str, str] = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}

# (name, gpu type, GPUs) of the nodes the pytest fixture registers: two H100
# boxes and one A100 box, 8 GPUs each.
DEFAULT_GPU_NODES: tuple[tuple[str, str, int], ...] = (
    ("gpu-h100-0", "h100", 8),
    ("gpu-h100-1", "h100", 8),
    ("gpu-a100-0", "a100", 8),
)

# The nodes of the second control plane (the `k8s_second_control_plane` fixture): other
# names, one GPU type of its own (l40s) and one the first plane has too (h100), so jobs
# can be dispatched to both and move from one to the other.
SECOND_GPU_NODES: tuple[tuple[str, str, int], ...] = (
    ("gpu-b-h100-0", "h100", 8),
    ("gpu-b-l40s-0", "l40s", 8),
)

ADMIN_USER = "envtest-admin"

_LOG_TAIL_LINES = 40
_PR_SET_PDEATHSIG = 1


class ControlPlaneError(RuntimeError):
    """A control-plane component failed to start or to become healthy."""


def default_bin_dir() -> Path:
    """Where build.sh puts the binaries (``$FAIRQ_ENVTEST_CACHE/bin``)."""
    explicit = os.environ.get("FAIRQ_ENVTEST_BIN")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("FAIRQ_ENVTEST_CACHE") or str(Path.home() / ".cache" / "fairq-envtest")
    return Path(cache) / "bin"


def missing_binaries(bin_dir: Path | None = None) -> list[str]:
    """Names of the control-plane binaries (plus openssl) that are not runnable."""
    bin_dir = bin_dir or default_bin_dir()
    missing = [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]
    if shutil.which("openssl") is None:
        missing.append("openssl (Debian package openssl)")
    return missing


def envtest_required() -> bool:
    """True when ``FAIRQ_REQUIRE_ENVTEST`` asks for a missing envtest to fail, not skip."""
    return os.environ.get("FAIRQ_REQUIRE_ENVTEST", "").strip().lower() not in ("", "0", "false", "no")


def binaries_present(bin_dir: Path | None = None) -> bool:
    return not missing_binaries(bin_dir)


def _free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports that were free a moment ago.

    All sockets stay open until every port is picked, so the kernel cannot
    hand out the same one twice. A component may still lose its port to some
    other process before binding it: ``ControlPlane.start`` retries that.
    """
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


class _PortClash(ControlPlaneError):
    """A component could not bind its port (someone took it meanwhile)."""


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


def _set_pdeathsig() -> None:
    # Runs in the child between fork and exec: ask the kernel to SIGKILL it
    # when the parent thread goes away, so nothing outlives a crashed pytest.
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except OSError:
        pass


def _openssl(args: str, cwd: Path) -> None:
    """Run ``openssl`` with whitespace-separated ``args`` (none contain spaces)."""
    proc = subprocess.run(["openssl", *args.split()], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ControlPlaneError(f"openssl {args} failed:\n{proc.stderr[-2000:]}")


@dataclass
class _Component:
    name: str
    argv: list[str]
    log_path: Path
    health_url: str
    proc: subprocess.Popen[bytes] | None = None
    ssl_context: ssl.SSLContext | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler.

    Use as a context manager or call ``start()``/``stop()``. Attributes valid
    after ``start()``: ``server`` (https URL), ``token`` (admin bearer token),
    ``kubeconfig_path``, ``ca_path``, ``workdir`` (logs: ``<name>.log``).

    Instances are independent: each has its own free ports, temp dir, etcd data
    dir, token and CA, so several run at once (two clusters for fairq). ``gpu_nodes``
    ((name, gpu type, GPUs), as ``DEFAULT_GPU_NODES``) are registered by ``start()``
    with ``add_gpu_node``'s defaults; ``fake_kubelet=True`` starts the fake kubelet
    after them.
    """

    def __init__(
        self,
        *,
        bin_dir: Path | str | None = None,
        workdir: Path | str | None = None,
        feature_gates: Mapping[str, bool] | None = None,
        admission_plugins: Sequence[str] = (
            "NamespaceLifecycle",
            "LimitRanger",
            "Priority",
            "DefaultTolerationSeconds",
            "ResourceQuota",
        ),
        # Controllers we cannot or must not run without kubelets/clouds:
        # nodelifecycle would taint and evict our kubelet-less nodes.
        disabled_controllers: Sequence[str] = (
            "nodelifecycle",
            "nodeipam",
            "cloud-node-lifecycle",
            "route",
            "service",
        ),
        scheduler_backoff_seconds: tuple[int, int] = (1, 5),
        start_timeout: float = 90.0,
        keep_workdir: bool | None = None,
        gpu_nodes: Sequence[tuple[str, str, int]] = (),
        fake_kubelet: bool = False,
    ) -> None:
        self.bin_dir = Path(bin_dir) if bin_dir else default_bin_dir()
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="fairq-envtest-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        gates = {"TTLAfterFinished": True}
        gates.update(feature_gates or {})
        self.feature_gates = gates
        self.admission_plugins = tuple(admission_plugins)
        self.disabled_controllers = tuple(disabled_controllers)
        self.scheduler_backoff_seconds = scheduler_backoff_seconds
        self.start_timeout = start_timeout
        if keep_workdir is None:
            keep_workdir = bool(os.environ.get("FAIRQ_ENVTEST_KEEP_DIR"))
        self.keep_workdir = keep_workdir
        self.gpu_nodes = tuple(gpu_nodes)
        self.fake_kubelet = fake_kubelet

        self.token = uuid.uuid4().hex
        self.kubeconfig_path = self.workdir / "kubeconfig"
        self.ca_path = self.workdir / "pki" / "ca.crt"
        self.server = ""
        self.start_seconds: float | None = None
        self._components: list[_Component] = []
        self._etcd_data: Path | None = None
        self._started = False
        self._stopped = False
        self.kubelet: FakeKubelet | None = None

    # ------------------------------------------------------------------ API

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        """Start all components and wait until they are healthy."""
        if self._started:
            raise ControlPlaneError("ControlPlane.start() called twice")
        missing = missing_binaries(self.bin_dir)
        if missing:
            raise ControlPlaneError(
                f"missing envtest binaries in {self.bin_dir}: {', '.join(missing)}; "
                "run tests/envtest/build.sh"
            )
        self._started = True
        atexit.register(self.stop)
        t0 = time.monotonic()
        try:
            self._write_pki()
            for attempt in range(3):
                try:
                    self._start_once(deadline=t0 + self.start_timeout)
                    break
                except _PortClash:
                    if attempt == 2:
                        raise
                    self._kill_components()
            for name, gpu_type, gpus in self.gpu_nodes:
                self.add_gpu_node(name, gpu_type, gpus)
            if self.fake_kubelet:
                self.start_fake_kubelet()
        except ControlPlaneError as exc:
            # Keep the logs the message points at; a clean run removes them.
            self.keep_workdir = True
            self.stop()
            raise ControlPlaneError(f"{exc}\n(logs kept in {self.workdir})") from exc
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def _start_once(self, *, deadline: float) -> None:
        ports = _Ports(*_free_ports(5))
        self.server = f"https://127.0.0.1:{ports.apiserver}"
        self._write_auth_files()
        for comp in self._components_for(ports):
            self._launch(comp)
            self._wait_healthy(comp, deadline=deadline)
        self._wait_for_default_service_account(deadline=deadline)

    def stop(self) -> None:
        """Terminate every started component (reverse order); idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self.kubelet is not None:
            # Told first (so it ignores the apiserver vanishing), joined last:
            # stopping the apiserver breaks its watch at once instead of
            # waiting out the watch timeout.
            self.kubelet.request_stop()
        self._kill_components()
        if self.kubelet is not None:
            self.kubelet.join()
        if self._own_workdir and not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        atexit.unregister(self.stop)

    def _kill_components(self) -> None:
        for comp in reversed(self._components):
            proc = comp.proc
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self._components = []
        if self._etcd_data is not None:
            shutil.rmtree(self._etcd_data, ignore_errors=True)
            self._etcd_data = None

    def log_path(self, component: str) -> Path:
        return self.workdir / f"{component}.log"

    def pids(self) -> dict[str, int]:
        """Pids of running components (for diagnostics and leak checks)."""
        return {c.name: c.proc.pid for c in self._components if c.proc is not None and c.proc.poll() is None}

    @contextlib.contextmanager
    def frozen(self, component: str) -> Iterator[None]:
        """Stop one component with SIGSTOP for the duration of the block (SIGCONT after,
        also on error): a frozen controller manager creates no pods and collects no
        garbage, a frozen apiserver answers nothing (connections hang)."""
        [proc] = [c.proc for c in self._components if c.name == component and c.proc is not None]
        proc.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            proc.send_signal(signal.SIGCONT)

    def api_client(self) -> ApiClient:
        """A new ``kubernetes.client.ApiClient`` built from the kubeconfig file."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig_path))

    def start_fake_kubelet(self, **kwargs: Any) -> FakeKubelet:
        """Start a ``FakeKubelet`` for this cluster; ``stop()`` stops it too."""
        from tests.envtest.fake_kubelet import FakeKubelet

        if self.kubelet is not None:
            raise ControlPlaneError("a fake kubelet is already running for this control plane")
        self.kubelet = FakeKubelet(self.api_client, **kwargs).start()
        return self.kubelet

    def add_gpu_node(
        self,
        name: str,
        gpu_type: str,
        gpus: int,
        *,
        resource: str = "nvidia.com/gpu",
        labels: Mapping[str, str] | None = None,
        extra_resources: Mapping[str, int | str] | None = None,
        taints: Sequence[Mapping[str, str]] | None = (GPU_TAINT,),
        cpu: str = "64",
        memory: str = "512Gi",
        max_pods: int = 110,
        product: str | None = None,
    ) -> V1Node:
        """Register a Ready node with ``gpus`` units of ``resource``.

        Labels: ``fairq.io/gpu-type=<gpu_type>``, ``nvidia.com/gpu.product``,
        ``nvidia.com/gpu.count``, the usual ``kubernetes.io/*`` ones and
        ``FAKE_NODE_LABEL`` so the fake kubelet runs its pods. ``taints``
        defaults to ``GPU_TAINT``; pass ``()`` for an untainted node. Extra
        resources (e.g. ``{"nvidia.com/mig-1g.10gb": 7}``) go into capacity
        and allocatable alongside ``resource``.
        """
        from kubernetes import client

        all_labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "fairq.io/gpu-type": gpu_type,
            "nvidia.com/gpu.product": product or _default_product(gpu_type),
            "nvidia.com/gpu.count": str(gpus),
            FAKE_NODE_LABEL: "true",
        }
        all_labels.update(labels or {})
        capacity: dict[str, str] = {
            "cpu": cpu,
            "memory": memory,
            "pods": str(max_pods),
            "ephemeral-storage": "1Ti",
            resource: str(gpus),
        }
        for k, v in (extra_resources or {}).items():
            capacity[k] = str(v)
        now = _utcnow()
        body = client.V1Node(
            metadata=client.V1ObjectMeta(name=name, labels=all_labels),
            spec=client.V1NodeSpec(
                taints=[
                    client.V1Taint(key=t["key"], value=t.get("value"), effect=t["effect"])
                    for t in taints or ()
                ]
                or None
            ),
            # Node status is accepted on create (the kubelet would set it);
            # the fake kubelet keeps the Ready heartbeat fresh afterwards.
            status=client.V1NodeStatus(
                capacity=capacity,
                allocatable=dict(capacity),
                conditions=[
                    client.V1NodeCondition(
                        type="Ready",
                        status="True",
                        reason="KubeletReady",
                        message="fake kubelet is posting ready status",
                        last_heartbeat_time=now,
                        last_transition_time=now,
                    )
                ],
                addresses=[
                    client.V1NodeAddress(type="InternalIP", address="127.0.0.1"),
                    client.V1NodeAddress(type="Hostname", address=name),
                ],
                node_info=client.V1NodeSystemInfo(
                    architecture="amd64",
                    boot_id=uuid.uuid4().hex,
                    container_runtime_version="fake://0.0.0",
                    kernel_version="0.0.0-fake",
                    kube_proxy_version="v0.0.0-fake",
                    kubelet_version="v1.20.2-fake",
                    machine_id=uuid.uuid4().hex,
                    operating_system="linux",
                    os_image="fairq envtest fake node",
                    system_uuid=str(uuid.uuid4()),
                ),
            ),
        )
        with self.api_client() as api:
            return client.CoreV1Api(api).create_node(body)

    # ------------------------------------------------------------ internals

    def _write_pki(self) -> None:
        pki = self.workdir / "pki"
        pki.mkdir(exist_ok=True)
        (pki / "san.cnf").write_text(
            "[req]\ndistinguished_name=dn\n[dn]\n"
            "[ext]\nsubjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,"
            "DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:10.0.0.1\n"
            "basicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth,clientAuth\n"
        )
        # A CA and a serving cert signed by it, as a real cluster has: the CA
        # is what the kubeconfig trusts and what the controller-manager puts
        # into service-account token secrets (--root-ca-file).
        _openssl(
            "req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -subj /CN=envtest-ca",
            pki,
        )
        _openssl(
            "req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj /CN=apiserver", pki
        )
        _openssl(
            "x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt"
            " -days 3650 -extfile san.cnf -extensions ext",
            pki,
        )
        _openssl("genrsa -out sa.key 2048", pki)
        _openssl("rsa -in sa.key -pubout -out sa.pub", pki)

    def _write_auth_files(self) -> None:
        # system:masters bypasses RBAC: the admin and the controllers share it.
        (self.workdir / "tokens.csv").write_text(f'{self.token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "envtest",
                    "cluster": {"server": self.server, "certificate-authority": str(self.ca_path)},
                }
            ],
            "users": [{"name": ADMIN_USER, "user": {"token": self.token}}],
            "contexts": [{"name": "envtest", "context": {"cluster": "envtest", "user": ADMIN_USER}}],
            "current-context": "envtest",
        }
        # JSON is valid YAML, so no YAML writer is needed.
        self.kubeconfig_path.write_text(json.dumps(kubeconfig, indent=2))
        self.kubeconfig_path.chmod(0o600)

    def _components_for(self, ports: _Ports) -> list[_Component]:
        b = self.bin_dir
        pki = self.workdir / "pki"
        gates = ",".join(f"{k}={str(v).lower()}" for k, v in sorted(self.feature_gates.items()))
        # etcd's data lives on tmpfs when there is one: fsync there is free and
        # the apiserver is much quicker on a 2-core box with a slow disk.
        shm = Path("/dev/shm")
        data_root = shm if shm.is_dir() and os.access(shm, os.W_OK) else self.workdir
        self._etcd_data = Path(tempfile.mkdtemp(prefix="fairq-envtest-etcd-", dir=data_root))

        ca_ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        etcd = _Component(
            name="etcd",
            argv=[
                str(b / "etcd"),
                "--name=default",
                f"--data-dir={self._etcd_data}",
                f"--listen-client-urls=http://127.0.0.1:{ports.etcd_client}",
                f"--advertise-client-urls=http://127.0.0.1:{ports.etcd_client}",
                f"--listen-peer-urls=http://127.0.0.1:{ports.etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{ports.etcd_peer}",
                f"--initial-cluster=default=http://127.0.0.1:{ports.etcd_peer}",
                "--initial-cluster-state=new",
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
            ],
            log_path=self.log_path("etcd"),
            health_url=f"http://127.0.0.1:{ports.etcd_client}/health",
        )
        apiserver = _Component(
            name="kube-apiserver",
            argv=[
                str(b / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={ports.apiserver}",
                "--insecure-port=0",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--token-auth-file={self.workdir / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--api-audiences=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range=10.0.0.0/24",
                f"--enable-admission-plugins={','.join(self.admission_plugins)}",
                # Both are on by default in 1.20: ServiceAccount would reject
                # pods until the namespace's default SA exists (a race in
                # every fresh test namespace), TaintNodesByCondition would
                # leave new nodes tainted not-ready forever (no kubelet).
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
                f"--feature-gates={gates}",
                "--allow-privileged=true",
                "--profiling=false",
                "--endpoint-reconciler-type=none",
                "--event-ttl=1h",
            ],
            log_path=self.log_path("kube-apiserver"),
            health_url=f"{self.server}/readyz",
            ssl_context=ca_ctx,
            headers={"Authorization": f"Bearer {self.token}"},
        )
        controllers = ",".join(["*", *(f"-{c}" for c in self.disabled_controllers)])
        controller_manager = _Component(
            name="kube-controller-manager",
            argv=[
                str(b / "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig_path}",
                f"--authentication-kubeconfig={self.kubeconfig_path}",
                f"--authorization-kubeconfig={self.kubeconfig_path}",
                "--leader-elect=false",
                "--address=127.0.0.1",
                f"--port={ports.controller_manager}",
                "--secure-port=0",
                f"--controllers={controllers}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                "--use-service-account-credentials=false",
                f"--feature-gates={gates}",
                "--profiling=false",
            ],
            log_path=self.log_path("kube-controller-manager"),
            health_url=f"http://127.0.0.1:{ports.controller_manager}/healthz",
        )
        initial_backoff, max_backoff = self.scheduler_backoff_seconds
        sched_config = self.workdir / "kube-scheduler.yaml"
        sched_config.write_text(
            json.dumps(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1beta1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {"kubeconfig": str(self.kubeconfig_path)},
                    "leaderElection": {"leaderElect": False},
                    "healthzBindAddress": f"127.0.0.1:{ports.scheduler}",
                    "metricsBindAddress": f"127.0.0.1:{ports.scheduler}",
                    # Shorter than the 1 s/10 s defaults so a preemptor is
                    # retried soon after its victims are gone.
                    "podInitialBackoffSeconds": initial_backoff,
                    "podMaxBackoffSeconds": max_backoff,
                },
                indent=2,
            )
        )
        scheduler = _Component(
            name="kube-scheduler",
            argv=[
                str(b / "kube-scheduler"),
                f"--config={sched_config}",
                "--secure-port=0",
                f"--authentication-kubeconfig={self.kubeconfig_path}",
                f"--authorization-kubeconfig={self.kubeconfig_path}",
            ],
            log_path=self.log_path("kube-scheduler"),
            health_url=f"http://127.0.0.1:{ports.scheduler}/healthz",
        )
        return [etcd, apiserver, controller_manager, scheduler]

    def _launch(self, comp: _Component) -> None:
        self._components.append(comp)
        (self.workdir / f"{comp.name}.cmdline").write_text(" \\\n  ".join(comp.argv) + "\n")
        with open(comp.log_path, "ab") as log:
            comp.proc = subprocess.Popen(
                comp.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                # Own process group: a Ctrl-C in the terminal reaches pytest,
                # which then stops the components in order.
                start_new_session=True,
                preexec_fn=_set_pdeathsig,
            )

    def _wait_healthy(self, comp: _Component, *, deadline: float) -> None:
        last_error = "no answer yet"
        while True:
            assert comp.proc is not None
            code = comp.proc.poll()
            if code is not None:
                error = _PortClash if "address already in use" in _tail(comp.log_path) else ControlPlaneError
                raise error(
                    f"{comp.name} exited with code {code} during start; "
                    f"last lines of {comp.log_path}:\n{_tail(comp.log_path)}"
                )
            req = urllib.request.Request(comp.health_url, headers=comp.headers)
            try:
                with urllib.request.urlopen(req, timeout=2, context=comp.ssl_context) as resp:
                    body = resp.read().decode(errors="replace")
                    if resp.status == 200 and "false" not in body:
                        return
                    last_error = f"HTTP {resp.status}: {body[:200]}"
            except urllib.error.HTTPError as exc:
                last_error = f"HTTP {exc.code}: {exc.read()[:300].decode(errors='replace')}"
            except (urllib.error.URLError, OSError) as exc:
                last_error = str(exc)
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"{comp.name} not healthy at {comp.health_url} after {self.start_timeout:.0f}s "
                    f"({last_error}); last lines of {comp.log_path}:\n{_tail(comp.log_path)}"
                )
            time.sleep(0.2)

    def _wait_for_default_service_account(self, *, deadline: float) -> None:
        # The serviceaccount controller creating "default" proves the
        # controller-manager is really reconciling, not just serving /healthz.
        url = f"{self.server}/api/v1/namespaces/default/serviceaccounts/default"
        comp = next(c for c in self._components if c.name == "kube-controller-manager")
        api = next(c for c in self._components if c.name == "kube-apiserver")
        while True:
            req = urllib.request.Request(url, headers=api.headers)
            try:
                with urllib.request.urlopen(req, timeout=2, context=api.ssl_context) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if comp.proc is not None and comp.proc.poll() is not None:
                raise ControlPlaneError(
                    f"kube-controller-manager exited with code {comp.proc.returncode}; "
                    f"last lines of {comp.log_path}:\n{_tail(comp.log_path)}"
                )
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    "kube-controller-manager did not create the default service account in "
                    f"{self.start_timeout:.0f}s; last lines of {comp.log_path}:\n{_tail(comp.log_path)}"
                )
            time.sleep(0.2)


def _default_product(gpu_type: str) -> str:
    known = {
        "h100": "NVIDIA-H100-80GB-HBM3",
        "a100": "NVIDIA-A100-SXM4-80GB",
        "l40s": "NVIDIA-L40S",
        "a10": "NVIDIA-A10",
        "t4": "Tesla-T4",
    }
    return known.get(gpu_type.lower(), f"NVIDIA-{gpu_type.upper()}")


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def wait_for(
    predicate: Callable[[], Any], *, timeout: float = 30.0, interval: float = 0.2, what: str = "condition"
) -> Any:
    """Poll ``predicate`` until it returns a truthy value; return that value.

    Raises ``TimeoutError`` naming ``what`` (and the last exception the
    predicate raised, if any) when ``timeout`` seconds pass first.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:
            last_exc = exc
        if time.monotonic() > deadline:
            suffix = f" (last error: {last_exc!r})" if last_exc else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{suffix}")
        time.sleep(interval)
