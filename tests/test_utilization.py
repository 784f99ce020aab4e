"""GPU utilization and idle GPUs (docs/scheduling.md, "Idle GPUs", rules U1-U5) through
the scheduler cycle on the simulated cluster, whose jobs report FAIRQ_SIM_GPU_UTIL."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from queueing.composition import get_backend
from queueing.models import (
    AttemptUtilization,
    Job,
    JobEvent,
    Tier,
    UsageRecord,
    UtilizationSample,
)
from queueing.services.scheduler import scheduler_cycle
from queueing.services.utilization import utilization_ingest, utilization_purge

from .conftest import World, job_body

pytestmark = pytest.mark.django_db


def submit(world: World, **overrides: Any) -> int:
    r = world.client(world.member).post("/api/v1/jobs/", job_body(**overrides), format="json")
    assert r.status_code == 201, r.json()
    return int(r.json()["id"])


def minutes(t0: datetime, n: int, start: int = 0) -> None:
    """One cycle a minute (and a second into it), minutes start..start+n-1 after t0."""
    for i in range(start, start + n):
        scheduler_cycle(now=t0 + timedelta(minutes=i, seconds=1))


def idle_events(job_id: int) -> list[str]:
    return [e.data.get("rule") for e in JobEvent.objects.filter(job_id=job_id,
                                                                kind=JobEvent.Kind.IDLE)]


def set_rule(tier: Tier, *, threshold: float = 5, window: int = 10, action: str = "flag",
             grace: int = 5) -> None:
    Tier.objects.filter(pk=tier.pk).update(idle_threshold_percent=threshold,
                                           idle_window_minutes=window, idle_action=action,
                                           idle_grace_minutes=grace)


@pytest.fixture
def t0() -> datetime:
    return timezone.now().replace(second=0, microsecond=0) - timedelta(hours=2)


def test_rule_U3_an_idle_low_job_is_requeued_the_busy_one_untouched(world: World,
                                                                      t0: datetime) -> None:
    set_rule(world.low, action="requeue", window=10, grace=5)
    idle = submit(world, tier="low", env={"FAIRQ_SIM_SECONDS": "7200",
                                           "FAIRQ_SIM_GPU_UTIL": "90,2"})
    busy = submit(world, tier="low", env={"FAIRQ_SIM_SECONDS": "7200",
                                           "FAIRQ_SIM_GPU_UTIL": "95"})
    scheduler_cycle(now=t0 - timedelta(seconds=30))  # admitted, started on the simulated cluster
    minutes(t0, 11)  # minute 0: 90%; minutes 1..10: 2%: the run below is 9 minutes long
    assert idle_events(idle) == []
    minutes(t0, 1, start=11)  # 10 minutes below: flagged (rule U2)
    assert idle_events(idle) == ["U2"]
    flagged = AttemptUtilization.objects.get(job_id=idle, attempt=1)
    assert flagged.idle_since == t0 + timedelta(minutes=11)
    assert flagged.below_since == t0 + timedelta(minutes=1)
    assert Job.objects.get(pk=idle).status == "RUNNING"
    held = sum(n.allocated for n in get_backend().nodes())
    minutes(t0, 5, start=12)  # 5 minutes of grace: reclaimed at minute 16 (rule U3)
    job = Job.objects.get(pk=idle)
    assert idle_events(idle) == ["U2", "U3"]
    assert (job.attempt, job.status) in {(2, "QUEUED"), (2, "ADMITTED"), (2, "RUNNING")}
    transitions = list(JobEvent.objects.filter(job_id=idle, kind=JobEvent.Kind.TRANSITION,
                                               attempt=1).values_list("to_status", flat=True))
    assert transitions[-2:] == ["PREEMPTED", "QUEUED"]
    assert UsageRecord.objects.get(job_id=idle, attempt=1).end == t0 + timedelta(
        minutes=16, seconds=1)
    later = t0 + timedelta(minutes=16, seconds=2)
    assert f"fq-{idle}-1" not in {s.name for s in get_backend().statuses(now=later)}
    # Its attempt's GPUs came back: the cluster holds only what live attempts hold.
    assert sum(n.allocated for n in get_backend().nodes()) == sum(
        j.total_gpus for j in Job.objects.filter(status__in=["ADMITTED", "RUNNING"])) <= held
    # The busy job: sampled every minute, never flagged.
    busy_row = AttemptUtilization.objects.get(job_id=busy, attempt=1)
    assert busy_row.samples == 17 and busy_row.idle_since is None
    assert busy_row.sm_mean == pytest.approx(95.0) and busy_row.sm_p95 == 95.0
    assert idle_events(busy) == []
    assert Job.objects.get(pk=busy).status == "RUNNING"


def test_rule_U3_fail_action_fails_with_reason_idle(world: World, t0: datetime) -> None:
    set_rule(world.normal, action="fail", window=3, grace=2)
    job_id = submit(world, env={"FAIRQ_SIM_SECONDS": "7200", "FAIRQ_SIM_GPU_UTIL": "0"})
    scheduler_cycle(now=t0 - timedelta(seconds=30))  # admitted and started
    minutes(t0, 6)
    job = Job.objects.get(pk=job_id)
    assert job.status == "FAILED" and job.message == "idle" and job.attempt == 1
    assert idle_events(job_id) == ["U2", "U3"]
    assert UsageRecord.objects.filter(job_id=job_id, attempt=1).exists()
    assert not [s for s in get_backend().statuses(now=t0) if s.job_id == job_id]


def test_rule_U2_a_flag_only_tier_keeps_the_job_running_and_the_api_shows_it(
        world: World, t0: datetime) -> None:
    set_rule(world.normal, action="flag", window=3, grace=0)
    job_id = submit(world, env={"FAIRQ_SIM_SECONDS": "7200", "FAIRQ_SIM_GPU_UTIL": "50,1"})
    scheduler_cycle(now=t0 - timedelta(seconds=30))  # admitted and started
    minutes(t0, 12)
    assert Job.objects.get(pk=job_id).status == "RUNNING"
    assert idle_events(job_id) == ["U2"]
    body = world.client(world.member).get(f"/api/v1/jobs/{job_id}/").json()
    assert body["idle_since"] is not None
    [attempt] = body["utilization"]
    assert attempt["attempt"] == 1 and attempt["samples"] == 12
    assert attempt["sm_mean"] == pytest.approx((50 + 11 * 1) / 12, abs=0.01)
    assert attempt["sm_p95"] == 50.0
    assert attempt["mem_max_bytes"] == 2 * int((2 + 0.4 * 50) * 2**30)
    assert [p["sm"] for p in attempt["series"]] == [50.0] + [1.0] * 11


def test_rule_U4_busy_again_clears_the_flag(world: World, t0: datetime) -> None:
    set_rule(world.normal, action="requeue", window=2, grace=3)
    job_id = submit(world, env={"FAIRQ_SIM_SECONDS": "7200",
                                "FAIRQ_SIM_GPU_UTIL": "1,1,1,1,80"})
    scheduler_cycle(now=t0 - timedelta(seconds=30))  # admitted and started
    minutes(t0, 8)
    assert idle_events(job_id) == ["U2", "U4"]
    assert Job.objects.get(pk=job_id).status == "RUNNING"
    assert AttemptUtilization.objects.get(job_id=job_id).idle_since is None


def test_rule_U1_a_job_without_readings_is_never_idle(world: World, t0: datetime) -> None:
    set_rule(world.normal, action="fail", window=1, grace=0)
    job_id = submit(world, env={"FAIRQ_SIM_SECONDS": "7200"})
    scheduler_cycle(now=t0 - timedelta(seconds=30))  # admitted and started
    minutes(t0, 5)
    assert Job.objects.get(pk=job_id).status == "RUNNING"
    assert not AttemptUtilization.objects.filter(job_id=job_id).exists()
    body = world.client(world.member).get(f"/api/v1/jobs/{job_id}/").json()
    assert body["utilization"] == [] and body["idle_since"] is None


def test_rule_U5_one_sample_a_minute_whatever_the_cycles(world: World, t0: datetime) -> None:
    job_id = submit(world, env={"FAIRQ_SIM_SECONDS": "7200", "FAIRQ_SIM_GPU_UTIL": "40"})
    scheduler_cycle(now=t0 - timedelta(seconds=30))  # admitted and started
    for second in range(1, 120, 3):  # 40 cycles over minutes 0 and 1
        scheduler_cycle(now=t0 + timedelta(seconds=second))
    assert UtilizationSample.objects.filter(job_id=job_id).count() == 2  # minutes 0 and 1
    assert AttemptUtilization.objects.get(job_id=job_id).samples == 2


def test_readings_of_jobs_not_running_in_that_attempt_are_ignored(world: World,
                                                                    t0: datetime) -> None:
    from queueing.backends.base import PodReading

    job_id = submit(world)
    result = utilization_ingest(readings=[PodReading(job_id, 1, "fq-x-1-abcde", 0.0, 0),
                                          PodReading(10**9, 1, "fq-y-1-abcde", 0.0, 0)],
                                now=t0)
    assert result.sampled == 0 and not AttemptUtilization.objects.exists()
    assert Job.objects.get(pk=job_id).status == "QUEUED"


def test_samples_are_purged_after_the_retention_summaries_kept(world: World,
                                                               t0: datetime) -> None:
    job_id = submit(world, env={"FAIRQ_SIM_SECONDS": "7200", "FAIRQ_SIM_GPU_UTIL": "40"})
    scheduler_cycle(now=t0 - timedelta(seconds=30))  # admitted and started
    minutes(t0, 3)
    assert utilization_purge(now=t0 + timedelta(days=1, minutes=1, seconds=30), days=1) == 2
    assert UtilizationSample.objects.filter(job_id=job_id).count() == 1
    assert AttemptUtilization.objects.get(job_id=job_id).samples == 3


@pytest.mark.parametrize("value", ["", "abc", "101", "-1", "5,,5", "nan", ",".join(["5"] * 61)])
def test_a_bad_sim_gpu_util_is_a_400_on_env(world: World, value: str) -> None:
    r = world.client(world.member).post(
        "/api/v1/jobs/", job_body(env={"FAIRQ_SIM_GPU_UTIL": value}), format="json")
    assert r.status_code == 400, r.json()
    assert "FAIRQ_SIM_GPU_UTIL" in str(r.json()["error"]["fields"]["env"]), r.json()
    assert not Job.objects.exists()


def test_metrics_per_team_allocated_idle_utilization_and_queue_waits(world: World,
                                                                     t0: datetime) -> None:
    from django.test import Client

    from queueing.services.metrics import record_cycle
    from queueing.services.scheduler import CycleResult

    set_rule(world.normal, action="flag", window=2)
    idle = submit(world, env={"FAIRQ_SIM_SECONDS": "7200", "FAIRQ_SIM_GPU_UTIL": "1"})
    busy = submit(world, env={"FAIRQ_SIM_SECONDS": "7200", "FAIRQ_SIM_GPU_UTIL": "81"},
                  gpus=4)
    Job.objects.filter(pk__in=[idle, busy]).update(created_at=t0 - timedelta(minutes=2))
    JobEvent.objects.filter(job_id__in=[idle, busy]).update(at=t0 - timedelta(minutes=2))
    first: CycleResult = scheduler_cycle(now=t0 - timedelta(seconds=30))
    record_cycle(first)  # what the task does after each cycle
    minutes(t0, 3)
    text = Client().get("/metrics").content.decode()
    assert 'fairq_team_gpus_allocated{team="vision"} 6.0' in text
    assert 'fairq_team_gpus_idle{team="vision"} 2.0' in text
    assert 'fairq_team_gpus_measured{team="vision"} 6.0' in text
    assert 'fairq_team_gpu_utilization_ratio{team="vision"} 0.543333' in text  # (2*1+4*81)/6
    # Both waited 90 s (submitted 2 minutes before t0, admitted 30 s before it).
    assert 'fairq_queue_wait_seconds_bucket{le="60.0",tier="normal"} 0.0' in text
    assert 'fairq_queue_wait_seconds_bucket{le="120.0",tier="normal"} 2.0' in text
    assert 'fairq_queue_wait_seconds_sum{tier="normal"} 180.0' in text


def test_the_demo_tiers_and_load_show_idle_gpus(db: None) -> None:
    import random

    from queueing.services.demo import demo_seed, demo_submit_synthetic
    from queueing.validation import sim_gpu_util

    demo_seed()
    rules = {t.slug: (t.idle_threshold_percent, t.idle_window_minutes, t.idle_action)
             for t in Tier.objects.all()}
    assert rules["low"] == (5.0, 10, "requeue")
    assert {rules[t][2] for t in ("normal", "high", "critical")} == {"flag"}
    demo_submit_synthetic(rng=random.Random(3), per_team_queue=30)
    profiles = [sim_gpu_util(j.env["FAIRQ_SIM_GPU_UTIL"]) for j in Job.objects.all()
                if "FAIRQ_SIM_GPU_UTIL" in j.env]
    assert any(p[-1] < 5 for p in profiles) and any(p[-1] > 50 for p in profiles)
    assert Job.objects.exclude(env__has_key="FAIRQ_SIM_GPU_UTIL").exists()


def test_the_pages_show_the_idle_badge_and_the_utilization_card(world: World,
                                                                t0: datetime) -> None:
    from django.test import Client

    set_rule(world.normal, action="flag", window=2)
    idle = submit(world, env={"FAIRQ_SIM_SECONDS": "7200", "FAIRQ_SIM_GPU_UTIL": "1"})
    busy = submit(world, env={"FAIRQ_SIM_SECONDS": "7200", "FAIRQ_SIM_GPU_UTIL": "77"})
    scheduler_cycle(now=t0 - timedelta(seconds=30))
    minutes(t0, 3)
    c = Client()
    c.force_login(world.member)
    home = c.get("/").content.decode()
    rows = {job_id: next(line for line in home.splitlines() if f"#{job_id} " in line)
            for job_id in (idle, busy)}
    assert 'class="st st-idle"' in rows[idle] and "st-idle" not in rows[busy]
    page = c.get(f"/jobs/{idle}/").content.decode()
    assert 'id="job-idle"' in page and 'id="util-table"' in page
    assert 'id="util-series"' in page and "uPlot.iife.min.js" in page
    busy_page = c.get(f"/jobs/{busy}/").content.decode()
    assert 'id="job-idle"' not in busy_page and ">77%<" in busy_page


def test_the_etag_changes_with_a_new_minute_of_readings(world: World, t0: datetime) -> None:
    job_id = submit(world, env={"FAIRQ_SIM_SECONDS": "7200", "FAIRQ_SIM_GPU_UTIL": "60"})
    scheduler_cycle(now=t0 - timedelta(seconds=30))
    minutes(t0, 1)
    client = world.client(world.member)
    etag = client.get(f"/api/v1/jobs/{job_id}/")["ETag"]
    assert client.get(f"/api/v1/jobs/{job_id}/", HTTP_IF_NONE_MATCH=etag).status_code == 304
    minutes(t0, 1, start=1)  # a new sample; the job's row is unchanged
    r = client.get(f"/api/v1/jobs/{job_id}/", HTTP_IF_NONE_MATCH=etag)
    assert r.status_code == 200 and r.json()["utilization"][0]["samples"] == 2


def test_tiers_show_their_idle_rule_and_refuse_bad_ones(world: World) -> None:
    from django.core.exceptions import ValidationError

    set_rule(world.low, action="requeue", window=10, grace=5)
    tiers = {t["slug"]: t for t in world.client(world.member).get("/api/v1/tiers/").json()}
    assert (tiers["low"]["idle_threshold_percent"], tiers["low"]["idle_window_minutes"],
            tiers["low"]["idle_action"], tiers["low"]["idle_grace_minutes"]) == (
        5.0, 10, "requeue", 5)
    assert tiers["normal"]["idle_action"] == "flag"  # the default
    tier = Tier.objects.get(pk=world.low.pk)
    for field, value in (("idle_threshold_percent", 101.0), ("idle_threshold_percent", -1.0),
                         ("idle_window_minutes", 0), ("idle_action", "kill")):
        setattr(tier, field, value)
        with pytest.raises(ValidationError) as err:
            tier.full_clean()
        assert field in err.value.message_dict
        tier.refresh_from_db()


def test_a_reclaim_that_raises_fails_alone_and_is_retried(world: World, t0: datetime,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from queueing.services import utilization

    set_rule(world.normal, action="fail", window=2, grace=1)
    a = submit(world, env={"FAIRQ_SIM_SECONDS": "7200", "FAIRQ_SIM_GPU_UTIL": "0"})
    b = submit(world, env={"FAIRQ_SIM_SECONDS": "7200", "FAIRQ_SIM_GPU_UTIL": "0"})
    real = utilization._reclaim

    def flaky(job: Job, **kwargs: Any) -> bool:
        if job.pk == a:
            raise ValueError("boom")
        return real(job, **kwargs)

    monkeypatch.setattr(utilization, "_reclaim", flaky)
    scheduler_cycle(now=t0 - timedelta(seconds=30))
    minutes(t0, 4)  # flagged at minute 2, reclaimed at minute 3
    assert Job.objects.get(pk=b).status == "FAILED"
    assert Job.objects.get(pk=a).status == "RUNNING"
    assert idle_events(a) == ["U2"]  # no "reclaimed" event for a reclaim that failed
    assert AttemptUtilization.objects.get(job_id=a).samples == 4  # the samples were kept
    monkeypatch.setattr(utilization, "_reclaim", real)
    minutes(t0, 1, start=4)  # the next minute tries again
    assert Job.objects.get(pk=a).status == "FAILED" and idle_events(a) == ["U2", "U3"]


def test_rules_U2_U3_the_submitter_is_told_by_email(world: World, t0: datetime,
                                                     settings: Any) -> None:
    """The submitter hears of the flag (what the tier will do, and when) and of the
    reclaim, once each, with a link to the job; a submitter without an address hears
    nothing, and FAIRQ_NOTICE_EMAILS off sends nothing."""
    from django.core import mail

    settings.FAIRQ_PUBLIC_URL = "https://fairq.example.com"
    world.member.email = "dave@example.com"
    world.member.save()
    set_rule(world.normal, action="fail", window=3, grace=2)
    job_id = submit(world, env={"FAIRQ_SIM_SECONDS": "7200", "FAIRQ_SIM_GPU_UTIL": "0"})
    scheduler_cycle(now=t0 - timedelta(seconds=30))
    minutes(t0, 4)  # flagged at minute 3 (rule U2)
    [flag] = mail.outbox
    assert flag.to == ["dave@example.com"]
    assert flag.subject == f"fairq: job {job_id} (resnet-sweep-3) holds idle GPUs"
    assert "below 5% SM activity for 3 minute(s) (rule U2, tier normal)" in flag.body
    assert "fairq stops it if they are still idle 2 minute(s) from now" in flag.body
    assert f"https://fairq.example.com/jobs/{job_id}/" in flag.body
    minutes(t0, 2, start=4)  # reclaimed at minute 5 (rule U3)
    assert [m.subject for m in mail.outbox[1:]] == [
        f"fairq: job {job_id} (resnet-sweep-3) was failed: idle GPUs"]
    assert "stopped and failed with reason 'idle' (rule U3, tier normal)" in mail.outbox[1].body

    mail.outbox.clear()
    settings.FAIRQ_NOTICE_EMAILS = False
    quiet = submit(world, env={"FAIRQ_SIM_SECONDS": "7200", "FAIRQ_SIM_GPU_UTIL": "0"})
    scheduler_cycle(now=t0 + timedelta(minutes=6))
    minutes(t0, 6, start=7)
    assert idle_events(quiet) == ["U2", "U3"] and mail.outbox == []
    settings.FAIRQ_NOTICE_EMAILS = True
    world.member.email = ""
    world.member.save()
    silent = submit(world, env={"FAIRQ_SIM_SECONDS": "7200", "FAIRQ_SIM_GPU_UTIL": "0"})
    scheduler_cycle(now=t0 + timedelta(minutes=13))
    minutes(t0, 6, start=14)
    assert idle_events(silent) == ["U2", "U3"] and mail.outbox == []
