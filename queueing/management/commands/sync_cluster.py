"""`manage.py sync_cluster`: PriorityClasses for the tiers, namespaces and ResourceQuotas
for the teams, on every Kubernetes cluster fairq schedules onto (the enabled `Cluster`
rows of kind kubernetes, or the one cluster of settings; `--cluster NAME` for one).
Idempotent. Prints the report (JSON, per cluster when there are rows); exits non-zero,
naming them, when an object failed or a PriorityClass name is taken by a class fairq did
not create (the other objects and clusters are synced anyway). Team namespaces the
cluster admin has not bootstrapped are listed (`not_bootstrapped`), not failures.

`--bootstrap` prints, instead, what the cluster admin applies once per new team with
the admin's own rights (`... sync_cluster --bootstrap | kubectl apply -f -`): each team's
namespace and the provisioner's RoleBinding in it (docs/kubernetes.md, "RBAC"). It reads
the database only; it needs `--cluster` when there are several clusters."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from queueing.services.provisioning import bootstrap, cluster_provisioners, sync_cluster


class Command(BaseCommand):
    help = "Create or update fairq's PriorityClasses, team namespaces and quotas."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--cluster", default="",
                            help="Only this cluster (a Cluster row's name).")
        parser.add_argument("--bootstrap", action="store_true",
                            help="Print the team namespaces and the provisioner's "
                                 "RoleBindings for the cluster admin to apply "
                                 "(kubectl apply -f -); change nothing.")

    def handle(self, *args: Any, **options: Any) -> None:
        targets = cluster_provisioners()
        if not targets:
            raise CommandError("no Kubernetes cluster: FAIRQ_CLUSTER_BACKEND is not "
                               "'kubernetes' and no enabled Cluster row is: nothing to sync")
        if options["cluster"]:
            targets = [t for t in targets if t[0] == options["cluster"]]
            if not targets:
                raise CommandError(f"no enabled Kubernetes cluster named "
                                   f"{options['cluster']!r}")
        if options["bootstrap"]:
            if len(targets) > 1:
                raise CommandError("several Kubernetes clusters: name one with --cluster")
            self.stdout.write(json.dumps(bootstrap(targets[0][1]), indent=2, sort_keys=True))
            return
        reports: dict[str, Any] = {}
        problems: list[str] = []
        for name, provisioner in targets:
            report = sync_cluster(provisioner)
            reports[name] = report
            where = f"{name}: " if name else ""
            problems += [f"{where}{f['kind']} {f['name']}: {f['error']}"
                         for f in report.get("failed", [])]
            if report.get("conflicts"):
                problems.append(f"{where}PriorityClasses not created by fairq already use "
                                "these names: " + ", ".join(report["conflicts"]))
        shown = reports[""] if list(reports) == [""] else reports
        self.stdout.write(json.dumps(shown, indent=2, sort_keys=True))
        waiting = sorted({ns for r in reports.values() for ns in r.get("not_bootstrapped", ())})
        if waiting:
            self.stderr.write("team namespaces not bootstrapped (the cluster admin applies "
                              "`manage.py sync_cluster --bootstrap`): " + ", ".join(waiting))
        if problems:
            raise CommandError("sync_cluster did not sync everything:\n" + "\n".join(problems))
