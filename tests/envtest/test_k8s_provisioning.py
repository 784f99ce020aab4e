"""FAIRQ_K8S_PROVISION=separate (the default): the scheduler does not create team
namespaces. A team nobody provisioned yet has its jobs wait, with the reason, holding no
GPUs and creating nothing in the cluster; once `sync_cluster` (the provisioner) ran, they
run (docs/kubernetes.md "RBAC")."""

from __future__ import annotations

from typing import Any

import pytest

from tests.envtest.test_k8s_backend import Kube, _empty_namespace, job, kube, submit, wait
from tests.envtest.test_k8s_rbac import rbac_applied

__all__ = ["kube", "rbac_applied"]  # the fixtures, imported for this module

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


def test_a_new_team_is_bootstrapped_by_the_admin_then_provisioned_by_the_provisioner(
    rbac_applied: None, kube: Kube, world: Any, k8s_api_client: Any,
) -> None:
    """Adding a team (docs/deployment.md): the provisioner account may not make its
    namespace (`not_bootstrapped`, not a failure); the cluster admin applies
    `sync_cluster --bootstrap`; the provisioner account then provisions it (labels,
    quota, the scheduler's RoleBinding)."""
    import io
    import json

    from django.core.management import call_command

    from queueing.backends.k8s_provisioner import KubernetesProvisioner
    from queueing.services.provisioning import sync_cluster, team_gpu_limits
    from tests.envtest.test_k8s_backend import client
    from tests.envtest.test_k8s_rbac import PROVISIONER_ACCOUNT, _apply, api_client_from_sa
    from tests.factories import TeamFactory

    TeamFactory(slug="audio")
    api = api_client_from_sa(k8s_api_client, "fairq-provisioner")
    provisioner = KubernetesProvisioner(
        lambda: api, namespace_prefix=kube.prefix, team_quota=team_gpu_limits,
        scheduler_account=("fairq-system", "fairq-scheduler"),
        provisioner_account=PROVISIONER_ACCOUNT)
    try:
        report = sync_cluster(provisioner)
        assert report["not_bootstrapped"] == [kube.ns("audio")], report
        assert report["failed"] == [], report
        assert kube.ns("vision") in report["namespaces"]  # bootstrapped by the fixture

        out = io.StringIO()
        call_command("sync_cluster", "--bootstrap", stdout=out)
        listed = json.loads(out.getvalue())
        assert listed["kind"] == "List"
        assert {(d["kind"], d["metadata"]["name"]) for d in listed["items"]
                if d["kind"] == "Namespace" or d["metadata"].get("namespace") ==
                kube.ns("audio")} >= {("Namespace", kube.ns("audio")),
                                      ("RoleBinding", "fairq-provisioner")}
        for doc in listed["items"]:
            _apply(k8s_api_client, doc)  # `kubectl apply -f -` with the admin's rights

        def synced() -> dict[str, Any] | None:
            again = sync_cluster(provisioner)
            return again if kube.ns("audio") in again["namespaces"] else None

        report = wait(synced, cycle=False, what="the bootstrapped team provisioned")
        assert report["not_bootstrapped"] == [] and report["failed"] == [], report
        rbac = client.RbacAuthorizationV1Api(k8s_api_client)
        binding = rbac.read_namespaced_role_binding("fairq-scheduler", kube.ns("audio"))
        assert binding.role_ref.name == "fairq-team-workloads"
        assert kube.core.read_namespaced_resource_quota("fairq-gpus", kube.ns("audio"))
    finally:
        api.close()
        _empty_namespace(kube, kube.ns("audio"))
