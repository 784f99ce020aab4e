"""A webhook try has a total deadline and goes to the address it checked (docs/webhooks.md,
"Retries" and "Where it is sent"): a real HTTP receiver on 127.0.0.1 that hangs, or
drips its answer a byte a second, costs one try FAIRQ_WEBHOOK_TIMEOUT_SECONDS and no
more; a host is resolved once, and the POST connects to the address that was checked
(a DNS server answering a public address, then 127.0.0.1, reaches nothing local)."""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest

from queueing.models import WebhookAttempt, WebhookDelivery
from queueing.services import webhooks as wh

from .receiver import receiver
from .test_deliveries import _endpoint, _submit

pytestmark = pytest.mark.django_db

DEADLINE = 2.0


@pytest.mark.parametrize("behaviour", ["hang", "drip"])
def test_a_try_ends_at_its_total_deadline_when_the_receiver_hangs_or_drips(
    world, settings, django_capture_on_commit_callbacks, behaviour
):
    settings.FAIRQ_WEBHOOK_TIMEOUT_SECONDS = DEADLINE
    admin = world.client(world.admin)
    with receiver(behaviour=behaviour, drip_seconds=1.0) as rx:
        _endpoint(admin, rx.url)
        started = time.monotonic()
        job = _submit(admin, django_capture_on_commit_callbacks)
        took = time.monotonic() - started
        assert len(rx.received) == 1  # the POST arrived: the receiver is what is slow
    attempt = WebhookAttempt.objects.get(delivery__job_id=job["id"])
    # The whole try (connect, send, status, headers, body) within the deadline, plus the
    # submit's own work: a byte a second never keeps it going.
    assert took < DEADLINE + 1.5, took
    assert DEADLINE - 0.1 <= attempt.duration_ms / 1000 < DEADLINE + 0.5, attempt.duration_ms
    assert attempt.status_code is None
    assert attempt.error.startswith("DeadlineExceeded: no complete answer within 2 s"), attempt.error
    assert attempt.next_retry_at is not None  # a timeout is tried again


def test_a_slow_but_timely_answer_is_not_cut_off(world, settings, django_capture_on_commit_callbacks):
    settings.FAIRQ_WEBHOOK_TIMEOUT_SECONDS = 5.0
    admin = world.client(world.admin)
    with receiver(behaviour="drip", drip_seconds=0.05) as rx:
        _endpoint(admin, rx.url)
        job = _submit(admin, django_capture_on_commit_callbacks)
        assert len(rx.received) == 1
    attempt = WebhookAttempt.objects.get(delivery__job_id=job["id"])
    assert (attempt.status_code, attempt.error, attempt.response_excerpt) == (200, "", "ok")


class Rebinding:
    """A DNS server for one name that answers a public address first and 127.0.0.1 on
    every later lookup (DNS rebinding); other names resolve as usual."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lookups = 0
        self.real = socket.getaddrinfo

    def __call__(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != self.name:
            return self.real(host, port, *args, **kwargs)
        self.lookups += 1
        address = "93.184.215.14" if self.lookups == 1 else "127.0.0.1"
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port))]


def test_the_post_goes_to_the_address_that_was_checked(
    world, settings, monkeypatch, django_capture_on_commit_callbacks
):
    settings.FAIRQ_WEBHOOK_ALLOW_PRIVATE = False
    settings.FAIRQ_WEBHOOK_TIMEOUT_SECONDS = 1.0
    dns = Rebinding("hooks.rebind.test")
    monkeypatch.setattr(socket, "getaddrinfo", dns)
    admin = world.client(world.admin)
    with receiver() as rx:
        port = rx.url.split(":")[2].split("/")[0]
        _endpoint(admin, f"http://hooks.rebind.test:{port}/hooks/")
        job = _submit(admin, django_capture_on_commit_callbacks)
        time.sleep(0.2)
    # Resolved once, checked (public: allowed), and connected to as resolved: the local
    # receiver the second answer points at never sees the POST.
    assert rx.received == [] and rx.started == []
    assert dns.lookups == 1
    attempt = WebhookAttempt.objects.get(delivery__job_id=job["id"])
    assert attempt.status_code is None and not attempt.error.startswith("refused")


def test_the_pinned_connection_keeps_the_urls_host_header(
    world, monkeypatch, django_capture_on_commit_callbacks
):
    dns = Rebinding("hooks.local.test")
    dns.lookups = 1  # every answer is 127.0.0.1 (the tests allow private addresses)
    monkeypatch.setattr(socket, "getaddrinfo", dns)
    admin = world.client(world.admin)
    with receiver() as rx:
        port = rx.url.split(":")[2].split("/")[0]
        rx.secret = _endpoint(admin, f"http://hooks.local.test:{port}/hooks/?team=vision")["secret"]
        job = _submit(admin, django_capture_on_commit_callbacks)
    [got] = rx.received
    assert got.headers["host"] == f"hooks.local.test:{port}"
    assert got.path == "/hooks/?team=vision"
    assert got.verified is not None and got.answered == 200
    assert WebhookDelivery.objects.get(job_id=job["id"]).status == WebhookDelivery.Status.SUCCEEDED


@pytest.mark.parametrize(
    ("address", "allow_private", "refused"),
    [
        # Azure's wireserver: public-looking, every Azure VM reaches it.
        ("168.63.129.16", False, True),
        ("168.63.129.16", True, True),
        # IETF protocol assignments (Oracle's metadata service is 192.0.0.192).
        ("192.0.0.9", False, True),
        ("192.0.0.170", False, True),
        ("192.0.0.192", True, True),
        # 6to4 (2002::/16): refused whatever it embeds; metadata even when private is allowed.
        ("2002:808:808::1", False, True),
        ("2002:7f00:1::1", False, True),
        ("2002:a9fe:a9fe::1", True, True),
        # Teredo (2001::/32).
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", False, True),
        # IPv4-mapped, NAT64 and IPv4-compatible forms: their IPv4 address decides.
        ("::ffff:10.0.0.1", False, True),
        ("::ffff:127.0.0.1", False, True),
        ("::ffff:168.63.129.16", False, True),
        ("::ffff:8.8.8.8", False, False),
        ("::ffff:127.0.0.1", True, False),
        ("64:ff9b::7f00:1", False, True),
        ("64:ff9b::a9fe:a9fe", True, True),
        ("::a9fe:a9fe", True, True),
        # Other special blocks Python counts as not global.
        ("100.64.0.1", False, True),
        ("100.100.100.200", True, True),
        ("198.18.0.1", False, True),
        ("240.0.0.1", False, True),
        ("255.255.255.255", False, True),
        ("fd00:ec2::254", True, True),
        ("fc00::1", False, True),
        ("::1", False, True),
        ("::", True, True),
        # Globally routable: sent to.
        ("93.184.215.14", False, False),
        ("2606:4700::1111", False, False),
    ],
)
def test_only_globally_routable_addresses_are_sent_to(address, allow_private, refused):
    assert (wh.address_problem(address, allow_private=allow_private) is not None) is refused
