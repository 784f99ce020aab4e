"""Rule T1: a team submits jobs only of the tiers open to every team or
granted to it. Checked in the submit service, so the API, the web form, the array job,
the resubmit and the CLI (which is the API) all refuse, with a 400 on `tier`; staff set
it in the admin and through the API, audited."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from accounts.models import AuditEntry
from queueing.errors import DomainError
from queueing.models import Job, Tier, TierGrant
from queueing.services.jobs import JobInput, job_submit, jobs_submit_bulk
from tests.conftest import World, job_body
from tests.factories import JobFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def closed(world: World) -> Tier:
    """`critical` as a careful install has it: closed, granted to nlp only."""
    Tier.objects.filter(pk=world.critical.pk).update(open_to_all_teams=False)
    TierGrant.objects.create(tier=world.critical, team=world.nlp)
    world.critical.refresh_from_db()
    return world.critical


def tier_error(r: Any) -> str:
    assert r.status_code == 400, r.content
    return " ".join(r.json()["error"]["fields"]["tier"])


def test_T1_a_closed_tier_is_refused_to_a_team_it_is_not_granted_to(
        world: World, closed: Tier) -> None:
    r = world.client(world.member).post("/api/v1/jobs/", job_body(tier="critical"),
                                        format="json")
    assert "may not use tier critical" in tier_error(r)
    assert not Job.objects.exists()


def test_T1_a_granted_team_uses_the_closed_tier(world: World, closed: Tier) -> None:
    r = world.client(world.outsider).post("/api/v1/jobs/", job_body(team="nlp", tier="critical"),
                                          format="json")
    assert r.status_code == 201, r.content


def test_T1_an_open_tier_is_every_teams(world: World, closed: Tier) -> None:
    r = world.client(world.member).post("/api/v1/jobs/", job_body(tier="high"), format="json")
    assert r.status_code == 201, r.content


def test_T1_staff_are_held_to_the_teams_grants(world: World, closed: Tier) -> None:
    r = world.client(world.staff).post("/api/v1/jobs/", job_body(tier="critical"),
                                       format="json")
    assert "may not use tier critical" in tier_error(r)


def test_T1_an_array_job_is_refused_whole(world: World, closed: Tier) -> None:
    r = world.client(world.member).post("/api/v1/jobs/bulk/",
                                        {**job_body(tier="critical"), "count": 3},
                                        format="json")
    assert "may not use tier critical" in tier_error(r)
    assert not Job.objects.exists()


def test_T1_the_service_refuses_whoever_calls_it(world: World, closed: Tier) -> None:
    data = JobInput(team=world.vision, name="x", image="ghcr.io/acme/train:1", command=[],
                    args=[], env={}, gpu_type=world.h100, gpus_per_replica=1, replicas=1,
                    tier=closed, max_runtime_seconds=None)
    with pytest.raises(DomainError) as refused:
        job_submit(actor=world.member, data=data)
    assert list(refused.value.fields) == ["tier"]
    with pytest.raises(DomainError):
        jobs_submit_bulk(actor=world.member, data=data, count=2)
    assert not Job.objects.exists()


def test_T1_a_revoked_grant_holds_from_the_next_submit(world: World, closed: Tier) -> None:
    c = world.client(world.outsider)
    assert c.post("/api/v1/jobs/", job_body(team="nlp", tier="critical"),
                  format="json").status_code == 201
    TierGrant.objects.filter(tier=closed, team=world.nlp).delete()
    r = c.post("/api/v1/jobs/", job_body(team="nlp", tier="critical", name="again"),
               format="json")
    assert "may not use tier critical" in tier_error(r)


def test_T1_the_web_form_shows_the_refusal_on_the_tier(world: World, closed: Tier) -> None:
    from tests.web.test_pages import form_body

    c = Client()
    c.force_login(world.member)
    r = c.post("/jobs/new/", form_body(tier="critical", idempotency_key="k1"))
    assert r.status_code == 400
    assert r.context["form"].errors["tier"][0].startswith("Team vision may not use tier critical")
    assert not Job.objects.exists()


def test_T1_a_resubmit_is_refused_once_the_tier_is_closed(world: World) -> None:
    job = JobFactory(team=world.vision, tier=world.critical, gpu_type=world.h100,
                     submitter=world.member)
    Tier.objects.filter(pk=world.critical.pk).update(open_to_all_teams=False)
    c = Client()
    c.force_login(world.member)
    r = c.post(f"/jobs/{job.pk}/resubmit/", follow=True)
    assert "may not use tier critical" in r.content.decode()
    assert Job.objects.count() == 1


# --- who sets it: staff, audited ------------------------------------------------------------

def test_T1_staff_grant_and_open_tiers_through_the_team_api_audited(
        world: World, closed: Tier) -> None:
    c = world.client(world.staff)
    r = c.patch("/api/v1/teams/vision/", {"granted_tiers": ["critical"]}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["granted_tiers"] == ["critical"]
    assert TierGrant.objects.filter(tier=closed, team=world.vision).exists()
    audit = AuditEntry.objects.get(object_type="queueing.TierGrant", action="create")
    assert audit.actor == world.staff and audit.object_repr == "critical for vision"
    r = c.patch("/api/v1/teams/vision/", {"granted_tiers": []}, format="json")
    assert r.status_code == 200 and r.json()["granted_tiers"] == []
    assert AuditEntry.objects.filter(object_type="queueing.TierGrant", action="delete").count() == 1
    r = c.patch("/api/v1/teams/vision/", {"granted_tiers": ["nope"]}, format="json")
    assert r.status_code == 400 and "granted_tiers" in r.json()["error"]["fields"]
    # A member sees the team's grants and which tiers are open; may not change them.
    m = world.client(world.member)
    assert m.get("/api/v1/teams/vision/").json()["granted_tiers"] == []
    tiers = {t["slug"]: t["open_to_all_teams"] for t in m.get("/api/v1/tiers/").json()}
    assert tiers == {"critical": False, "high": True, "normal": True, "low": True}
    assert m.patch("/api/v1/teams/vision/", {"granted_tiers": ["critical"]},
                   format="json").status_code == 403


def test_T1_staff_grant_tiers_in_the_admin_audited(world: World, closed: Tier) -> None:
    su = UserFactory(username="su", is_staff=True, is_superuser=True)
    c = Client()
    c.force_login(su)
    url = f"/admin/queueing/tier/{closed.pk}/change/"
    page = c.get(url)
    assert page.status_code == 200
    form = page.context["adminform"].form
    data: dict[str, Any] = {form.add_prefix(n): "" if form[n].value() is None else form[n].value()
                            for n in form.fields}
    data["open_to_all_teams"] = ""  # unchecked
    [inline] = page.context["inline_admin_formsets"]
    fs = inline.formset
    data.update({fs.management_form.add_prefix(n): fs.management_form[n].value()
                 for n in fs.management_form.fields})
    for i, f in enumerate(fs.forms):
        data.update({f.add_prefix(n): f[n].value() for n in ("id", "tier", "team")
                     if n in f.fields})
        assert i == 0
    data[f"{fs.prefix}-TOTAL_FORMS"] = len(fs.forms) + 1
    data[f"{fs.prefix}-{len(fs.forms)}-team"] = world.speech.pk
    r = c.post(url, data)
    assert r.status_code == 302, r.context["adminform"].form.errors if r.context else r
    assert set(TierGrant.objects.filter(tier=closed).values_list("team__slug", flat=True)) == \
        {"nlp", "speech"}
    audit = AuditEntry.objects.get(object_type="queueing.TierGrant", action="create")
    assert audit.actor == su and audit.object_repr == "critical for speech"


# --- the demo still works --------------------------------------------------------------------

def test_T1_the_demo_closes_critical_and_its_teams_still_submit() -> None:
    import random

    from queueing.services.demo import demo_seed, demo_submit_synthetic

    demo_seed()
    demo_seed()  # twice: nothing changes
    tiers = dict(Tier.objects.values_list("slug", "open_to_all_teams"))
    assert tiers == {"critical": False, "high": True, "normal": True, "low": True}
    assert list(TierGrant.objects.values_list("team__slug", flat=True)) == ["nlp"]
    assert demo_submit_synthetic(rng=random.Random(1)) == 16
    assert json.dumps(sorted(set(Job.objects.values_list("tier__slug", flat=True)))) != "[]"


# --- the migration ---------------------------------------------------------------------------

BEFORE = [("queueing", "0005_tier_priority_class_name_dns1123"), ("accounts", "0003_auditentry_ip")]


@pytest.mark.django_db(transaction=True)
def test_T1_the_migration_keeps_preemptible_tiers_open_and_grants_critical_to_its_users() -> None:
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor
    from django.utils import timezone

    from accounts.models import Team

    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    try:
        apps = executor.loader.project_state(BEFORE).apps
        old_team = apps.get_model("accounts", "Team")
        user_team = old_team.objects.create(slug="uses-critical", name="U")
        old_team.objects.create(slug="never-critical", name="N")
        gpu = apps.get_model("queueing", "GpuType").objects.create(slug="h100", name="H100")
        old_tier = apps.get_model("queueing", "Tier")
        critical = old_tier.objects.create(slug="critical", name="C", rank=300,
                                           priority_class_name="c", priority_value=3,
                                           preemptible=False)
        old_tier.objects.create(slug="high", name="H", rank=200, priority_class_name="h",
                                priority_value=2, preemptible=True)
        for name in ("a", "b"):
            apps.get_model("queueing", "Job").objects.create(
                team=user_team, name=name, image="x", gpu_type=gpu, gpus_per_replica=1,
                tier=critical, created_at=timezone.now())
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert dict(Tier.objects.values_list("slug", "open_to_all_teams")) == \
        {"critical": False, "high": True}
    assert list(TierGrant.objects.values_list("tier__slug", "team__slug")) == \
        [("critical", "uses-critical")]
    # Existing teams keep running as they did; a new team runs non-root.
    assert set(Team.objects.values_list("run_as_non_root", flat=True)) == {False}
    assert Team.objects.create(slug="new", name="New").run_as_non_root is True


def test_T1_the_live_form_check_shows_the_refusal_before_submitting(
        world: World, closed: Tier) -> None:
    from tests.web.test_pages import form_body

    c = Client()
    c.force_login(world.member)
    r = c.post("/jobs/new/check/", form_body(tier="critical"))
    assert r.status_code == 200
    assert "may not use tier critical" in r.content.decode()
    assert "may not use tier" not in c.post("/jobs/new/check/",
                                            form_body(tier="high")).content.decode()
