"""Keep the Kubernetes cluster in step with tiers and quotas: a change queues
`sync_cluster_task` once the transaction commits (only with a backend that provisions:
`provisions`, composition.backend_class()). A deleted JobLog row deletes its kept file
(services/logs.py, `joblog_file_forget`)."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models.signals import post_delete, post_save

from queueing.composition import backend_class
from queueing.models import JobLog, Quota, Tier
from queueing.services.logs import joblog_file_forget
from queueing.tasks import sync_cluster_task


def _queue_sync(**kwargs: Any) -> None:
    if kwargs.get("raw") or not backend_class().provisions:
        return

    def send() -> None:
        sync_cluster_task.delay()

    transaction.on_commit(send)


def connect() -> None:
    for model in (Tier, Quota):
        post_save.connect(_queue_sync, sender=model, dispatch_uid=f"fairq-sync-{model.__name__}")
        post_delete.connect(_queue_sync, sender=model,
                            dispatch_uid=f"fairq-sync-del-{model.__name__}")
    post_delete.connect(joblog_file_forget, sender=JobLog, dispatch_uid="fairq-joblog-file")
