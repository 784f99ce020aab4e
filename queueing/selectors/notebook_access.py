"""The read behind the notebook proxy (docs/sessions.md, "Opening one")."""

from __future__ import annotations

from queueing.models import Job


def session_job_get(*, job_id: int) -> Job | None:
    """The job `job_id`, or None. No tenant scope here on purpose: the proxy asks
    `can_open_session` next, which is stricter than seeing the job (its owner and staff
    only), and answers 403 alike for a job that does not exist and one the user may not
    open, so ids of other teams are not disclosed."""
    return Job.objects.filter(pk=job_id).first()
