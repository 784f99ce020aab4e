"""Checkpoints and graceful stop (docs/api.md, "Checkpoints and graceful stop"): the two
job fields at submit, the per-attempt token in the launch spec, the report endpoint
(201/400/401/403/409), the grace window of rule R6's preempted attempt, the lost
GPU-hours of a preemption, and the snapshot's RunningJob.checkpointed_at, .grace_seconds
and PreemptionSettings per tier."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from queueing.composition import get_backend
from queueing.models import Checkpoint, Job, JobEvent, UsageRecord
from queueing.policy.states import JobState
from queueing.selectors.snapshot import build_snapshot
from queueing.services.checkpoints import (
    checkpoint_claim,
    checkpoint_report,
    checkpoint_token,
    lost_gpu_hours,
)
from queueing.services.scheduler import launch_spec, scheduler_cycle
from tests.conftest import World, job_body

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_r9")]


def submit(world: World, user: Any = None, **body: Any) -> int:
    r = world.client(user or world.member).post("/api/v1/jobs/", job_body(**body),
                                                 format="json")
    assert r.status_code == 201, r.json()
    return int(r.json()["id"])


def running(world: World, t0: datetime, **body: Any) -> Job:
    """One vision job of 8 h100 GPUs, running since `t0`."""
    pk = submit(world, gpus=8, tier="low", env={"FAIRQ_SIM_SECONDS": "5000"}, **body)
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0)
    job = Job.objects.get(pk=pk)
    assert job.status == JobState.RUNNING and job.started_at == t0
    return job


def fill_and_preempt(world: World, t0: datetime, at: datetime, **body: Any) -> Job:
    """Vision fills both h100 nodes (two low jobs of 8 GPUs); nlp's high job of 8 preempts
    the first one at `at`. Returns the victim, requeued as attempt 2."""
    victim = running(world, t0, name="victim", **body)
    submit(world, name="other", gpus=8, tier="low", env={"FAIRQ_SIM_SECONDS": "5000"})
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0)
    submit(world, world.outsider, team="nlp", tier="high", gpus=8)
    r = scheduler_cycle(now=at)
    assert r.preempted == [victim.pk]
    victim.refresh_from_db()
    assert victim.status == JobState.QUEUED and victim.attempt == 2
    return victim


def bearer(token: str) -> APIClient:
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return c


def report(job: Job, body: Any = None, *, attempt: int | None = None) -> Any:
    token = checkpoint_token(job_id=job.pk, attempt=job.attempt if attempt is None else attempt)
    return bearer(token).post(f"/api/v1/jobs/{job.pk}/checkpoints/", body or {}, format="json")


# --- submit ------------------------------------------------------------------------------

def test_a_job_submits_its_stop_signal_and_checkpoint_interval(world: World) -> None:
    r = world.client(world.member).post("/api/v1/jobs/", job_body(
        stop_signal="SIGUSR1", checkpoint_interval_seconds=1800), format="json")
    assert r.status_code == 201, r.json()
    assert (r.json()["stop_signal"], r.json()["checkpoint_interval_seconds"]) == ("SIGUSR1", 1800)
    job = Job.objects.get(pk=r.json()["id"])
    assert (job.stop_signal, job.checkpoint_interval_seconds) == ("SIGUSR1", 1800)
    plain = Job.objects.get(pk=submit(world, name="plain"))
    assert (plain.stop_signal, plain.checkpoint_interval_seconds) == ("SIGTERM", None)


def test_it_refuses_an_unknown_signal_and_an_interval_under_a_minute(world: World) -> None:
    r = world.client(world.member).post("/api/v1/jobs/", job_body(
        stop_signal="SIGKILL", checkpoint_interval_seconds=59), format="json")
    assert r.status_code == 400
    fields = r.json()["error"]["fields"]
    assert fields["stop_signal"] == ["One of SIGTERM, SIGINT, SIGUSR1, SIGUSR2, SIGHUP."]
    assert "at least 60" in fields["checkpoint_interval_seconds"][0]
    assert not Job.objects.exists()


def test_an_array_keeps_the_two_fields_on_every_member(world: World) -> None:
    r = world.client(world.member).post("/api/v1/jobs/bulk/", {
        **job_body(stop_signal="SIGINT", checkpoint_interval_seconds=600), "count": 3},
        format="json")
    assert r.status_code == 201, r.json()
    members = Job.objects.filter(array_id=r.json()["array_id"])
    assert {(j.stop_signal, j.checkpoint_interval_seconds) for j in members} == {("SIGINT", 600)}


# --- launch ------------------------------------------------------------------------------

def test_the_launch_spec_carries_the_signal_and_the_attempts_url_and_token(
        world: World, settings: Any) -> None:
    settings.FAIRQ_PUBLIC_URL = "https://fairq.example.com/"
    job = Job.objects.select_related("team", "tier", "gpu_type").get(
        pk=submit(world, stop_signal="SIGUSR2"))
    spec = launch_spec(job)
    assert spec.stop_signal == "SIGUSR2"
    assert spec.checkpoint_url == f"https://fairq.example.com/api/v1/jobs/{job.pk}/checkpoints/"
    claim = checkpoint_claim(spec.checkpoint_token)
    assert claim is not None and (claim.job_id, claim.attempt) == (job.pk, 1)


def test_without_a_public_url_no_reporting_is_offered(world: World, settings: Any) -> None:
    settings.FAIRQ_PUBLIC_URL = ""
    job = Job.objects.select_related("team", "tier", "gpu_type").get(pk=submit(world))
    spec = launch_spec(job)
    assert (spec.checkpoint_url, spec.checkpoint_token, spec.stop_signal) == ("", "", "SIGTERM")


# --- the endpoint ------------------------------------------------------------------------

def test_a_running_attempt_reports_a_checkpoint_201_and_people_list_them(world: World) -> None:
    job = running(world, timezone.now() - timedelta(minutes=5))
    r = report(job, {"step": 1200, "progress": 0.4, "path": "/ckpt/step-1200.pt"})
    assert r.status_code == 201, r.json()
    assert (r.json()["step"], r.json()["progress"], r.json()["attempt"]) == (1200, 0.4, 1)
    assert report(job, {"step": 1300}).status_code == 201
    job.refresh_from_db()
    newest = Checkpoint.objects.filter(job=job).order_by("-created_at").first()
    assert newest is not None and job.checkpointed_at == newest.created_at
    listed = world.client(world.member).get(f"/api/v1/jobs/{job.pk}/checkpoints/")
    assert listed.status_code == 200
    assert [c["step"] for c in listed.json()] == [1300, 1200]  # newest first
    detail = world.client(world.member).get(f"/api/v1/jobs/{job.pk}/").json()
    assert detail["checkpoint"]["step"] == 1300 and detail["checkpointed_at"] is not None
    # Outsiders see nothing (404), a checkpoint token lists nothing (401).
    assert world.client(world.outsider).get(
        f"/api/v1/jobs/{job.pk}/checkpoints/").status_code == 404
    token = checkpoint_token(job_id=job.pk, attempt=1)
    assert bearer(token).get(f"/api/v1/jobs/{job.pk}/checkpoints/").status_code == 401


def test_a_users_token_is_refused_403_with_what_to_use(world: World) -> None:
    job = running(world, timezone.now() - timedelta(minutes=5))
    r = world.client(world.member).post(f"/api/v1/jobs/{job.pk}/checkpoints/", {"step": 1},
                                        format="json")
    assert r.status_code == 403
    assert "FAIRQ_CHECKPOINT_TOKEN" in r.json()["error"]["message"]
    assert not Checkpoint.objects.exists()


def test_a_token_for_another_job_is_refused_403(world: World) -> None:
    job = running(world, timezone.now() - timedelta(minutes=5))
    other = submit(world, name="other")
    token = checkpoint_token(job_id=other, attempt=1)
    r = bearer(token).post(f"/api/v1/jobs/{job.pk}/checkpoints/", {}, format="json")
    assert r.status_code == 403
    assert r.json()["error"]["message"] == (
        f"This token reports checkpoints of job {other} only, not of job {job.pk}.")


def test_a_forged_or_tampered_token_is_401(world: World) -> None:
    job = running(world, timezone.now() - timedelta(minutes=5))
    token = checkpoint_token(job_id=job.pk, attempt=1)
    assert bearer(token[:-2] + "xx").post(f"/api/v1/jobs/{job.pk}/checkpoints/", {},
                                          format="json").status_code == 401
    assert APIClient().post(f"/api/v1/jobs/{job.pk}/checkpoints/", {},
                            format="json").status_code == 401


def test_bad_fields_are_400_naming_each(world: World) -> None:
    job = running(world, timezone.now() - timedelta(minutes=5))
    r = report(job, {"step": -1, "progress": 1.5, "path": 7})
    assert r.status_code == 400
    assert set(r.json()["error"]["fields"]) == {"step", "progress", "path"}
    r = report(job, {"epoch": 3})
    assert r.status_code == 400 and "epoch" in r.json()["error"]["fields"]
    assert not Checkpoint.objects.exists()


def test_a_queued_job_that_never_ran_is_409(world: World) -> None:
    job = Job.objects.get(pk=submit(world))
    r = report(job, {"step": 1})
    assert r.status_code == 409 and "is over" in r.json()["error"]["message"]


def test_rule_r6_a_preempted_attempt_reports_in_its_grace_then_409(world: World) -> None:
    t0 = timezone.now() - timedelta(minutes=10)
    victim = fill_and_preempt(world, t0, t0 + timedelta(minutes=5),
                              termination_grace_seconds=30)
    stopped = t0 + timedelta(minutes=5)
    # During the grace (30 s): accepted for attempt 1; after: 409.
    checkpoint_report(claim=checkpoint_claim(checkpoint_token(job_id=victim.pk, attempt=1)),
                      job_id=victim.pk, step=7, now=stopped + timedelta(seconds=3))
    with pytest.raises(Exception) as refused:
        checkpoint_report(claim=checkpoint_claim(checkpoint_token(job_id=victim.pk, attempt=1)),
                          job_id=victim.pk, now=stopped + timedelta(seconds=31))
    assert getattr(refused.value, "status_code", None) == 409
    # The API, at the wall clock (minutes after the grace): 409 for attempt 1.
    assert report(victim, attempt=1).status_code == 409
    # The checkpoint in the grace did not touch the new attempt's `checkpointed_at`.
    victim.refresh_from_db()
    assert victim.checkpointed_at is None


def test_a_cancelled_attempt_reports_in_its_grace(world: World) -> None:
    job = running(world, timezone.now() - timedelta(minutes=5), termination_grace_seconds=120)
    assert world.client(world.member).post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 200
    ended = JobEvent.objects.get(job=job, to_status=JobState.CANCELLED)
    assert ended.data["grace_seconds"] == 120
    assert report(job, {"step": 9}).status_code == 201  # within its 120 s
    job.refresh_from_db()
    with pytest.raises(Exception) as refused:
        checkpoint_report(claim=checkpoint_claim(checkpoint_token(job_id=job.pk, attempt=1)),
                          job_id=job.pk, now=ended.at + timedelta(seconds=121))
    assert getattr(refused.value, "status_code", None) == 409


def test_reports_are_rate_limited_per_job(world: World, settings: Any) -> None:
    settings.FAIRQ_CHECKPOINT_RATE = "2/min"
    job = running(world, timezone.now() - timedelta(minutes=5))
    assert [report(job).status_code for _ in range(3)] == [201, 201, 429]


# --- accounting --------------------------------------------------------------------------

def test_lost_gpu_hours_count_from_the_later_of_the_start_and_the_checkpoint() -> None:
    t = timezone.now()
    assert lost_gpu_hours(gpus=8, started_at=t, stopped_at=t + timedelta(hours=1),
                          checkpoint_at=None) == pytest.approx(8.0)
    assert lost_gpu_hours(gpus=8, started_at=t, stopped_at=t + timedelta(hours=1),
                          checkpoint_at=t + timedelta(minutes=45)) == pytest.approx(2.0)
    assert lost_gpu_hours(gpus=8, started_at=t, stopped_at=t + timedelta(hours=1),
                          checkpoint_at=t + timedelta(hours=1, seconds=5)) == 0.0
    assert lost_gpu_hours(gpus=8, started_at=None, stopped_at=t, checkpoint_at=None) == 0.0


def test_a_preemption_loses_the_work_since_the_newest_checkpoint(world: World) -> None:
    t0 = timezone.now() - timedelta(hours=2)
    victim = running(world, t0, name="victim")
    claim = checkpoint_claim(checkpoint_token(job_id=victim.pk, attempt=1))
    checkpoint_report(claim=claim, job_id=victim.pk, step=100,
                      now=t0 + timedelta(minutes=30))
    submit(world, name="other", gpus=8, tier="low", env={"FAIRQ_SIM_SECONDS": "5000"})
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0)
    submit(world, world.outsider, team="nlp", tier="high", gpus=8)
    assert scheduler_cycle(now=t0 + timedelta(hours=1)).preempted == [victim.pk]
    record = UsageRecord.objects.get(job=victim, attempt=1)
    assert record.lost_gpu_hours == pytest.approx(8 * 0.5)  # 30 min since the checkpoint
    event = JobEvent.objects.get(job=victim, kind=JobEvent.Kind.PREEMPTED)
    assert event.data["lost_gpu_hours"] == pytest.approx(4.0)
    detail = world.client(world.member).get(f"/api/v1/jobs/{victim.pk}/").json()
    assert detail["lost_gpu_hours"] == pytest.approx(4.0)
    first = detail["attempts"][0]
    assert first["lost_note"] == "preempted, 4.00 GPU-h lost since the checkpoint 30 min before"


def test_a_checkpoint_seconds_before_shows_as_nothing_lost_to_speak_of(world: World) -> None:
    t0 = timezone.now() - timedelta(hours=2)
    stopped = t0 + timedelta(hours=1)
    victim = running(world, t0, name="victim")
    claim = checkpoint_claim(checkpoint_token(job_id=victim.pk, attempt=1))
    checkpoint_report(claim=claim, job_id=victim.pk, now=stopped - timedelta(seconds=4))
    submit(world, name="other", gpus=8, tier="low", env={"FAIRQ_SIM_SECONDS": "5000"})
    scheduler_cycle(now=t0)
    submit(world, world.outsider, team="nlp", tier="high", gpus=8)
    assert scheduler_cycle(now=stopped).preempted == [victim.pk]
    record = UsageRecord.objects.get(job=victim, attempt=1)
    assert record.lost_gpu_hours == pytest.approx(8 * 4 / 3600)


def test_a_checkpoint_in_the_grace_saves_all_the_work(world: World) -> None:
    t0 = timezone.now() - timedelta(hours=2)
    stopped = t0 + timedelta(hours=1)
    victim = fill_and_preempt(world, t0, stopped)
    record = UsageRecord.objects.get(job=victim, attempt=1)
    assert record.lost_gpu_hours == pytest.approx(8.0)  # no checkpoint: the whole hour
    claim = checkpoint_claim(checkpoint_token(job_id=victim.pk, attempt=1))
    checkpoint_report(claim=claim, job_id=victim.pk, step=5000,
                      now=stopped + timedelta(seconds=4))
    record.refresh_from_db()
    assert record.lost_gpu_hours == 0.0
    saved = JobEvent.objects.get(job=victim, kind=JobEvent.Kind.CHECKPOINT)
    assert saved.reason.startswith("checkpoint 4 s into the grace of preempted attempt 1")
    first = world.client(world.member).get(f"/api/v1/jobs/{victim.pk}/").json()["attempts"][0]
    assert first["lost_gpu_hours"] == 0.0
    assert first["lost_note"] == "preempted, nothing lost: checkpoint 4 s into its grace"


def test_the_resumed_attempts_admission_says_which_checkpoint_it_resumes_from(
        world: World) -> None:
    t0 = timezone.now() - timedelta(hours=2)
    stopped = t0 + timedelta(hours=1)
    victim = fill_and_preempt(world, t0, stopped)
    claim = checkpoint_claim(checkpoint_token(job_id=victim.pk, attempt=1))
    c = checkpoint_report(claim=claim, job_id=victim.pk, step=5000, path="/ckpt/5000.pt",
                          now=stopped + timedelta(seconds=4))
    # The preemptor ends: the victim is admitted again as attempt 2.
    Job.objects.filter(team=world.nlp).update(status=JobState.CANCELLED)
    get_backend().stop(Job.objects.get(team=world.nlp).backend_name, now=stopped)
    scheduler_cycle(now=stopped + timedelta(minutes=1))
    scheduler_cycle(now=stopped + timedelta(minutes=2))
    admitted = JobEvent.objects.filter(job=victim, to_status=JobState.ADMITTED, attempt=2).get()
    assert f"resumes from checkpoint {c.pk} (attempt 1" in admitted.reason
    assert admitted.data["resumes_from"]["step"] == 5000


# --- the snapshot ------------------------------------------------------------------------

def test_the_snapshot_has_the_checkpoint_and_grace_of_each_running_job(
        world: World, settings: Any) -> None:
    settings.FAIRQ_K8S_TERMINATION_GRACE_SECONDS = 30
    t0 = timezone.now() - timedelta(hours=1)
    job = running(world, t0, termination_grace_seconds=120)
    plain = running(world, t0, name="plain")
    claim = checkpoint_claim(checkpoint_token(job_id=job.pk, attempt=1))
    c = checkpoint_report(claim=claim, job_id=job.pk, now=t0 + timedelta(minutes=20))
    snap = build_snapshot(backend=get_backend(), now=t0 + timedelta(minutes=30))
    by_id = {r.id: r for r in snap.running}
    assert (by_id[job.pk].checkpointed_at, by_id[job.pk].grace_seconds) == (c.created_at, 120)
    assert (by_id[plain.pk].checkpointed_at, by_id[plain.pk].grace_seconds) == (None, 30)


def test_the_snapshot_takes_each_tiers_r9_ratio_and_owed_claims(world: World) -> None:
    world.high.preemption_lost_per_wait = 0.5
    world.high.owed_preempts_at_once = False
    world.high.save()
    world.low.preemption_lost_per_wait = -1
    world.low.save()
    snap = build_snapshot(backend=get_backend(), now=timezone.now())
    assert snap.preemption.lost_per_wait_by_tier == {200: 0.5, 0: None}
    assert snap.preemption.owed_waits_tiers == frozenset({200})
    world.high.preemption_lost_per_wait = None
    world.high.owed_preempts_at_once = True
    world.high.save()
    world.low.preemption_lost_per_wait = None
    world.low.save()
    snap = build_snapshot(backend=get_backend(), now=timezone.now())
    assert (snap.preemption.lost_per_wait_by_tier, snap.preemption.owed_waits_tiers) == (
        {}, frozenset())


def test_a_checkpoint_token_opens_no_other_endpoint(world: World) -> None:
    job = running(world, timezone.now() - timedelta(minutes=5))
    token = checkpoint_token(job_id=job.pk, attempt=1)
    for path in ("/api/v1/jobs/", f"/api/v1/jobs/{job.pk}/", "/api/v1/tiers/"):
        assert bearer(token).get(path).status_code == 401, path
    assert bearer(token).post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 401
    job.refresh_from_db()
    assert job.status == JobState.RUNNING


# --- tiers -------------------------------------------------------------------------------

def test_tiers_show_their_r9_ratio_and_owed_claims_and_refuse_a_negative_ratio(
        world: World) -> None:
    from django.core.exceptions import ValidationError

    world.high.preemption_lost_per_wait = 0.25
    world.high.owed_preempts_at_once = False
    world.high.save()
    tiers = {t["slug"]: t for t in world.client(world.member).get("/api/v1/tiers/").json()}
    assert (tiers["high"]["preemption_lost_per_wait"],
            tiers["high"]["owed_preempts_at_once"]) == (0.25, False)
    assert (tiers["low"]["preemption_lost_per_wait"],
            tiers["low"]["owed_preempts_at_once"]) == (None, True)
    world.low.preemption_lost_per_wait = -0.5
    with pytest.raises(ValidationError) as refused:
        world.low.full_clean()
    assert "preemption_lost_per_wait" in refused.value.message_dict
    world.low.preemption_lost_per_wait = -1  # off: no R9 check for the tier
    world.low.full_clean()
