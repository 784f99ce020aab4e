"""JSON bodies say one thing: a number written as a string has the digits 0-9 (not
`"１０"`, not `"1_000"`), and no object has a key twice (queueing/api/strict.py,
queueing/api/parsers.py; docs/api.md, "What a request may hold"). Each is a 400 naming the field, on the
fast submit and through DRF alike, and nothing is written."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from accounts.models import Team
from queueing.models import Job
from tests.conftest import World, job_body
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

DUPLICATE_KEY = "Duplicate key in the JSON body."

INTEGER = "A valid integer is required. Write numbers with the digits 0-9 only " \
          "(no '_', no other scripts' digits)."
GPUS_SHAPE = ("A number of GPUs (2) or a fraction of one (0.5 or 1/4), written with the "
              "digits 0-9 only.")
NUMBER = "A valid number is required. Write numbers with the digits 0-9 only " \
         "(no '_', no other scripts' digits)."


def _post(c: APIClient, raw: str, *, drf: bool) -> Any:
    """A submit as the fast path takes it, or (an Idempotency-Key) as DRF alone does."""
    extra = {"HTTP_IDEMPOTENCY_KEY": "strict-json"} if drf else {}
    return c.post("/api/v1/jobs/", raw, content_type="application/json", **extra)


@pytest.mark.parametrize("drf", [False, True], ids=["fast", "drf"])
@pytest.mark.parametrize(("field", "value"), [
    ("gpus", "１"),                     # full-width digit one
    ("gpus", "١"),                      # Arabic-Indic digit one
    ("gpus", "1_0"),                    # Python's digit separator
    ("max_runtime_seconds", "3_600"),
    ("max_runtime_seconds", "３６００"),
    ("replicas", " １ "),
    ("gpus", "1e_1"),
])
def test_a_number_in_other_than_ascii_digits_is_refused_naming_the_field(
        world: World, field: str, value: str, drf: bool) -> None:
    r = _post(world.client(world.member), json.dumps(job_body(**{field: value})), drf=drf)
    assert r.status_code == 400, r.content
    # `gpus` also takes a fraction of a shared GPU (docs/api.md, "Fractions of a GPU").
    assert r.json()["error"]["fields"][field] == [GPUS_SHAPE if field == "gpus" else INTEGER]
    assert Job.objects.count() == 0


@pytest.mark.parametrize("drf", [False, True], ids=["fast", "drf"])
@pytest.mark.parametrize(("value", "gpus"), [
    (2, 2), ("2", 2), (" 2 ", 2), ("+2", 2), ("2.0", 2),  # as DRF always took them
])
def test_a_number_in_ascii_digits_is_taken_as_before(
        world: World, value: Any, gpus: int, drf: bool) -> None:
    r = _post(world.client(world.member), json.dumps(job_body(gpus=value)), drf=drf)
    assert r.status_code == 201, r.content
    assert r.json()["gpus"] == gpus


@pytest.mark.parametrize(("value", "status"), [
    ("１.５", 400), ("1_5", 400), ("٢", 400), ("1.5", 200), (1.5, 200), ("15e-1", 200),
])
def test_a_float_field_takes_only_ascii_digits_in_a_string(
        world: World, value: Any, status: int) -> None:
    r = world.client(world.staff).patch("/api/v1/teams/vision/", {"weight": value},
                                        format="json")
    assert r.status_code == status, r.content
    if status == 400:
        assert r.json()["error"]["fields"] == {"weight": [NUMBER]}
        assert Team.objects.get(slug="vision").weight == 3.0
    else:
        assert Team.objects.get(slug="vision").weight == 1.5


def _raw_job(**replace: str) -> str:
    """A job body as text, with `"key": value` pairs spliced in where `replace` says
    (a Python dict cannot hold a key twice)."""
    text = json.dumps(job_body())
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


@pytest.mark.parametrize("drf", [False, True], ids=["fast", "drf"])
@pytest.mark.parametrize(("replace", "named"), [
    ({'"gpus": 2': '"gpus": 2, "gpus": 8'}, "gpus"),
    ({'"gpus": 2': '"gpus": 8, "gpus": 2'}, "gpus"),              # the last one is as good
    ({'"team": "vision"': '"team": "vision", "team": "nlp"'}, "team"),
    ({'"env": {"SEED": "1"}': '"env": {"SEED": "1", "SEED": "2"}'}, "env.SEED"),
    ({'"tier": "normal"': '"tier": "normal", "tier": "normal"'}, "tier"),  # even the same
])
def test_a_key_twice_in_a_json_body_is_refused_naming_it(
        world: World, replace: dict[str, str], named: str, drf: bool) -> None:
    r = _post(world.client(world.member), _raw_job(**replace), drf=drf)
    assert r.status_code == 400, r.content
    error = r.json()["error"]
    assert error["code"] == "invalid"
    assert error["fields"] == {named: [DUPLICATE_KEY]}
    assert Job.objects.count() == 0


def test_a_key_twice_is_refused_on_every_endpoint_that_reads_json(world: World) -> None:
    r = world.client(world.staff).patch(
        "/api/v1/teams/vision/", '{"weight": 5.0, "weight": 1.0}',
        content_type="application/json")
    assert r.status_code == 400, r.content
    assert r.json()["error"]["fields"] == {"weight": [DUPLICATE_KEY]}
    assert Team.objects.get(slug="vision").weight == 3.0


@pytest.mark.parametrize(("text", "fields"), [
    ('{"a": 1, "a": 2}', {"a": [DUPLICATE_KEY]}),
    ('{"a": {"b": 1, "b": 1}}', {"a.b": [DUPLICATE_KEY]}),
    ('{"v": [{"x": 1}, {"x": 1, "y": 2, "x": 3}]}', {"v[1].x": [DUPLICATE_KEY]}),
    ('[{"k": 1, "k": 2}]', {"[0].k": [DUPLICATE_KEY]}),
    ('{"a": 1, "b": 2, "a": 3, "b": 4}', {"a": [DUPLICATE_KEY], "b": [DUPLICATE_KEY]}),
])
def test_loads_names_every_key_given_twice_where_it_is(
        text: str, fields: dict[str, list[str]]) -> None:
    from rest_framework.exceptions import ValidationError

    from queueing.api.parsers import loads

    with pytest.raises(ValidationError) as refused:
        loads(text)
    assert refused.value.detail == fields


def test_loads_reads_a_body_without_duplicates_as_json_does() -> None:
    from queueing.api.parsers import loads

    text = '{"a": {"b": [1, {"c": "１"}]}, "d": null}'
    assert loads(text) == json.loads(text)


@pytest.mark.parametrize("query", ["wait=１０", "wait=1_0", "wait=٥", "wait=5&since_event=０"])
def test_a_query_number_in_other_than_ascii_digits_is_a_400_naming_it(
        world: World, query: str) -> None:
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    r = world.client(world.admin).get(f"/api/v1/jobs/{job.pk}/?{query}")
    assert r.status_code == 400, r.content
    assert list(r.json()["error"]["fields"]) == [query.split("=")[-2].split("&")[-1]]


def test_an_array_filter_in_full_width_digits_is_a_400(world: World) -> None:
    r = world.client(world.admin).get("/api/v1/jobs/?array=１０")
    assert r.status_code == 400, r.content
    assert "array" in r.json()["error"]["fields"]
    assert world.client(world.admin).get("/api/v1/jobs/?array=10").status_code == 200


def test_a_job_id_in_full_width_digits_is_not_that_job(world: World) -> None:
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    wide = "".join(chr(ord("０") + int(d)) for d in str(job.pk))
    client = world.client(world.admin)
    assert client.get(f"/api/v1/jobs/{job.pk}/").status_code == 200
    assert client.get(f"/api/v1/jobs/{wide}/").status_code == 404


@pytest.mark.parametrize("value", [True, False])
def test_a_boolean_for_a_float_field_is_refused_naming_it(world: World, value: bool) -> None:
    # Python's float(True) is 1.0: without the check a team got weight 1 from `true`.
    r = world.client(world.staff).patch("/api/v1/teams/vision/", {"weight": value},
                                        format="json")
    assert r.status_code == 400, r.content
    assert r.json()["error"]["fields"] == {"weight": ["A number is required, not true or false."]}
    assert Team.objects.get(slug="vision").weight == 3.0


@pytest.mark.parametrize("drf", [False, True], ids=["fast", "drf"])
@pytest.mark.parametrize("field", ["gpus", "max_runtime_seconds", "replicas"])
def test_a_boolean_for_a_job_number_is_refused_naming_it(
        world: World, field: str, drf: bool) -> None:
    r = _post(world.client(world.member), json.dumps(job_body(**{field: True})), drf=drf)
    assert r.status_code == 400, r.content
    assert field in r.json()["error"]["fields"], r.json()
    assert Job.objects.count() == 0
