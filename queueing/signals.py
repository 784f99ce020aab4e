"""Keep the Kubernetes cluster in step with tiers and quotas: a change queues
`sync_cluster_task` once the transaction commits (only with a backend that provisions:
`provisions`, composition.backend_class()). A deleted JobLog row deletes its kept file
(services/logs.py, `joblog_file_forget`). Heartbeats for the liveness probes
(queueing/health.py): a worker touches its file after every scheduler tick it ran (won
the cycle lock or not, failed or not: it is alive and taking ticks), beat after every
tick it sent."""

from __future__ import annotations

from typing import Any

from celery.signals import after_task_publish, task_postrun
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models.signals import post_delete, post_save

from accounts.models import ApiToken, Membership, Team
from queueing.api.auth_cache import generation_bump
from queueing.composition import backend_class
from queueing.health import heartbeat_touch
from queueing.models import JobLog, Quota, TeamBudget, Tier
from queueing.services.logs import joblog_file_forget
from queueing.tasks import sync_cluster_task


def _queue_sync(**kwargs: Any) -> None:
    if kwargs.get("raw") or not backend_class().provisions:
        return

    def send() -> None:
        sync_cluster_task.delay()

    transaction.on_commit(send)


def _auth_changed(**kwargs: Any) -> None:
    """A token, user, team, membership or team budget changed: once the transaction
    commits (at once outside one), every web process reads what it remembers of them
    again (queueing/api/auth_cache.py). A user's own login (`last_login` alone) does
    not count."""
    fields = kwargs.get("update_fields")
    if fields is not None and set(fields) <= {"last_login"}:
        return
    transaction.on_commit(generation_bump)


CYCLE_TASK = "queueing.tasks.scheduler_cycle_task"


def _worker_heartbeat(sender: Any = None, **kwargs: Any) -> None:
    if getattr(sender, "name", None) == CYCLE_TASK:
        heartbeat_touch("worker")


def _beat_heartbeat(sender: Any = None, **kwargs: Any) -> None:
    if sender == CYCLE_TASK:
        heartbeat_touch("beat")


def connect() -> None:
    task_postrun.connect(_worker_heartbeat, dispatch_uid="fairq-worker-heartbeat")
    after_task_publish.connect(_beat_heartbeat, dispatch_uid="fairq-beat-heartbeat")
    for model in (Tier, Quota):
        post_save.connect(_queue_sync, sender=model, dispatch_uid=f"fairq-sync-{model.__name__}")
        post_delete.connect(_queue_sync, sender=model,
                            dispatch_uid=f"fairq-sync-del-{model.__name__}")
    post_delete.connect(joblog_file_forget, sender=JobLog, dispatch_uid="fairq-joblog-file")
    # Tokens and teams remembered by the web processes (queueing/api/auth_cache.py): any
    # change of a token, a user, a team, a membership or a team budget makes them read
    # theirs again.
    for identity in (ApiToken, get_user_model(), Team, Membership, TeamBudget):
        post_save.connect(_auth_changed, sender=identity,
                          dispatch_uid=f"fairq-auth-gen-{identity.__name__}")
        post_delete.connect(_auth_changed, sender=identity,
                            dispatch_uid=f"fairq-auth-gen-del-{identity.__name__}")
