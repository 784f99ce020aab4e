"""Webhook tries never share a worker with the scheduler cycle (docs/webhooks.md, "How it is
sent"): the webhook tasks are routed to a queue of their own by default, and in every
shipped deployment (docker-compose.yml, the Kustomize base as each overlay renders it) the
worker that runs the cycle does not consume that queue while another worker does. The
routing is Celery's own (`app.amqp.router`), read with the settings the pods run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from config.celery import app
from tests.platform_render import OVERLAYS, PLATFORM, render

ROOT = Path(__file__).resolve().parents[2]
CYCLE_TASK = "queueing.tasks.scheduler_cycle_task"
WEBHOOK_TASKS = (
    "queueing.tasks.webhook_deliver_task",
    "queueing.tasks.webhooks_dispatch_task",
    "queueing.tasks.webhooks_due_task",
)


def routed_queue(task: str) -> str:
    queue = app.amqp.router.route({}, task, (), {})["queue"]
    return str(queue.name)


def consumed_queues(command: list[str]) -> set[str] | None:
    """The queues a `celery -A config worker` command line consumes (None: not a worker).
    Without -Q a worker consumes the default queue."""
    if command[:4] != ["celery", "-A", "config", "worker"]:
        return None
    for flag in ("-Q", "--queues"):
        if flag in command:
            return set(command[command.index(flag) + 1].split(","))
    return {str(app.conf.task_default_queue)}


def assert_isolated(workers: dict[str, set[str]], env: dict[str, Any]) -> None:
    assert "FAIRQ_WEBHOOK_QUEUE" not in env  # the shipped default, not an override
    cycle_queue = routed_queue(CYCLE_TASK)
    webhook_queues = {routed_queue(t) for t in WEBHOOK_TASKS}
    assert cycle_queue not in webhook_queues
    cycle_workers = [name for name, queues in workers.items() if cycle_queue in queues]
    assert cycle_workers, workers
    for name in cycle_workers:
        assert not workers[name] & webhook_queues, (name, workers[name])
    for queue in webhook_queues:
        assert [name for name, queues in workers.items() if queue in queues], (queue, workers)


def test_webhook_tasks_are_routed_off_the_cycles_queue_by_default() -> None:
    assert routed_queue(CYCLE_TASK) == "celery"
    assert {routed_queue(t) for t in WEBHOOK_TASKS} == {"webhooks"}


def test_compose_cycle_worker_does_not_consume_the_webhook_queue() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    workers = {}
    for name, service in compose["services"].items():
        queues = consumed_queues(service.get("command") or [])
        if queues is not None:
            workers[name] = queues
    assert_isolated(workers, compose["x-fairq"]["environment"])
    assert workers["worker"] == {"celery"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kustomize_cycle_worker_does_not_consume_the_webhook_queue(overlay: str) -> None:
    docs = render(PLATFORM / "overlays" / overlay)
    workers = {}
    for doc in docs:
        if doc["kind"] != "Deployment":
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            queues = consumed_queues(container.get("command") or [])
            if queues is not None:
                workers[doc["metadata"]["name"]] = queues
    [config] = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith(
        "fairq-config")]
    assert_isolated(workers, config["data"])
    assert workers["fairq-worker"] == {"celery"}
    # The webhook worker has no cluster credentials: it only sends HTTP.
    hooks = next(d for d in docs if d["kind"] == "Deployment"
                 and d["metadata"]["name"] == "fairq-webhooks")
    assert hooks["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
