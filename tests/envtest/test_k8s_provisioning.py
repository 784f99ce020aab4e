"""FAIRQ_K8S_PROVISION=separate (the default): the scheduler does not create team
namespaces. A team nobody provisioned yet has its jobs wait, with the reason, holding no
GPUs and creating nothing in the cluster; once `sync_cluster` (the provisioner) ran, they
run (issue 11.7, docs/kubernetes.md "RBAC")."""

from __future__ import annotations

from typing import Any

import pytest

from tests.envtest.test_k8s_backend import Kube, _empty_namespace, job, kube, submit, wait

__all__ = ["kube"]  # the fixture, imported for this module

pytestmark = [pytest.mark.k8s, pytest.mark.django_db(transaction=True)]


def test_a_team_whose_namespace_is_not_provisioned_waits_with_the_reason(
    kube: Kube, world: Any,
) -> None:
    from accounts.models import Role
    from queueing.services.provisioning import sync_cluster
    from queueing.services.scheduler import scheduler_cycle
    from tests.factories import MembershipFactory, QuotaFactory, TeamFactory

    assert kube.backend.provision == "separate"
    audio = TeamFactory(slug="audio", weight=1.0)
    QuotaFactory(team=audio, gpu_type=world.h100, nominal=8, borrowing_limit=8)
    MembershipFactory(user=world.member, team=audio, role=Role.MEMBER)
    try:
        pk = submit(world, team="audio", gpus=1, env={"FAIRQ_SIM_SECONDS": "2"})
        for _ in range(3):
            scheduler_cycle()
        assert job(pk).status == "QUEUED"
        assert not kube.core.list_namespace(
            field_selector=f"metadata.name={kube.ns('audio')}").items
        detail = world.client(world.member).get(f"/api/v1/jobs/{pk}/").json()
        codes = {r["code"]: r["message"] for r in detail["queue"]["reasons"]}
        assert "namespace_not_provisioned" in codes, detail["queue"]
        assert "sync_cluster" in codes["namespace_not_provisioned"]

        sync_cluster(kube.backend.provisioner)  # here with the test's admin account
        kube.backend.provisioner.forget_refusals()  # as after UNPROVISIONED_RECHECK_SECONDS
        wait(lambda: job(pk).status in ("RUNNING", "SUCCEEDED"), what="the job running")
        assert kube.jobs("audio", pk)
    finally:
        _empty_namespace(kube, kube.ns("audio"))
