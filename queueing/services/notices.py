"""Notices to people by e-mail (Django's mail API: `EMAIL_URL` picks the SMTP server in
production; the console in the demo; nothing is sent without an address).

- Rule U2: a job's GPUs were flagged idle — its submitter is told what the tier will do
  and when, so they can free the GPUs or fix the job first.
- Rule U3: an idle job was reclaimed (requeued or failed).

Sent after the ingest's transaction committed, one batch per minute; a mail server that
fails is logged and never holds up the cycle (the events and the badges say the same)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.conf import settings
from django.core.mail import send_mass_mail

from queueing.models import Job

log = logging.getLogger(__name__)


def _job_url(job_id: int) -> str:
    base = settings.FAIRQ_PUBLIC_URL.rstrip("/")
    return f"{base}/jobs/{job_id}/" if base else f"/jobs/{job_id}/"


def idle_notices_send(*, flagged: Iterable[int] = (), requeued: Iterable[int] = (),
                      failed: Iterable[int] = ()) -> int:
    """E-mail each job's submitter that its GPUs are idle (U2) or that it was reclaimed
    (U3); returns how many messages were sent (0 when FAIRQ_NOTICE_EMAILS is off, or
    for submitters without an address)."""
    what = {**dict.fromkeys(flagged, "flagged"), **dict.fromkeys(requeued, "requeued"),
            **dict.fromkeys(failed, "failed")}
    if not what or not settings.FAIRQ_NOTICE_EMAILS:
        return 0
    messages = []
    for job in Job.objects.select_related("submitter", "tier", "team").filter(pk__in=what):
        address = getattr(job.submitter, "email", "") if job.submitter else ""
        if not address:
            continue
        tier = job.tier
        if what[job.pk] == "flagged":
            then = ("it stays flagged until it is busy again" if tier.idle_action == "flag"
                    else f"fairq {'requeues' if tier.idle_action == 'requeue' else 'stops'} "
                         f"it if they are still idle {tier.idle_grace_minutes} minute(s) from "
                         "now")
            subject = f"fairq: job {job.pk} ({job.name}) holds idle GPUs"
            body = (f"The GPUs of your job {job.pk} ({job.team.slug}/{job.name}) have been "
                    f"below {tier.idle_threshold_percent:g}% SM activity for "
                    f"{tier.idle_window_minutes} minute(s) (rule U2, tier {tier.slug}); "
                    f"{then}.\n\n{_job_url(job.pk)}\n")
        else:
            done = ("requeued (it runs again when there is room)"
                    if what[job.pk] == "requeued" else "stopped and failed with reason 'idle'")
            subject = f"fairq: job {job.pk} ({job.name}) was {what[job.pk]}: idle GPUs"
            body = (f"Your job {job.pk} ({job.team.slug}/{job.name}) kept its GPUs idle "
                    f"{tier.idle_grace_minutes} minute(s) after it was flagged, so it was "
                    f"{done} (rule U3, tier {tier.slug}).\n\n{_job_url(job.pk)}\n")
        messages.append((subject, body, None, [address]))
    return mails_send(messages, what="utilization: e-mailing %d idle notice(s) failed")


def mails_send(messages: list[tuple[str, str, None, list[str]]], *, what: str) -> int:
    """Send the notices (subject, body, from = the default, recipients) in one connection;
    how many went. A mail server that fails loses these notices only: it is logged with
    `what` (a format of the count) and never fails the task that asked."""
    if not messages:
        return 0
    try:
        return int(send_mass_mail(messages, fail_silently=False))
    except Exception:
        log.warning(what, len(messages), exc_info=True)
        return 0
