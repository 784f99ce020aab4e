"""Hostile input on the web pages: hostile form input answers 4xx (or the form with its
errors), never a 500."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from queueing.models import Job
from tests.conftest import World


def login(user: Any) -> Client:
    c = Client(raise_request_exception=False)
    c.force_login(user)
    return c


def form_body(**overrides: Any) -> dict[str, Any]:
    body = {"team": "vision", "name": "resnet-sweep-3", "image": "ghcr.io/acme/train:1.4",
            "command": "python train.py", "args": "--epochs 10", "env": "SEED=1",
            "gpu_type": "h100", "gpus": "2", "replicas": "1", "tier": "normal",
            "max_runtime_seconds": "3600"}
    body.update(overrides)
    return body


def test_a_nul_team_on_the_switch_is_a_400(world: World) -> None:
    r = login(world.member).post("/team/switch/", {"team": "\x00", "next": "/"})
    assert r.status_code == 400


@pytest.mark.parametrize("url", ["/teams/vision%00/", "/jobs/?status=%00", "/jobs/new/?from=%00"])
def test_nul_in_a_page_url_is_a_400(world: World, url: str) -> None:
    assert login(world.member).get(url).status_code == 400


@pytest.mark.parametrize("key", ["a\x00b", "k" * 201])
def test_a_bad_idempotency_key_on_the_submit_form_is_a_400(world: World, key: str) -> None:
    r = login(world.member).post("/jobs/new/", form_body(idempotency_key=key))
    assert r.status_code == 400
    assert Job.objects.count() == 0


def test_a_too_long_idempotency_key_is_shown_on_the_form(world: World) -> None:
    r = login(world.member).post("/jobs/new/", form_body(idempotency_key="k" * 201))
    assert b"200 characters" in r.content


def test_a_reused_idempotency_key_on_the_web_is_refused_not_a_500(world: World) -> None:
    c = login(world.member)
    assert c.post("/jobs/new/", form_body(idempotency_key="k1")).status_code == 302
    r = c.post("/jobs/new/", form_body(idempotency_key="k1", name="other"))
    assert r.status_code == 422
    assert b"was used for another job" in r.content
    assert Job.objects.count() == 1


def test_a_reused_idempotency_key_on_resubmit_is_refused_not_a_500(world: World) -> None:
    c = login(world.member)
    assert c.post("/jobs/new/", form_body(idempotency_key="k1")).status_code == 302
    other = c.post("/jobs/new/", form_body(idempotency_key="k2", name="other"))
    job = Job.objects.get(name="other")
    assert other.status_code == 302
    r = c.post(f"/jobs/{job.pk}/resubmit/", {"idempotency_key": "k1"}, follow=True)
    assert r.status_code == 200
    assert b"was used for another job" in r.content
    assert Job.objects.count() == 2
    r = c.post(f"/jobs/{job.pk}/resubmit/", {"idempotency_key": "k" * 201})
    assert r.status_code in {302, 400}
    assert Job.objects.count() == 2
