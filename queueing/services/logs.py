"""Job logs for people, without the web touching the cluster (docs/kubernetes.md, "RBAC").

The worker reads a bounded tail of each running job's logs every
FAIRQ_LOG_ARCHIVE_SECONDS, and once more after the attempt finished, into `JobLog`
(`job_logs_archive`, the beat task `job-logs-archive`). The web and the API read that
copy (`job_logs_archived`): at most one refresh old while the job runs, complete (up to
the bound) once it finished, and kept after Kubernetes deleted the pod.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q

from queueing.backends.base import ClusterBackend
from queueing.models import Job, JobLog
from queueing.policy.states import FINAL_STATES, JobState

log = logging.getLogger(__name__)

# Finished attempts older than this are not read any more (their pods are gone).
FINISHED_LOOKBACK = timedelta(hours=2)
# Jobs read per run: bounds the task's time (one or two API calls per job).
BATCH = 200


@dataclass
class ArchiveResult:
    refreshed: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)


def bound_log_text(text: str, *, lines: int, max_bytes: int) -> str:
    """The last `lines` lines of `text`, cut further (whole lines first) to `max_bytes`
    of UTF-8."""
    kept = text.splitlines()[-lines:]
    out = "\n".join(kept)
    while len(out.encode()) > max_bytes and len(kept) > 1:
        kept = kept[max(1, len(kept) // 10):]
        out = "\n".join(kept)
    if len(out.encode()) > max_bytes:  # one huge line: its end
        out = out.encode()[-max_bytes:].decode(errors="ignore")
    return out


def job_logs_archive(*, backend: ClusterBackend, now: datetime,
                     limit: int = BATCH) -> ArchiveResult:
    """Refresh the archived logs of running jobs (older than FAIRQ_LOG_ARCHIVE_SECONDS)
    and read once more those of attempts that finished since their last read. At most
    `limit` jobs, the longest unread first; a job whose logs cannot be read keeps its
    last copy and is tried again next run."""
    result = ArchiveResult()
    refresh = timedelta(seconds=settings.FAIRQ_LOG_ARCHIVE_SECONDS)
    jobs = list(
        Job.objects.filter(
            Q(status=JobState.RUNNING)
            | Q(status__in=[str(s) for s in FINAL_STATES], started_at__isnull=False,
                finished_at__gte=now - FINISHED_LOOKBACK))
        .only("id", "attempt", "status", "finished_at")
    )
    archived = {(r.job_id, r.attempt): r for r in JobLog.objects.filter(
        job_id__in=[j.pk for j in jobs]).only("job_id", "attempt", "fetched_at", "final")}

    def due(job: Job) -> datetime | None:
        """None: up to date; else when it was last read (the oldest first)."""
        row = archived.get((job.pk, job.attempt))
        if row is None:
            return datetime.min.replace(tzinfo=now.tzinfo)
        if row.final:
            return None
        if job.state == JobState.RUNNING:
            return row.fetched_at if now - row.fetched_at >= refresh else None
        return row.fetched_at  # finished since the last read: read once more

    todo = sorted(((d, j) for j in jobs if (d := due(j)) is not None),
                  key=lambda p: (p[0], p[1].pk))[:limit]
    for _, job in todo:
        try:
            text = backend.logs(job.backend_name, tail=settings.FAIRQ_LOG_ARCHIVE_LINES)
        except Exception as exc:  # the cluster is down: keep the last copy
            log.info("archiving the logs of %s failed: %s", job.backend_name, exc)
            result.failed[job.pk] = str(exc)[:200]
            continue
        text = bound_log_text(text, lines=settings.FAIRQ_LOG_ARCHIVE_LINES,
                              max_bytes=settings.FAIRQ_LOG_ARCHIVE_MAX_BYTES)
        final = job.state in FINAL_STATES
        row = archived.get((job.pk, job.attempt))
        if row is not None and row.text and _nothing_read(text):
            # The pod is gone (TTL, deleted): that answer must not erase the copy.
            JobLog.objects.filter(pk=row.pk).update(fetched_at=now, final=final)
        else:
            JobLog.objects.update_or_create(job_id=job.pk, attempt=job.attempt,
                                            defaults={"text": text, "fetched_at": now,
                                                      "final": final})
        result.refreshed.append(job.pk)
    return result


def _nothing_read(text: str) -> bool:
    """The backend's answer holds no line of the job's own (only its "[fairq] ..." notes
    and per-pod headers)."""
    return all(line.startswith(("[fairq]", "==> ")) for line in text.splitlines())


def job_logs_archived(*, job: Job, tail: int = 100) -> str | None:
    """The last `tail` lines of the job's current attempt as last archived (or of its
    latest archived attempt); None when nothing was archived."""
    row = (JobLog.objects.filter(job=job, attempt__lte=job.attempt)
           .order_by("-attempt").only("text").first())
    if row is None:
        return None
    return "\n".join(row.text.splitlines()[-tail:])
