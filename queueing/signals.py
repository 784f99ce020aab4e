"""Keep the Kubernetes cluster in step with tiers and quotas: a change queues
`sync_cluster_task` once the transaction commits (only with the kubernetes backend)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models.signals import post_delete, post_save


def _queue_sync(**kwargs: Any) -> None:
    if settings.FAIRQ_CLUSTER_BACKEND != "kubernetes" or kwargs.get("raw"):
        return

    def send() -> None:
        from queueing.tasks import sync_cluster_task

        sync_cluster_task.delay()

    transaction.on_commit(send)


def connect() -> None:
    from queueing.models import Quota, Tier

    for model in (Tier, Quota):
        post_save.connect(_queue_sync, sender=model, dispatch_uid=f"fairq-sync-{model.__name__}")
        post_delete.connect(_queue_sync, sender=model,
                            dispatch_uid=f"fairq-sync-del-{model.__name__}")
