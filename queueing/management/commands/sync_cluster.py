"""`manage.py sync_cluster`: PriorityClasses for the tiers, namespaces and ResourceQuotas
for the teams, on the Kubernetes cluster fairq is configured for. Idempotent. Prints the
report (JSON); exits non-zero, naming them, when an object failed or a PriorityClass
name is taken by a class fairq did not create (the other objects are synced anyway)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from queueing.composition import get_provisioner
from queueing.services.provisioning import sync_cluster


class Command(BaseCommand):
    help = "Create or update fairq's PriorityClasses, team namespaces and quotas."

    def handle(self, *args: Any, **options: Any) -> None:
        provisioner = get_provisioner()
        if provisioner is None:
            raise CommandError("FAIRQ_CLUSTER_BACKEND is not 'kubernetes': nothing to sync")
        report = sync_cluster(provisioner)
        self.stdout.write(json.dumps(report, indent=2, sort_keys=True))
        problems = [f"{f['kind']} {f['name']}: {f['error']}" for f in report.get("failed", [])]
        if report.get("conflicts"):
            problems.append("PriorityClasses not created by fairq already use these names: "
                            + ", ".join(report["conflicts"]))
        if problems:
            raise CommandError("sync_cluster did not sync everything:\n" + "\n".join(problems))
