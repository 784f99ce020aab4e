"""A preempted job saves and resumes, on the real control plane (Kubernetes 1.20,
tests/envtest): rules R11 (an owed claim preempts at once) and R8 with the graceful stop
of docs/kubernetes.md.

Team vision has a nominal quota of 16 h100 (the two 8-GPU nodes). Its `low` job runs
`examples/checkpointing/train.py` for real through the fake kubelet's exec mode (its
checkpoint PVC a temporary directory), with stop signal SIGUSR1 and a 10 s grace, and
reports its checkpoints to fairq's real endpoint (`live_server`: FAIRQ_CHECKPOINT_URL
with its FAIRQ_CHECKPOINT_TOKEN). Then the team submits a `critical` and a `high` job of
8 GPUs each: both owed (the team's GPUs at their tier or above, plus theirs, fit in 16),
the second one needing the low job's node. The low job is preempted in the cycle that
sees them, its pod deleted with its own grace; its program gets SIGUSR1, saves, reports
and exits, and the owed job runs once the pod is gone. The low job's kept log of attempt
1 shows the signal and the save; when the owed jobs end, attempt 2 resumes from that
checkpoint and runs to the end.

The fake kubelet serves no pod logs: the backend's pod log read is replaced by one that
answers with the exec-mode output of a pod that exists (404 once it is gone, as the API
server answers), so the "last words" are read the way they are on a real cluster.
"""

from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.envtest.test_k8s_backend import Kube, job, kube, submit, wait

__all__ = ["kube"]  # the fixture, imported for this module

pytestmark = [pytest.mark.k8s, pytest.mark.django_db(transaction=True)]

REPO = Path(__file__).resolve().parents[2]
IMAGE = "ghcr.io/acme/train-checkpointing:1"  # run for real by the fake kubelet
GRACE = 10
STEPS = 300


def _pvc(kube: Kube, directory: Path) -> None:
    """A PersistentVolume (an API object only) bound to the PVC `vision-checkpoints` in
    vision's namespace, so kube-scheduler binds pods that mount it; the fake kubelet maps
    the claim to `directory`."""
    ns = kube.ns("vision")
    kube.core.create_persistent_volume({
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"pv-{ns}"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "storageClassName": "", "hostPath": {"path": str(directory)},
                 "claimRef": {"namespace": ns, "name": "vision-checkpoints"}}})
    kube.core.create_namespaced_persistent_volume_claim(ns, {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "vision-checkpoints"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                 "volumeName": f"pv-{ns}", "resources": {"requests": {"storage": "1Gi"}}}})
    wait(lambda: kube.core.read_namespaced_persistent_volume_claim(
        "vision-checkpoints", ns).status.phase == "Bound", cycle=False, what="the PVC bound")


def _serve_exec_logs(kube: Kube, kubelet: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes.client.exceptions import ApiException

    def read_namespaced_pod_log(name: str, namespace: str, **kwargs: Any) -> str:
        try:
            kube.core.read_namespaced_pod(name, namespace)
        except ApiException as exc:
            raise ApiException(status=exc.status, reason=exc.reason) from None
        text = kubelet.pod_log(namespace, name) or ""
        tail = kwargs.get("tail_lines")
        return "\n".join(text.splitlines()[-tail:]) if tail else text

    monkeypatch.setattr(kube.backend.core, "read_namespaced_pod_log", read_namespaced_pod_log)


def test_r11_an_owed_claim_preempts_a_checkpointing_job_that_saves_and_resumes(
    kube: Kube, world: Any, k8s_control_plane: Any, live_server: Any, settings: Any,
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    from queueing.models import Checkpoint, JobEvent, Quota
    from queueing.services.scheduler import scheduler_cycle

    Quota.objects.filter(team=world.vision, gpu_type=world.h100).update(
        nominal=16, borrowing_limit=0)
    world.vision.allowed_pvcs = ["vision-checkpoints"]
    world.vision.save()
    settings.FAIRQ_PUBLIC_URL = live_server.url
    kubelet = k8s_control_plane.kubelet
    kubelet.exec_images.add(IMAGE)
    kubelet.exec_claims["vision-checkpoints"] = str(tmp_path)
    kubelet.exec_cwd = str(REPO)
    _serve_exec_logs(kube, kubelet, monkeypatch)
    try:
        _pvc(kube, tmp_path)
        low = submit(world, tier="low", gpus=8, image=IMAGE, env={},
                     command=["python", "examples/checkpointing/train.py"],
                     args=["--checkpoints", "/ckpt/run", "--steps", str(STEPS),
                           "--every", "20", "--step-seconds", "0.05"],
                     volumes=[{"name": "ckpt", "pvc": "vision-checkpoints",
                               "mount_path": "/ckpt"}],
                     stop_signal="SIGUSR1", termination_grace_seconds=GRACE,
                     checkpoint_interval_seconds=60)
        wait(lambda: job(low).status == "RUNNING", timeout=60, what="the low job RUNNING")
        # It reports through the real endpoint with its own token.
        wait(lambda: Checkpoint.objects.filter(job_id=low, attempt=1).exists(),
             timeout=30, what="a checkpoint of attempt 1 reported")
        [pod] = kube.pods("vision", f"fq-{low}-1")
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["FAIRQ_STOP_SIGNAL"] == "SIGUSR1"
        assert env["FAIRQ_CHECKPOINT_URL"] == \
            f"{live_server.url}/api/v1/jobs/{low}/checkpoints/"
        assert env["FAIRQ_CHECKPOINT_TOKEN"]
        assert pod["spec"]["terminationGracePeriodSeconds"] == GRACE

        # Two owed claims of the same team: 8 + 8 <= 16 at their tiers.
        critical = submit(world, tier="critical", gpus=8, env={"FAIRQ_SIM_SECONDS": "8"})
        high = submit(world, tier="high", gpus=8, env={"FAIRQ_SIM_SECONDS": "8"})
        cycles, owed = 0, []
        while job(low).attempt == 1 and cycles < 2:
            plan = scheduler_cycle().plan
            owed += [(p.preemptor_id, p.owed) for p in (plan.preemptions if plan else ())]
            cycles += 1
        assert job(low).attempt == 2, "the owed claim did not preempt within a cycle"
        # Rule R11: made for an owed claim (R9 would have had it wait: the victim ran
        # before the preemptor was submitted, and the preemptor has waited no time).
        assert owed == [(high, True)], owed
        preempted_at = time.monotonic()
        event = JobEvent.objects.get(job_id=low, kind=JobEvent.Kind.PREEMPTED)
        assert f"job #{high}" in event.reason or f"job #{critical}" in event.reason
        # The pod is deleted with its own grace (Foreground delete, no gracePeriodSeconds).
        going = wait(lambda: [p for p in kube.pods("vision", f"fq-{low}-1")
                              if p["metadata"].get("deletionTimestamp")]
                     or not kube.pods("vision", f"fq-{low}-1"),
                     cycle=False, timeout=10, what="the victim's pod being deleted")
        if isinstance(going, list):
            assert going[0]["metadata"]["deletionGracePeriodSeconds"] == GRACE
            print(f"victim pod deleted with deletionGracePeriodSeconds "
                  f"{going[0]['metadata']['deletionGracePeriodSeconds']}")
        print(f"preempted after {cycles} cycle(s) of the owed jobs: {event.reason}")
        wait(lambda: job(critical).status == "RUNNING" and job(high).status == "RUNNING",
             timeout=GRACE + 40, what="both owed jobs RUNNING")
        took = time.monotonic() - preempted_at
        print(f"owed jobs running {took:.1f} s after the preemption (grace {GRACE} s)")

        # The program got SIGUSR1, saved and reported in its grace: the checkpoint, and
        # the kept log of attempt 1 once its pod is gone.
        saved = Checkpoint.objects.filter(job_id=low, attempt=1).order_by("-step").first()
        assert saved is not None and saved.path.endswith(f"step-{saved.step}.ckpt")
        member = world.client(world.member)

        def kept() -> list[str]:
            body = member.get(f"/api/v1/jobs/{low}/logs/?attempt=1").json()
            return body["lines"] if body["source"] == "archived" else []

        lines = wait(lambda: (x := kept()) and any("received SIGUSR1" in s for s in x) and x,
                     timeout=30, what="attempt 1's kept log with its grace")
        text = "\n".join(lines)
        got = re.search(r"received SIGUSR1 at step (\d+); saving before exit", text)
        assert got is not None, text
        step = int(got.group(1))
        assert f"saved checkpoint step {step} to {tmp_path}/run/step-{step}.ckpt" in text
        assert saved.step == step and (tmp_path / "run" / f"step-{step}.ckpt").exists()
        print("attempt 1, kept:", *[x for x in lines if "SIGUSR1" in x or "saved" in x
                                    or "reported" in x][-4:], sep="\n  ")

        # The owed jobs end; attempt 2 resumes from that checkpoint and finishes.
        wait(lambda: job(low).status == "RUNNING" and job(low).attempt == 2, timeout=60,
             what="the low job running again as attempt 2")
        wait(lambda: job(low).status == "SUCCEEDED", timeout=60, what="attempt 2 done")
        wait(lambda: member.get(f"/api/v1/jobs/{low}/logs/?attempt=2").json()["source"]
             == "archived" or _archive(), timeout=30, what="attempt 2's log kept")
        body = member.get(f"/api/v1/jobs/{low}/logs/?attempt=2").json()
        assert body["lines"][0] == f"attempt 2 resuming from step {step} " \
            f"({tmp_path}/run/step-{step}.ckpt)", body["lines"][:3]
        assert body["lines"][-1].startswith(f"done: {STEPS} steps"), body["lines"][-3:]
        print("attempt 2, kept:", body["lines"][0], body["lines"][-1], sep="\n  ")
    finally:
        kubelet.exec_images.discard(IMAGE)
        kubelet.exec_claims.pop("vision-checkpoints", None)
        from kubernetes.client.exceptions import ApiException

        with contextlib.suppress(ApiException):
            kube.core.delete_persistent_volume(f"pv-{kube.ns('vision')}")


def _archive() -> bool:
    """Run the worker's log task once (the beat's job-logs-archive); never the answer."""
    from django.utils import timezone

    from queueing.composition import get_backend
    from queueing.services.logs import job_logs_archive

    job_logs_archive(backend=get_backend(), now=timezone.now())
    return False
