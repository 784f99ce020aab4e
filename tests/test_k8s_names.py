"""Sealed Jobs without a cluster: the owner seal fairq puts on its Jobs and what
it adopts, and the names Kubernetes would refuse, refused by the models and reported by
`manage.py check --database default`."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from django.core.exceptions import ValidationError

from queueing.backends.k8s_manifest import (
    A_OWNER,
    A_SPEC_DIGEST,
    ManifestOptions,
    adoption_verdict,
    job_manifest,
    namespace_for,
    sealed_by_fairq,
    sign_job,
    spec_digest,
)

from .test_k8s_manifest import spec

KEY = b"k" * 32
OPTS = ManifestOptions(namespace="fairq-vision")


def signed(**overrides: Any) -> dict[str, Any]:
    return sign_job(job_manifest(spec(**overrides), OPTS), KEY)


def as_stored(body: dict[str, Any]) -> dict[str, Any]:
    """What the API server gives back: fairq's body plus what it adds."""
    stored = copy.deepcopy(body)
    stored["metadata"].update(uid="u-1", resourceVersion="7",
                              creationTimestamp="2026-01-01T00:00:00Z")
    stored["spec"]["selector"] = {"matchLabels": {"controller-uid": "u-1"}}
    return stored


def test_the_seal_is_deterministic_and_covers_the_whole_spec() -> None:
    a, b = signed(), signed()
    assert a == b and a["metadata"]["annotations"][A_SPEC_DIGEST] == spec_digest(a)
    assert signed(gpus_per_replica=8)["metadata"]["annotations"][A_SPEC_DIGEST] != \
        a["metadata"]["annotations"][A_SPEC_DIGEST]
    assert signed(image="evil.example/x:1")["metadata"]["annotations"][A_OWNER] != \
        a["metadata"]["annotations"][A_OWNER]


def test_fairqs_own_job_is_adopted() -> None:
    body = signed()
    assert adoption_verdict(as_stored(body), body, key=KEY) == ("adopt", "")
    # The same test decides which Jobs the backend reports as fairq's workloads.
    assert sealed_by_fairq(as_stored(body), KEY)


def test_fairqs_job_from_an_earlier_spec_of_the_attempt_is_adopted_with_a_note() -> None:
    earlier = signed(priority_class_name="fairq-old")
    verdict, note = adoption_verdict(as_stored(earlier), signed(), key=KEY)
    assert verdict == "adopt" and "earlier spec" in note


@pytest.mark.parametrize("tamper", ["no annotations", "copied digest, forged spec",
                                    "other key", "other name"])
def test_a_job_fairq_did_not_create_is_refused(tamper: str) -> None:
    body = signed()
    other = as_stored(signed(gpus_per_replica=8, image="evil.example/miner:1"))
    ann = other["metadata"]["annotations"]
    if tamper == "no annotations":
        del ann[A_OWNER], ann[A_SPEC_DIGEST]
    elif tamper == "copied digest, forged spec":
        ann[A_SPEC_DIGEST] = body["metadata"]["annotations"][A_SPEC_DIGEST]
    elif tamper == "other key":
        other = as_stored(sign_job(job_manifest(spec(), OPTS), b"someone else's key"))
    else:  # the seal of another attempt, copied onto this name
        other = as_stored(signed(name="fq-12-2", attempt=2))
        other["metadata"]["name"] = "fq-12-1"
    verdict, why = adoption_verdict(other, body, key=KEY)
    assert verdict == "refuse" and "fairq did not create it" in why
    assert not sealed_by_fairq(other, KEY)  # not reported, charged or stopped either


def test_a_job_being_deleted_is_never_adopted_even_fairqs_own() -> None:
    body = signed()
    going = as_stored(body)
    going["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    verdict, why = adoption_verdict(going, body, key=KEY)
    assert verdict == "requeue" and "being deleted" in why


# --- names ------------------------------------------------------------------------------

@pytest.mark.django_db
@pytest.mark.parametrize("name", ["Fairq_Bad", "fairq bad", "-fairq", "fairq-", "fairq..x",
                                  "system-fairq", "FAIRQ"])
def test_a_tier_refuses_a_priority_class_name_kubernetes_would_refuse(
    world: Any, name: str,
) -> None:
    world.low.priority_class_name = name
    with pytest.raises(ValidationError) as err:
        world.low.full_clean()
    assert "priority_class_name" in err.value.message_dict


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["fairq-low", "fairq.low", "a", "fairq-low-2"])
def test_a_tier_takes_a_dns_1123_priority_class_name(world: Any, name: str) -> None:
    world.low.priority_class_name = name
    world.low.full_clean()


@pytest.mark.django_db
def test_every_valid_team_slug_makes_a_valid_namespace_with_the_longest_prefix(
    world: Any,
) -> None:
    world.vision.slug = "a" * 40
    world.vision.full_clean()  # the longest slug the model takes...
    assert namespace_for(world.vision.slug, "p" * 21 + "-")  # ...fits the longest prefix
    world.vision.slug = "Bad_Team"
    with pytest.raises(ValidationError):
        world.vision.full_clean()


@pytest.mark.django_db
def test_the_database_check_reports_rows_with_names_kubernetes_would_refuse(world: Any) -> None:
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    from accounts.models import Team
    from queueing.models import Tier

    call_command("check", databases=["default"])  # a clean world passes
    Tier.objects.filter(pk=world.low.pk).update(priority_class_name="Fairq_Bad")
    Team.objects.filter(pk=world.nlp.pk).update(slug="NLP_team")
    with pytest.raises(SystemCheckError) as err:
        call_command("check", databases=["default"])
    text = str(err.value)
    assert "fairq.E101" in text and "Fairq_Bad" in text
    assert "fairq.E102" in text and "NLP_team" in text
