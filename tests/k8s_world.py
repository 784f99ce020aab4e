"""Random Kubernetes worlds as the API server would send them to fairq's watches: Jobs
built by fairq's own manifests (signed), their pods as the Job controller, kube-scheduler
and a kubelet leave them (every phase, container state, deletion, orphans), other
workloads' pods, GPU nodes; each with the server's fields (uid, resourceVersion,
creationTimestamp, managedFields). Pure: no cluster, no Django. Used by
tests/test_k8s_slim_cache.py (the slim watch cache held to the full objects) and
bench/bench_k8s_fleet.py (what 150,000 pods cost the cache)."""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from queueing.backends.base import LaunchSpec
from queueing.backends.k8s_manifest import (
    GpuTypeRef,
    ManifestOptions,
    job_manifests,
    owner_reference,
    sign_job,
)

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
KEY = b"world-key"
GPU_TYPES = (GpuTypeRef("h100", "nvidia.com/gpu", {"fairq.io/gpu-type": "h100"}),
             GpuTypeRef("l40s", "nvidia.com/gpu", {"fairq.io/gpu-type": "l40s"}),
             GpuTypeRef("mig", "nvidia.com/mig-1g.10gb", {"fairq.io/gpu-type": "mig"}))


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def fields_v1(obj: Any) -> Any:
    """managedFields' fieldsV1 for `obj`, as the API server writes it ({"f:key": ...},
    list items by key): about as many bytes as the object itself."""
    if isinstance(obj, dict):
        return {f"f:{k}": fields_v1(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return {f'k:{{"name":"{i.get("name", n)}"}}' if isinstance(i, dict) else f"v:{i}":
                fields_v1(i) for n, i in enumerate(obj)}
    return {}


def managed(manager: str, part: dict[str, Any], at: datetime) -> dict[str, Any]:
    return {"manager": manager, "operation": "Update", "apiVersion": "v1",
            "time": iso(at), "fieldsType": "FieldsV1", "fieldsV1": fields_v1(part)}


@dataclass
class World:
    jobs: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)  # fairq's
    other_pods: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=list)


def node_object(name: str, gpu_type: str, gpus: int, rng: random.Random) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
              "fairq.io/gpu-type": gpu_type, "topology.kubernetes.io/zone": f"z{rng.randint(0, 3)}"}
    if rng.random() < 0.2:
        labels["karpenter.sh/capacity-type"] = "spot"
    taints = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    if rng.random() < 0.05:
        taints.append({"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"})
    resource = next(g.resource_name for g in GPU_TYPES if g.slug == gpu_type)
    alloc = {"cpu": "96", "memory": "1Ti", "pods": "250", resource: str(gpus)}
    spec = {"taints": taints, "unschedulable": rng.random() < 0.05,
            "providerID": f"fake://{name}"}
    status = {
        "capacity": dict(alloc), "allocatable": alloc,
        "conditions": [{"type": t, "status": "True" if t == "Ready" else "False",
                        "lastHeartbeatTime": iso(T0), "lastTransitionTime": iso(T0),
                        "reason": f"Kubelet{t}", "message": f"kubelet says {t}"}
                       for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")],
        "addresses": [{"type": "InternalIP", "address": f"10.0.{rng.randint(0, 255)}.1"},
                      {"type": "Hostname", "address": name}],
        "nodeInfo": {"kubeletVersion": "v1.20.2", "osImage": "Ubuntu 22.04",
                     "containerRuntimeVersion": "containerd://1.7.2",
                     "machineID": f"{rng.getrandbits(128):032x}"},
        "images": [{"names": [f"registry.example/team/img{i}@sha256:{rng.getrandbits(256):064x}",
                              f"registry.example/team/img{i}:v{i}"],
                    "sizeBytes": rng.randint(10**8, 10**10)} for i in range(20)],
    }
    meta = {"name": name, "uid": f"node-{name}", "resourceVersion": str(rng.randint(1, 10**6)),
            "creationTimestamp": iso(T0 - timedelta(days=3)), "labels": labels,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"}}
    meta["managedFields"] = [managed("kubelet", {"metadata": {"labels": labels}, "status": status},
                                     T0)]
    return {"metadata": meta, "spec": spec, "status": status}


def pod_status(rng: random.Random, created: datetime) -> tuple[dict[str, Any], bool]:
    """A random pod status, and whether the pod is bound to a node."""
    phase = rng.choice(["Pending", "Pending", "Running", "Running", "Running", "Succeeded",
                        "Failed"])
    start = created + timedelta(seconds=rng.randint(1, 30))
    end = start + timedelta(seconds=rng.randint(1, 3600))
    state: dict[str, Any]
    bound = phase != "Pending" or rng.random() < 0.5
    if phase == "Pending":
        state = {"waiting": {"reason": rng.choice(["ContainerCreating", "ErrImagePull",
                                                   "ImagePullBackOff"]),
                             "message": "pulling"}}
    elif phase == "Running":
        state = {"running": {"startedAt": iso(start)}}
    else:
        code = 0 if phase == "Succeeded" else rng.choice([1, 137, 2])
        state = {"terminated": {"startedAt": iso(start), "finishedAt": iso(end),
                                "exitCode": code, "reason": "Completed" if not code else
                                rng.choice(["Error", "OOMKilled"]),
                                "containerID": f"containerd://{rng.getrandbits(128):032x}"}}
        if code and rng.random() < 0.5:
            state["terminated"]["message"] = "CUDA error: out of memory"
    status: dict[str, Any] = {
        "phase": phase, "qosClass": "Guaranteed", "hostIP": "10.0.0.1",
        "conditions": [{"type": t, "status": "True", "lastProbeTime": None,
                        "lastTransitionTime": iso(start)}
                       for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")],
    }
    if bound and phase != "Pending":
        status["startTime"] = iso(start)
        status["podIP"] = f"10.1.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
        status["podIPs"] = [{"ip": status["podIP"]}]
    if (phase != "Pending" or bound) and rng.random() < 0.9:  # else not reported yet
        status["containerStatuses"] = [{
            "name": "main", "state": state, "lastState": {}, "ready": phase == "Running",
            "restartCount": rng.choice([0, 0, 0, 1, 3]), "image": "ghcr.io/acme/train:1.4",
            "imageID": f"ghcr.io/acme/train@sha256:{rng.getrandbits(256):064x}",
            "started": phase == "Running"}]
    return status, bound


def workload(rng: random.Random, job_id: int, nodes: list[str], *,
             namespace: str = "fairq-vision") -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One attempt: its Jobs (one per replica) and their pods, as the server has them."""
    replicas = rng.choice([1, 1, 1, 2, 3])
    spec = LaunchSpec(
        name=f"fq-{job_id}-1", job_id=job_id, attempt=1, team=namespace.split("-", 1)[1],
        tier="normal", priority_class_name="fairq-normal", gpu_type="h100",
        resource_name="nvidia.com/gpu", node_labels={"fairq.io/gpu-type": "h100"},
        gpus_per_replica=rng.choice([1, 2, 4, 8]), replicas=replicas,
        image="ghcr.io/acme/train:1.4",
        command=["python", "-m", "torch.distributed.run", "train.py"],
        args=["--epochs", "3", "--lr", "0.0003", "--data", "/data/imagenet"],
        env={"SEED": str(job_id), "WANDB_PROJECT": "vision", "NCCL_DEBUG": "WARN"},
        max_runtime_seconds=rng.choice([3600, 86400, None]),
        placement=tuple(rng.choice(nodes) for _ in range(replicas)),
        cpu_millicores=8000, memory_bytes=64 << 30, shm_size_bytes=16 << 30,
        checkpoint_url="https://fairq.example/api/v1/jobs/1/checkpoints",
        checkpoint_token="t" * 40,
    )
    opts = ManifestOptions(namespace=namespace, backoff_limit=0, ttl_seconds_after_finished=600,
                           indexed=True)
    created = T0 - timedelta(seconds=rng.randint(0, 7200))
    jobs: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    owner_uid = ""
    for index, raw in enumerate(job_manifests(spec, opts)):
        body = sign_job(raw if index == 0 else
                        {**raw, "metadata": {**raw["metadata"], "ownerReferences": [
                            owner_reference({"metadata": {"name": spec.name,
                                                          "uid": owner_uid}})]}}, KEY)
        job = copy.deepcopy(body)
        meta = job["metadata"]
        meta["uid"] = f"job-{job_id}-{index}"
        owner_uid = owner_uid or meta["uid"]
        meta["resourceVersion"] = str(rng.randint(1, 10**6))
        meta["creationTimestamp"] = iso(created)
        meta["generation"] = 1
        if rng.random() < 0.05:
            meta["deletionTimestamp"] = iso(T0)
            meta["finalizers"] = ["foregroundDeletion"]
        job["spec"]["selector"] = {"matchLabels": {"controller-uid": meta["uid"]}}
        job["spec"]["template"]["metadata"].setdefault("labels", {})["controller-uid"] = meta["uid"]
        status: dict[str, Any] = {}
        roll = rng.random()
        if roll < 0.15:
            status = {"conditions": [{"type": "Complete", "status": "True",
                                      "lastProbeTime": iso(T0), "lastTransitionTime": iso(T0)}],
                      "succeeded": 1, "completionTime": iso(T0), "startTime": iso(created)}
        elif roll < 0.25:
            status = {"conditions": [{"type": "Failed", "status": "True",
                                      "reason": rng.choice(["BackoffLimitExceeded",
                                                            "DeadlineExceeded"]),
                                      "message": "Job has reached the specified backoff limit",
                                      "lastProbeTime": iso(T0), "lastTransitionTime": iso(T0)}],
                      "failed": 1, "startTime": iso(created)}
        elif roll < 0.9:
            status = {"active": 1, "startTime": iso(created)}
        job["status"] = status
        meta["managedFields"] = [managed("fairq", {"metadata": body["metadata"],
                                                   "spec": body["spec"]}, created),
                                 managed("kube-controller-manager", {"status": status}, T0)]
        jobs.append(job)
        for attempt in range(rng.choice([0, 1, 1, 1, 2])):
            pod_created = created + timedelta(seconds=attempt * 60 + rng.randint(0, 5))
            template = copy.deepcopy(job["spec"]["template"])
            pmeta = template["metadata"]
            pmeta.update({
                "name": f"{meta['name']}-{rng.getrandbits(24):06x}",
                "generateName": f"{meta['name']}-", "namespace": namespace,
                "uid": f"pod-{job_id}-{index}-{attempt}",
                "resourceVersion": str(rng.randint(1, 10**6)),
                "creationTimestamp": iso(pod_created),
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                     "name": meta["name"], "uid": meta["uid"],
                                     "controller": True, "blockOwnerDeletion": True}],
            })
            pmeta["labels"]["job-name"] = meta["name"]
            if rng.random() < 0.1:
                pmeta["ownerReferences"] = []  # orphaned
            elif rng.random() < 0.1:  # an earlier Job's of the same name, going
                pmeta["ownerReferences"][0]["uid"] = f"earlier-{meta['uid']}"
            if rng.random() < 0.08:
                pmeta["deletionTimestamp"] = iso(T0)
                pmeta["deletionGracePeriodSeconds"] = 30
            pspec = template["spec"]
            status, bound = pod_status(rng, pod_created)
            if bound:
                pspec["nodeName"] = rng.choice(nodes)
            pspec.update({"serviceAccountName": "default", "schedulerName": "default-scheduler",
                          "dnsPolicy": "ClusterFirst", "enableServiceLinks": True,
                          "preemptionPolicy": "PreemptLowerPriority"})
            pmeta["managedFields"] = [
                managed("kube-controller-manager", {"metadata": pmeta, "spec": pspec},
                        pod_created),
                managed("kubelet", {"status": status}, T0)]
            pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": pmeta, "spec": pspec,
                         "status": status})
    return jobs, pods


def other_pod(rng: random.Random, i: int, nodes: list[str]) -> dict[str, Any]:
    created = T0 - timedelta(seconds=rng.randint(0, 7200))
    status, _ = pod_status(rng, created)
    status["phase"] = rng.choice(["Running", "Pending"])
    spec = {"nodeName": rng.choice(nodes), "containers": [
        {"name": "serve", "image": "nginx:1.25",
         "resources": {"limits": {"nvidia.com/gpu": str(rng.randint(1, 2)), "cpu": "2",
                                  "memory": "4Gi"}}}],
        "initContainers": [{"name": "init", "image": "busybox",
                            "resources": {"requests": {"cpu": "4", "memory": "1Gi"}}}]
        if rng.random() < 0.3 else []}
    meta = {"name": f"serve-{i}", "namespace": "inference", "uid": f"other-{i}",
            "resourceVersion": str(rng.randint(1, 10**6)), "creationTimestamp": iso(created),
            "labels": {"app": "serve"}}
    return {"metadata": meta, "spec": spec, "status": status}


def world(seed: int, *, workloads: int = 40, nodes: int = 8, others: int = 6) -> World:
    rng = random.Random(seed)
    w = World()
    names = [f"gpu-{i}" for i in range(nodes)]
    for i, name in enumerate(names):
        w.nodes.append(node_object(name, GPU_TYPES[i % 2].slug, rng.choice([4, 8]), rng))
    for job_id in range(1, workloads + 1):
        jobs, pods = workload(rng, job_id, names)
        if rng.random() < 0.1:  # its Jobs gone (deleted outside fairq): pods left
            jobs = []
        elif rng.random() < 0.1:  # replica 0's Job gone, the other replicas' not
            jobs = jobs[1:]
        w.jobs.extend(jobs)
        w.pods.extend(pods)
    w.other_pods = [other_pod(rng, i, names) for i in range(others)]
    return w
