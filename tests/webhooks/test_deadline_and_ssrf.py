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
    # submit's own work (seconds on a loaded 2-core machine): a byte a second, 40 bytes
    # in all, never keeps it going (without the deadline the drip took 40 s).
    assert took < DEADLINE + 6, took
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


def _tls_receiver_files(tmp_path: Any, name: str) -> tuple[str, str, str]:
    """A CA and a certificate for `name` it signed (cryptography), as PEM files: the CA
    bundle, the certificate and its key."""
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.now(UTC)

    def cert(subject: str, key: Any, issuer: str, signer: Any, ca: bool) -> Any:
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - timedelta(hours=1))
                   .not_valid_after(now + timedelta(hours=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if ca:
            builder = builder.add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        else:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_cert = cert("fairq test CA", ca_key, "fairq test CA", ca_key, True)
    leaf = cert(name, leaf_key, "fairq test CA", ca_key, False)
    files = {"ca.pem": ca_cert.public_bytes(serialization.Encoding.PEM),
             "leaf.pem": leaf.public_bytes(serialization.Encoding.PEM),
             "leaf.key": leaf_key.private_bytes(serialization.Encoding.PEM,
                                                serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption())}
    for file, data in files.items():
        (tmp_path / file).write_bytes(data)
    return str(tmp_path / "ca.pem"), str(tmp_path / "leaf.pem"), str(tmp_path / "leaf.key")


@pytest.mark.parametrize(("url_name", "verified"), [("hooks.tls.test", True), ("other.tls.test", False)])
def test_the_pinned_tls_connection_checks_the_certificate_for_the_urls_name(
    world, monkeypatch, tmp_path, django_capture_on_commit_callbacks, url_name, verified
):
    """A real TLS receiver on 127.0.0.1 with a certificate for hooks.tls.test: reached at
    the resolved address, the POST still sends the name (SNI) and checks the certificate
    against it: accepted for hooks.tls.test, refused for a name the certificate lacks."""
    import ssl

    ca, leaf, key = _tls_receiver_files(tmp_path, "hooks.tls.test")
    monkeypatch.setattr(wh.certifi, "where", lambda: ca)
    dns = Rebinding(url_name)
    dns.lookups = 1  # always 127.0.0.1
    monkeypatch.setattr(socket, "getaddrinfo", dns)
    server_names: list[str | None] = []
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(leaf, key)
    context.sni_callback = lambda sock, name, ctx: server_names.append(name)
    admin = world.client(world.admin)
    with receiver() as rx:
        port = rx.url.split(":")[2].split("/")[0]
        rx.tls(context)
        rx.secret = _endpoint(admin, f"https://{url_name}:{port}/hooks/")["secret"]
        job = _submit(admin, django_capture_on_commit_callbacks)
    attempt = WebhookAttempt.objects.get(delivery__job_id=job["id"])
    assert server_names == [url_name]
    if verified:
        assert attempt.status_code == 200 and attempt.error == "", attempt.error
        assert rx.received[0].verified is not None
        assert rx.received[0].headers["host"] == f"hooks.tls.test:{port}"
    else:
        assert rx.received == [] and attempt.status_code is None
        assert "certificate" in attempt.error.lower() or "hostname" in attempt.error.lower(), attempt.error
