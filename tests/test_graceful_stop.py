"""The graceful stop on the backends (docs/kubernetes.md, "Graceful stop"): the env a pod
gets, the preStop hook that sends a job's own stop signal on Kubernetes (run for real in
a PID namespace when the machine allows one), and the simulated cluster's stop, which
keeps a stopped workload's GPUs while its program saves and exits, at most its grace."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from queueing.backends.base import STOP_SIGNALS, LaunchSpec, Phase, workload_env
from queueing.backends.k8s_manifest import (
    ManifestError,
    ManifestOptions,
    job_manifest,
    stop_hook,
)
from queueing.backends.simulated import SimulatedCluster
from queueing.validation import STOP_ENV, env_name_reserved

from .test_k8s_manifest import spec

OPTS = ManifestOptions(namespace="fairq-vision", termination_grace_seconds=30)
T0 = datetime(2026, 12, 1, 12, 0).astimezone()
TOKEN = "tok-3f9a-secret"


def container(m: dict[str, Any]) -> dict[str, Any]:
    [c] = m["spec"]["template"]["spec"]["containers"]
    return c


# --- the env --------------------------------------------------------------------------------

def test_every_pod_gets_its_stop_signal_and_the_checkpoint_pair_only_when_offered() -> None:
    env = workload_env(spec(), replica=0, master_addr="")
    assert env["FAIRQ_STOP_SIGNAL"] == "SIGTERM"
    assert "FAIRQ_CHECKPOINT_URL" not in env and "FAIRQ_CHECKPOINT_TOKEN" not in env
    offered = spec(stop_signal="SIGUSR1", checkpoint_url="https://fairq.example/api/v1/"
                   "jobs/12/checkpoints/", checkpoint_token=TOKEN)
    env = workload_env(offered, replica=0, master_addr="")
    assert env["FAIRQ_STOP_SIGNAL"] == "SIGUSR1"
    assert env["FAIRQ_CHECKPOINT_URL"] == "https://fairq.example/api/v1/jobs/12/checkpoints/"
    assert env["FAIRQ_CHECKPOINT_TOKEN"] == TOKEN
    # A URL without its token (or the reverse) is not offered at all.
    assert "FAIRQ_CHECKPOINT_URL" not in workload_env(
        replace(offered, checkpoint_token=""), replica=0, master_addr="")


def test_the_stop_names_are_reserved_and_the_token_is_never_in_a_specs_repr() -> None:
    assert {"FAIRQ_STOP_SIGNAL", "FAIRQ_CHECKPOINT_URL", "FAIRQ_CHECKPOINT_TOKEN"} == STOP_ENV
    assert all(env_name_reserved(name) for name in STOP_ENV)
    for name in STOP_ENV:
        with pytest.raises(ManifestError, match="reserved"):
            job_manifest(spec(env={name: "x"}), OPTS)
    offered = spec(checkpoint_url="https://fairq.example/c/", checkpoint_token=TOKEN)
    assert TOKEN not in repr(offered) and TOKEN not in str(offered)


@pytest.mark.django_db
def test_the_api_refuses_a_users_own_stop_signal_env(world: Any) -> None:
    from .conftest import job_body

    body = job_body(env={"FAIRQ_STOP_SIGNAL": "SIGKILL", "FAIRQ_CHECKPOINT_TOKEN": "x"})
    r = world.client(world.member).post("/api/v1/jobs/", body, format="json")
    assert r.status_code == 400 and "env" in r.json()["error"]["fields"], r.content


# --- the preStop hook -------------------------------------------------------------------------

def test_sigterm_needs_no_hook_and_another_signal_gets_a_prestop_exec_within_the_grace() -> None:
    assert "lifecycle" not in container(job_manifest(spec(), OPTS))
    m = job_manifest(spec(stop_signal="SIGUSR1", termination_grace_seconds=10), OPTS)
    c = container(m)
    command = c["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["/bin/sh", "-c"]
    assert command[2].startswith("S=USR1; G=10; T=")
    assert m["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 10
    # No grace of its own: the backend's default, in the pod and in the hook's wait.
    c = container(job_manifest(spec(stop_signal="SIGINT"), OPTS))
    assert c["lifecycle"]["preStop"]["exec"]["command"][2].startswith("S=INT; G=30; T=")
    assert {e["name"]: e["value"] for e in c["env"]}["FAIRQ_STOP_SIGNAL"] == "SIGINT"


@pytest.mark.parametrize("signal", ["SIGKILL", "USR1", "SIGUSR1; rm -rf /", "", "sigusr1"])
def test_only_the_listed_signals_reach_the_hooks_script(signal: str) -> None:
    with pytest.raises(ManifestError, match="stop signal"):
        job_manifest(spec(stop_signal=signal), OPTS)


def test_every_listed_signal_but_sigterm_renders_a_hook() -> None:
    assert STOP_SIGNALS[0] == "SIGTERM"
    for signal in STOP_SIGNALS[1:]:
        hook = stop_hook(signal, grace=5)
        assert hook is not None and f"S={signal[3:]};" in hook["exec"]["command"][2]


def _pid_namespaces() -> bool:
    if shutil.which("unshare") is None or not os.path.exists("/bin/sh"):
        return False
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                              capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


needs_pid_namespace = pytest.mark.skipif(not _pid_namespaces(),
                                         reason="needs unshare --pid (root)")

PROGRAM = textwrap.dedent("""\
    import signal, subprocess, sys, time
    got = []
    signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
    # A DataLoader-like child: no handler, so SIGUSR1 would kill it.
    loader = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print("ready", flush=True)
    while not got:
        time.sleep(0.05)
    time.sleep(0.5)  # saving
    print(f"saved; loader alive: {loader.poll() is None}", flush=True)
    loader.kill()
""")


@needs_pid_namespace
@pytest.mark.parametrize("pid1", ["exec", "shell", "torchrun"])
def test_the_hook_signals_the_program_below_its_shell_or_launcher_and_waits_for_it(
    tmp_path: Path, pid1: str,
) -> None:
    """As the kubelet runs it: an exec in the container's PID namespace (here: a child of
    a process outside it, entered by nsenter), while PID 1 is the program itself, a shell
    running it, or a torchrun-like launcher (a Python console script under bin/) with two
    workers. Each worker gets the signal, saves and exits; its own child is left alone;
    the hook returns once they are gone, before its grace."""
    (tmp_path / "train.py").write_text(PROGRAM)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    launcher = bindir / "torchrun"
    launcher.write_text(f"#!{sys.executable}\n" + textwrap.dedent(f"""\
        import subprocess, sys
        kids = [subprocess.Popen([sys.executable, "{tmp_path / 'train.py'}"]) for _ in range(2)]
        sys.exit(max(k.wait() for k in kids))
    """))
    launcher.chmod(0o755)
    program = {"exec": f"exec {sys.executable} {tmp_path / 'train.py'}",
               "shell": f"{sys.executable} {tmp_path / 'train.py'}; echo shell-done",
               "torchrun": f"{launcher}; echo launcher-exit=$?"}[pid1]
    hook = stop_hook("SIGUSR1", grace=20)
    assert hook is not None
    (tmp_path / "hook.sh").write_text(hook["exec"]["command"][2])
    box = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "/bin/sh", "-c",
                            program], stdout=subprocess.PIPE, text=True)
    try:
        ready = 2 if pid1 == "torchrun" else 1
        lines = [box.stdout.readline() for _ in range(ready)]  # type: ignore[union-attr]
        assert all(line.strip() == "ready" for line in lines), lines
        inner = subprocess.run(["pgrep", "-P", str(box.pid)], capture_output=True,
                               text=True).stdout.split()[0]  # PID 1 of the namespace
        started = time.monotonic()
        done = subprocess.run(["nsenter", "-t", inner, "-p", "-m", "/bin/sh",
                               str(tmp_path / "hook.sh")], timeout=30)
        took = time.monotonic() - started
        out, _ = box.communicate(timeout=30)
    finally:
        box.kill()
    # The hook ends by itself once the program is gone, or with the namespace (killed
    # when its PID 1 exits), as an exec hook ends with its container.
    assert done.returncode in (0, -9) and took < 15, (done.returncode, took)
    saved = [line for line in out.splitlines() if line.startswith("saved")]
    assert saved == ["saved; loader alive: True"] * ready, out
    if pid1 == "torchrun":
        assert "launcher-exit=0" in out, out


# --- the simulated cluster ------------------------------------------------------------------

def launch(**overrides: Any) -> LaunchSpec:
    values: dict[str, Any] = {
        "name": "fq-7-1", "job_id": 7, "attempt": 1, "team": "vision", "tier": "low",
        "priority_class_name": "fairq-low", "gpu_type": "h100",
        "resource_name": "nvidia.com/gpu", "node_labels": {}, "gpus_per_replica": 8,
        "replicas": 2, "image": "ghcr.io/acme/train:1", "command": [], "args": [],
        "env": {"FAIRQ_SIM_SECONDS": "600"}, "max_runtime_seconds": None,
        "stop_signal": "SIGUSR1", "termination_grace_seconds": 10}
    values.update(overrides)
    return LaunchSpec(**values)


def held(cluster: SimulatedCluster) -> int:
    return sum(n.allocated for n in cluster.nodes())


def test_a_stopped_simulated_workload_gets_its_signal_and_keeps_its_gpus_until_it_exits() -> None:
    cluster = SimulatedCluster([("n0", "h100", 8), ("n1", "h100", 8)], stop_seconds=4)
    cluster.submit(launch(), now=T0)
    cluster.stop("fq-7-1", now=T0 + timedelta(seconds=30))
    [status] = cluster.statuses(now=T0 + timedelta(seconds=31))
    assert status.stopping and status.phase == Phase.RUNNING and held(cluster) == 16
    cluster.stop("fq-7-1", now=T0 + timedelta(seconds=32))  # a second stop: nothing new
    log = cluster.logs("fq-7-1")
    assert log.count("received SIGUSR1 (stop signal)") == 2  # each replica's log
    assert cluster.statuses(now=T0 + timedelta(seconds=33.9))[0].stopping
    assert cluster.statuses(now=T0 + timedelta(seconds=34)) == []
    assert held(cluster) == 0
    log = cluster.logs("fq-7-1")  # still readable after it left the list
    assert log.count("exited after SIGUSR1") == 2 and "==> fq-7-1-1 <==" in log


def test_a_simulated_program_slower_than_its_grace_is_killed_at_the_grace() -> None:
    cluster = SimulatedCluster([("n0", "h100", 8), ("n1", "h100", 8)], stop_seconds=30)
    cluster.submit(launch(termination_grace_seconds=3, replicas=1), now=T0)
    cluster.stop("fq-7-1", now=T0 + timedelta(seconds=10))
    assert cluster.statuses(now=T0 + timedelta(seconds=12))[0].stopping
    assert held(cluster) == 8
    assert cluster.statuses(now=T0 + timedelta(seconds=13)) == [] and held(cluster) == 0
    assert "killed (SIGKILL): its grace of 3 s ran out" in cluster.logs("fq-7-1")


def test_no_stop_time_frees_at_once_and_a_finished_workload_is_only_forgotten() -> None:
    cluster = SimulatedCluster([("n0", "h100", 8)], stop_seconds=0)
    cluster.submit(launch(replicas=1), now=T0)
    cluster.stop("fq-7-1", now=T0 + timedelta(seconds=1))
    assert cluster.statuses(now=T0 + timedelta(seconds=1)) == [] and held(cluster) == 0
    assert "received SIGUSR1" in cluster.logs("fq-7-1")
    slow = SimulatedCluster([("n0", "h100", 8)], stop_seconds=9)
    slow.submit(launch(replicas=1, env={"FAIRQ_SIM_SECONDS": "5"}), now=T0)
    slow.stop("fq-7-1", now=T0 + timedelta(seconds=6))  # it ended by itself already
    assert slow.statuses(now=T0 + timedelta(seconds=6)) == [] and held(slow) == 0
    assert "received" not in slow.logs("fq-7-1")


@pytest.mark.django_db
@pytest.mark.usefixtures("no_r9")
@override_settings(FAIRQ_SIM_STOP_SECONDS=4)
def test_rule_r8_a_preemptor_waits_while_its_simulated_victim_saves_and_exits(
    world: Any,
) -> None:
    from queueing.composition import get_backend
    from queueing.models import Job
    from queueing.policy.admission import WaitReason
    from queueing.policy.states import JobState
    from queueing.services.scheduler import scheduler_cycle

    from .test_scheduler_preemption import fill_h100, submit

    t0 = timezone.now() + timedelta(seconds=1)
    victim, _ = fill_h100(world, t0)
    high = submit(world, world.outsider, team="nlp", tier="high", gpus=8)
    r = scheduler_cycle(now=t0 + timedelta(seconds=100))
    assert r.preempted == [victim]
    name = f"fq-{victim}-1"
    statuses = {s.name: s for s in get_backend().statuses(now=t0 + timedelta(seconds=101))}
    assert statuses[name].stopping
    plan = scheduler_cycle(now=t0 + timedelta(seconds=102)).plan
    assert plan is not None and plan.waits[high].reason == WaitReason.PREEMPTING
    assert Job.objects.get(pk=high).status == JobState.QUEUED
    # Its logs were kept at the stop, before the signal; once it is gone they are kept
    # again, with what it wrote in its grace.
    kept = world.client(world.member).get(f"/api/v1/jobs/{victim}/logs/?attempt=1").json()
    assert kept["source"] == "archived" and not any("received" in x for x in kept["lines"])
    scheduler_cycle(now=t0 + timedelta(seconds=105))
    assert Job.objects.get(pk=high).status in (JobState.ADMITTED, JobState.RUNNING)
    kept = world.client(world.member).get(f"/api/v1/jobs/{victim}/logs/?attempt=1").json()
    assert kept["source"] == "archived", kept
    assert [line.split(" ", 1)[1] for line in kept["lines"][-2:]] == [
        "received SIGTERM (stop signal)", "exited after SIGTERM"], kept["lines"]


# --- the Kubernetes backend: last words, and the token kept out of refusals -------------------

def _pod(*, ended: bool, replica: str = "0") -> dict[str, Any]:
    state = {"terminated": {"exitCode": 0}} if ended else {"running": {}}
    return {"metadata": {"name": f"fq-12-1-{replica}-abcde", "namespace": "fairq-vision",
                         "deletionTimestamp": "2026-12-01T12:00:00Z",
                         "labels": {"app.kubernetes.io/managed-by": "fairq",
                                    "fairq.io/workload": "fq-12-1", "fairq.io/replica": replica}},
            "status": {"phase": "Running", "containerStatuses": [{"name": "main",
                                                                  "state": state}]}}


def test_a_stopped_pods_last_log_is_read_when_it_ends_and_answered_once_it_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kubernetes import client

    from queueing.backends.kubernetes import KubernetesBackend

    backend = KubernetesBackend(client.ApiClient(client.Configuration()))
    reads: list[tuple[str, Any]] = []

    def read_log(name: str, namespace: str, **kwargs: Any) -> str:
        reads.append((name, kwargs.get("tail_lines")))
        return f"step 40\nreceived SIGUSR1 at step 41\nsaved checkpoint step 41 ({name})"

    monkeypatch.setattr(backend.core, "read_namespaced_pod_log", read_log)
    backend._pod_changed("MODIFIED", _pod(ended=False), _pod(ended=False))  # still running
    backend._pod_changed("MODIFIED", _pod(ended=False), _pod(ended=True))   # it ended
    backend._pod_changed("MODIFIED", _pod(ended=True), _pod(ended=True))    # nothing new
    assert backend._last_words_pool is not None
    backend._last_words_pool.shutdown(wait=True)
    assert reads == [("fq-12-1-0-abcde", KubernetesBackend.LAST_WORDS_LINES)]
    # The pod is gone: logs() answers with what it wrote last, no pod listed.
    monkeypatch.setattr(backend, "_namespace_of", lambda name: None)
    monkeypatch.setattr(backend, "_list_everywhere", lambda *a, **k: [])
    assert backend.logs("fq-12-1", tail=2).splitlines() == [
        "received SIGUSR1 at step 41", "saved checkpoint step 41 (fq-12-1-0-abcde)"]
    assert backend.logs("fq-99-1") == ""


def test_the_checkpoint_token_is_cut_out_of_an_api_servers_refusal() -> None:
    from queueing.backends.kubernetes import _redacted

    offered = spec(checkpoint_url="https://fairq.example/c/", checkpoint_token=TOKEN)
    quoted = f'Job.batch "fq-12-1" is invalid: env[4].value: Invalid value: "{TOKEN}"'
    assert TOKEN not in _redacted(quoted, offered)
    assert "[checkpoint token]" in _redacted(quoted, offered)
    assert _redacted(quoted, spec()) == quoted
