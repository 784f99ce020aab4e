"""/metrics behind a bearer token in production, fair-share standings only of
the caller's own teams (docs/api.md, "Who sees which team"), `check --deploy` clean."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import Client, override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.services import token_issue
from fairq_cli.main import main
from tests.conftest import World
from tests.factories import JobFactory

ROOT = Path(__file__).resolve().parent.parent.parent

# --- /metrics ----------------------------------------------------------------------------


@override_settings(FAIRQ_METRICS_REQUIRE_TOKEN=True, FAIRQ_METRICS_TOKEN="")
def test_metrics_are_refused_when_a_token_is_required_but_unset(world: World) -> None:
    r = Client().get("/metrics")
    assert r.status_code == 403
    assert b"FAIRQ_METRICS_TOKEN" in r.content
    assert b"fairq_" not in r.content


@override_settings(FAIRQ_METRICS_REQUIRE_TOKEN=True, FAIRQ_METRICS_TOKEN="s3cret")
@pytest.mark.parametrize(("header", "status"), [("", 401), ("Bearer s3cre", 401),
                                                ("Token s3cret", 401), ("Bearer s3cret", 200)])
def test_metrics_want_the_bearer_token(world: World, header: str, status: int) -> None:
    r = Client().get("/metrics", HTTP_AUTHORIZATION=header)
    assert r.status_code == status
    if status == 401:
        assert r["WWW-Authenticate"] == 'Bearer realm="fairq-metrics"'


def test_production_settings_require_the_metrics_token() -> None:
    out = _prod_python("from django.conf import settings; "
                       "print(settings.FAIRQ_METRICS_REQUIRE_TOKEN)")
    assert out.strip() == "True"


# --- fair-share standings ---------------------------------------------------------------


def _teams(client: APIClient) -> list[str]:
    r = client.get("/api/v1/fairshare/")
    assert r.status_code == 200
    return sorted(t["team"] for t in r.json()["teams"])


def test_an_outsider_sees_only_their_own_teams_standing(world: World) -> None:
    assert _teams(world.client(world.outsider)) == ["nlp"]
    assert _teams(world.client(world.member)) == ["vision"]


def test_staff_see_every_teams_standing(world: World) -> None:
    assert _teams(world.client(world.staff)) == ["nlp", "speech", "vision"]


@override_settings(FAIRQ_FAIRSHARE_PUBLIC=True)
def test_standings_can_be_made_public_org_wide(world: World) -> None:
    assert _teams(world.client(world.outsider)) == ["nlp", "speech", "vision"]


def test_the_cli_share_shows_an_outsider_only_their_team(world: World, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from tests.cli.conftest import DjangoTransport

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    out, err = io.StringIO(), io.StringIO()
    code = main(["--url", "http://testserver", "--token", token_issue(user=world.outsider).key,
                 "share"], transport=DjangoTransport(), out=out, err=err, sleep=lambda s: None)
    assert code == 0, err.getvalue()
    assert [line.split()[0] for line in out.getvalue().splitlines()[1:]] == ["nlp"]


def test_the_dashboard_shows_an_outsider_only_their_teams(world: World) -> None:
    from queueing.models import FairShareSnapshot

    FairShareSnapshot.objects.create(at=timezone.now() - timedelta(hours=1), half_life_hours=168.0,
        standings={t: [1.5, 0.1, 0.3, 0.8] for t in ("vision", "nlp", "speech")})
    JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal, status="RUNNING")
    c = Client()
    c.force_login(world.outsider)
    for r in (c.get("/"), c.get("/", HTTP_HX_REQUEST="true")):
        html = r.content.decode()
        assert r.status_code == 200
        assert "Fair-share standings" in html and "nlp" in html
        assert "vision" not in html and "speech" not in html
    c.force_login(world.staff)
    html = c.get("/").content.decode()
    assert "vision" in html and "speech" in html


# --- manage.py check --deploy -------------------------------------------------------------

PROD_ENV = {
    "DJANGO_SETTINGS_MODULE": "config.settings.prod",
    "DJANGO_SECRET_KEY": "k3-" + "x7Qp9vLm2Rt8Zw4Yn6Bc1Df5Gh0Jk" * 2,
    "DJANGO_ALLOWED_HOSTS": "fairq.example.com",
    "DATABASE_URL": os.environ.get("DATABASE_URL", "postgres://fairq@localhost/fairq"),
    "REDIS_URL": os.environ.get("REDIS_URL", "redis://localhost:6379/0"),
    "FAIRQ_METRICS_TOKEN": "metrics-secret",
    "FAIRQ_PUBLIC_URL": "https://fairq.example.com",
    "FAIRQ_WEBHOOK_SECRET_KEYS": "ZGV2LW9ubHktbm90LXNlY3JldC0wMTIzNDU2Nzg5YWI=",
    "FAIRQ_REGISTRY_ALLOWLIST": "ghcr.io/acme",
}


def _prod_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DJANGO_", "FAIRQ_"))}
    env.update(PROD_ENV)
    env.update(extra)
    return env


def _prod_python(code: str, **extra: str) -> str:
    r = subprocess.run([sys.executable, "-c", f"import django; django.setup(); {code}"],
                       cwd=ROOT, env=_prod_env(**extra), capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _check_deploy(**extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "manage.py", "check", "--deploy",
                           "--fail-level", "WARNING"],
                          cwd=ROOT, env=_prod_env(**extra), capture_output=True, text=True,
                          timeout=120, check=False)


def test_check_deploy_is_clean_with_production_settings() -> None:
    r = _check_deploy()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no issues" in r.stdout, r.stdout + r.stderr


def test_check_deploy_warns_when_the_metrics_token_is_unset() -> None:
    r = _check_deploy(FAIRQ_METRICS_TOKEN="")
    assert r.returncode != 0
    assert "fairq.W001" in r.stderr


def test_check_deploy_warns_without_webhook_keys_or_public_url() -> None:
    r = _check_deploy(FAIRQ_WEBHOOK_SECRET_KEYS="", FAIRQ_PUBLIC_URL="")
    assert r.returncode != 0
    assert "fairq.W010" in r.stderr and "fairq.W011" in r.stderr


def test_check_deploy_warns_when_images_may_come_from_any_registry() -> None:
    r = _check_deploy(FAIRQ_REGISTRY_ALLOWLIST="")
    assert r.returncode != 0
    assert "fairq.W002" in r.stderr and "FAIRQ_REGISTRY_ALLOWLIST" in r.stderr


def test_production_settings_redirect_to_https_and_set_hsts() -> None:
    out = _prod_python(
        "from django.conf import settings as s; "
        "print(s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS, s.SESSION_COOKIE_SECURE, "
        "s.CSRF_COOKIE_SECURE, s.SECURE_PROXY_SSL_HEADER)")
    assert out.split() == ["True", "31536000", "True", "True", "None"]
    out = _prod_python("from django.conf import settings as s; print(s.SECURE_PROXY_SSL_HEADER)",
                       FAIRQ_TRUSTED_PROXY_COUNT="1")
    assert out.strip() == "('HTTP_X_FORWARDED_PROTO', 'https')"
