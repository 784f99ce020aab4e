"""The job a submit asks for, from its fields: the one way from a front end's fields to a
JobInput, for the API (JobViewSet's `create` and `bulk`, and the submit lane's fast path
in queueing/api/jobs.py) and the web pages (the submit form, "Resubmit") alike, so both
check the cluster fields (rules K3-K4 of docs/scheduling.md) and the dependencies (rule
D3) the same way, once."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from accounts.models import Team

from .cluster_rules import CLUSTER_SUBMIT_FIELDS, job_input_with_clusters
from .dependencies import job_input_with_dependencies
from .jobs import JobInput, job_input_build


def job_input_of(*, actor: Any, fields: Mapping[str, Any],
                 team_lookup: Callable[[str], Team | None] | None = None) -> JobInput:
    """The JobInput of `fields`, a job as a front end shapes it (the API's
    JobCreateSerializer, the bulk's own `count`, `array` and `max_running` taken out; the
    web's JobSubmitForm): every submit rule of `job_input_build` (the team through
    `team_lookup` when given: the fast path's remembered teams), rules K3-K4 on the
    cluster fields (`job_input_with_clusters`, its refusals in the same 400 as the
    others'; rule K1's "no cluster holds it" is checked there even without them) and rule
    D3 on the dependencies (`job_input_with_dependencies`). DomainError (400) naming the
    refused fields; `fields` is left as it was."""
    spec = dict(fields)
    dependencies = spec.pop("dependencies", None)
    clusters = {name: spec.pop(name) for name in CLUSTER_SUBMIT_FIELDS if name in spec}

    def build() -> JobInput:
        return job_input_build(actor=actor, team_lookup=team_lookup, **spec)

    data = job_input_with_clusters(build, gpu_type=spec.get("gpu_type"), **clusters)
    return job_input_with_dependencies(data, dependencies)
