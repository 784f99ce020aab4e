"""The job a `POST /api/v1/jobs/` (or `/jobs/bulk/`) asks for, from its shaped fields: the
one way from the API's body to a JobInput, for the DRF view (JobViewSet's `create` and
`bulk`) and the submit lane's fast path (queueing/api/jobs.py) alike."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from accounts.models import Team
from queueing.services.cluster_rules import CLUSTER_SUBMIT_FIELDS, job_input_with_clusters
from queueing.services.dependencies import job_input_with_dependencies
from queueing.services.jobs import JobInput, job_input_build


def job_input_of(*, actor: Any, fields: Mapping[str, Any],
                 team_lookup: Callable[[str], Team | None] | None = None) -> JobInput:
    """The JobInput of `fields`, a job as JobCreateSerializer shapes it (the bulk's own
    `count`, `array` and `max_running` taken out): every submit rule of `job_input_build`
    (the team through `team_lookup` when given: the fast path's remembered teams), rules
    K3-K4 on the cluster fields (`job_input_with_clusters`, its refusals in the same 400
    as the others'; rule K1's "no cluster holds it" is checked there even without them)
    and rule D3 on the dependencies (`job_input_with_dependencies`). DomainError (400)
    naming the refused fields; `fields` is left as it was."""
    spec = dict(fields)
    dependencies = spec.pop("dependencies", None)
    clusters = {name: spec.pop(name) for name in CLUSTER_SUBMIT_FIELDS if name in spec}

    def build() -> JobInput:
        return job_input_build(actor=actor, team_lookup=team_lookup, **spec)

    data = job_input_with_clusters(build, gpu_type=spec.get("gpu_type"), **clusters)
    return job_input_with_dependencies(data, dependencies)
