"""`k8s_api.RawPoster`, the backend's create of a Job, held to the generated client method
it replaces (`BatchV1Api.create_namespaced_job(..., _preload_content=False)`): over
fairq's manifests of every shape the same request reaches the API server (method, URL,
JSON body, content type, credentials), and every answer comes back the same (the
response on 2xx; on a refusal the same ApiException status, reason and body, so
`api_error` and the cycle classify it alike). The API server is a fake pool manager."""

from __future__ import annotations

import io
import json
import random
from typing import Any

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from queueing.backends.base import LaunchSpec
from queueing.backends.k8s_api import RawPoster, api_error, jobs_path
from queueing.backends.k8s_manifest import ManifestOptions, job_manifests, sign_job


class FakePool:
    """Records each request and answers `status` with `body`."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.body = status, body
        self.requests: list[dict[str, Any]] = []

    def request(self, method: str, url: str, **kw: Any) -> Any:
        self.requests.append({"method": method, "url": url, **kw})
        return urllib3.HTTPResponse(body=io.BytesIO(self.body), status=self.status, reason="Why",
                                    headers={"Content-Type": "application/json"},
                                    preload_content=False)


def api_client(token: str = "s3cret") -> Any:
    cfg = client.Configuration()
    cfg.host = "https://10.0.0.1:6443"
    cfg.api_key = {"authorization": token}
    cfg.api_key_prefix = {"authorization": "Bearer"}
    return client.ApiClient(cfg)


def spec(rng: random.Random, i: int) -> LaunchSpec:
    replicas = rng.choice([1, 2, 3])
    return LaunchSpec(
        name=f"fq-{i}-1", job_id=i, attempt=1, team="vision", tier="normal",
        priority_class_name="fairq-normal", gpu_type="h100", resource_name="nvidia.com/gpu",
        node_labels={"fairq.io/gpu-type": "h100"}, gpus_per_replica=rng.choice([1, 2, 8]),
        replicas=replicas, image="ghcr.io/acme/train:1.4", command=["python", "t.py"],
        args=["--x", "ünïcode ✓", '"quoted"'], env={"SEED": str(i), "EMPTY": ""},
        max_runtime_seconds=rng.choice([None, 3600]),
        placement=tuple(f"gpu-{rng.randint(0, 9)}" for _ in range(replicas)),
        cpu_millicores=rng.choice([None, 4000]), memory_bytes=rng.choice([None, 2**34]),
        shm_size_bytes=rng.choice([None, 2**30]), spot=rng.random() < 0.3,
        volumes=({"name": "data", "pvc": "imagenet", "mount_path": "/data",
                  "read_only": True},) if rng.random() < 0.5 else (),
        labels={"owner": "ana"} if rng.random() < 0.5 else {},
        annotations={"note": "a\nb"} if rng.random() < 0.5 else {},
        checkpoint_url="https://fairq.example/c", checkpoint_token="tok",
    )


def sent(pool: FakePool) -> dict[str, Any]:
    [req] = pool.requests
    headers = {k.lower(): v for k, v in (req.get("headers") or {}).items()}
    return {"method": req["method"], "url": req["url"],
            "body": json.loads(req["body"]),
            "content-type": headers.get("content-type"),
            "authorization": headers.get("authorization"),
            "user-agent": headers.get("user-agent")}


@pytest.mark.parametrize("seed", range(8))
def test_the_raw_post_sends_what_the_generated_method_sends(seed: int) -> None:
    rng = random.Random(seed)
    opts = ManifestOptions(namespace="fairq-vision", backoff_limit=0,
                           ttl_seconds_after_finished=600, indexed=rng.random() < 0.5)
    for i in range(6):
        for body in job_manifests(spec(rng, seed * 100 + i), opts):
            body = sign_job(body, b"k")
            generated, raw = api_client(), api_client()
            generated.rest_client.pool_manager = FakePool(201, b"{}")
            raw.rest_client.pool_manager = FakePool(201, b"{}")
            client.BatchV1Api(generated).create_namespaced_job(
                "fairq-vision", body, _preload_content=False).release_conn()
            RawPoster(raw).post(jobs_path("fairq-vision"),
                                json.dumps(body, separators=(",", ":")).encode()
                                ).release_conn()
            want, got = sent(generated.rest_client.pool_manager), \
                sent(raw.rest_client.pool_manager)
            # The raw post names its content type; the generated method leaves it out
            # and the API server reads JSON by default.
            assert got.pop("content-type") == "application/json"
            assert want.pop("content-type") in (None, "application/json")
            assert got == want
            assert got["body"] == json.loads(json.dumps(body))  # nothing added or lost
            assert got["authorization"] == "Bearer s3cret"


@pytest.mark.parametrize("status", [400, 403, 404, 409, 422, 429, 500, 503])
def test_a_refusal_raises_what_the_generated_method_raises(status: int) -> None:
    answer = json.dumps({"kind": "Status", "code": status,
                         "message": f'jobs.batch "fq-1-1" refused ({status})'}).encode()
    def generated_create(api: Any) -> None:
        client.BatchV1Api(api).create_namespaced_job(
            "fairq-vision", {"metadata": {"name": "fq-1-1"}}, _preload_content=False)

    def raw_create(api: Any) -> None:
        RawPoster(api).post(jobs_path("fairq-vision"), b'{"metadata":{}}')

    caught = []
    for create in (generated_create, raw_create):
        api = api_client()
        api.rest_client.pool_manager = FakePool(status, answer)
        with pytest.raises(ApiException) as info:
            create(api)
        caught.append(info.value)
    generated, raw = caught
    assert (raw.status, raw.reason, raw.body) == (generated.status, generated.reason,
                                                 generated.body)
    assert api_error(raw) == api_error(generated) == (status, f'jobs.batch "fq-1-1" refused ({status})')


def test_the_credentials_are_asked_again_once_a_second() -> None:
    api = api_client("old")
    poster = RawPoster(api)
    assert poster.headers()["authorization"] == "Bearer old"
    api.configuration.api_key = {"authorization": "new"}
    assert poster.headers()["authorization"] == "Bearer old"  # reused within the second
    poster._headers = (poster._headers[0] - RawPoster.AUTH_SECONDS, poster._headers[1])
    assert poster.headers()["authorization"] == "Bearer new"
