"""pytest fixtures for tests that need a real Kubernetes control plane.

- ``k8s_control_plane`` (session): a started ``ControlPlane`` with three fake
  GPU nodes (``DEFAULT_GPU_NODES``) and a fake kubelet running.
- ``k8s_api_client`` (session): a ``kubernetes.client.ApiClient`` for it.
- ``k8s_namespace`` (function): a fresh namespace, emptied on teardown.
- ``k8s_second_control_plane`` (session, started only by the tests that ask for it):
  another ``ControlPlane`` on other ports with ``SECOND_GPU_NODES`` (an h100 and an
  l40s node) and its own fake kubelet; ``k8s_second_api_client`` its client. With the
  first one, two clusters for fairq.

When the binaries from ``tests/envtest/build.sh`` (or the ``kubernetes``
package) are missing these fixtures skip, unless ``FAIRQ_REQUIRE_ENVTEST`` is
set: then a missing piece fails the test, so CI cannot go green by skipping.

Nothing here imports Django or fairq, and nothing at import time needs the
``kubernetes`` package, so collecting this directory is safe in any venv.
"""

from __future__ import annotations

import time
import uuid
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from tests.envtest.cluster import (
    DEFAULT_GPU_NODES,
    SECOND_GPU_NODES,
    ControlPlane,
    default_bin_dir,
    envtest_required,
    missing_binaries,
)

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, BatchV1Api, CoreV1Api


def pytest_configure(config: pytest.Config) -> None:
    # Registered here (not only in the project's pytest config) so the marker
    # is known whatever config, or none (-c /dev/null), the run uses.
    config.addinivalue_line(
        "markers",
        "k8s: needs the envtest Kubernetes control plane (build it with tests/envtest/build.sh)",
    )


def _unavailable(reason: str) -> None:
    if envtest_required():
        pytest.fail(f"{reason} (FAIRQ_REQUIRE_ENVTEST is set, so this is a failure, not a skip)")
    pytest.skip(f"{reason}; set FAIRQ_REQUIRE_ENVTEST=1 to make this a failure")


def _started(gpu_nodes: tuple[tuple[str, str, int], ...]) -> Iterator[ControlPlane]:
    """A started control plane with `gpu_nodes` and a fake kubelet, stopped after."""
    missing = missing_binaries()
    if missing:
        _unavailable(
            f"envtest binaries missing in {default_bin_dir()}: {', '.join(missing)}; "
            "run tests/envtest/build.sh (~5 min once, cached after)"
        )
    try:
        import kubernetes  # noqa: F401
    except ImportError:
        _unavailable("the 'kubernetes' Python package is not installed")

    cp = ControlPlane(gpu_nodes=gpu_nodes, fake_kubelet=True)
    try:
        cp.start()
        yield cp
        kubelet = cp.kubelet
        if kubelet is not None and kubelet.errors:
            # Not a failure (a dropped watch is retried), but worth seeing.
            warnings.warn(
                f"fake kubelet reported {len(kubelet.errors)} error(s), last: {kubelet.errors[-5:]}",
                stacklevel=1,
            )
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def k8s_control_plane() -> Iterator[ControlPlane]:
    yield from _started(DEFAULT_GPU_NODES)


@pytest.fixture(scope="session")
def k8s_api_client(k8s_control_plane: ControlPlane) -> Iterator[ApiClient]:
    api = k8s_control_plane.api_client()
    try:
        yield api
    finally:
        api.close()


@pytest.fixture(scope="session")
def k8s_second_control_plane() -> Iterator[ControlPlane]:
    """A second cluster: its own ports, temp dir and etcd, ``SECOND_GPU_NODES``. Session
    scoped, and started only when a test asks for it (~10-20 s)."""
    yield from _started(SECOND_GPU_NODES)


@pytest.fixture(scope="session")
def k8s_second_api_client(k8s_second_control_plane: ControlPlane) -> Iterator[ApiClient]:
    api = k8s_second_control_plane.api_client()
    try:
        yield api
    finally:
        api.close()


@pytest.fixture
def k8s_namespace(k8s_api_client: ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A new namespace; on teardown its Jobs and Pods are gone before the next test.

    Pods are deleted with grace period 0 and waited for, because the next
    test shares the GPU nodes and must find their capacity free; the
    namespace itself is then deleted without waiting.
    """
    from kubernetes import client

    core = client.CoreV1Api(k8s_api_client)
    batch = client.BatchV1Api(k8s_api_client)
    slug = "".join(ch if ch.isalnum() else "-" for ch in request.node.name.lower())[:40].strip("-")
    name = f"t-{slug}-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        _empty_namespace(core, batch, name)
        core.delete_namespace(name, propagation_policy="Background")


def _empty_namespace(core: CoreV1Api, batch: BatchV1Api, namespace: str, timeout: float = 60.0) -> None:
    batch.delete_collection_namespaced_job(namespace, propagation_policy="Background")
    deadline = time.monotonic() + timeout
    while True:
        pods: list[Any] = core.list_namespaced_pod(namespace).items
        if not pods:
            return
        # Also catches pods the Job controller creates between two rounds.
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        if time.monotonic() > deadline:
            names = ", ".join(str(p.metadata.name) for p in pods)
            raise TimeoutError(f"pods still present in {namespace} after {timeout:.0f}s: {names}")
        time.sleep(0.3)
