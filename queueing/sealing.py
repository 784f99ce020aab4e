"""Signing secrets at rest (docs/webhooks.md, "Secrets at rest"): the webhook endpoints'
and the teams' notify secrets are stored encrypted with Fernet (`cryptography`), never in
clear. `MultiFernet` over FAIRQ_WEBHOOK_SECRET_KEYS: the first key encrypts, every key
decrypts, so a new key is put first, `manage.py reencrypt_webhook_secrets` re-encrypts
every row with it, and the old key can then be dropped. Without keys, one key derived
from DJANGO_SECRET_KEY (HKDF-SHA256) is used; it also stays the last decrypting key when
keys are set, so rows written before they were set still open."""

from __future__ import annotations

import base64
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

CLEAR_PREFIX = "whsec_"  # how a secret reads in clear (Standard Webhooks)


class SealError(Exception):
    """A stored secret none of the keys opens (a key was dropped too early)."""


def derived_key(secret_key: str) -> bytes:
    """The Fernet key derived from DJANGO_SECRET_KEY."""
    raw = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
               info=b"fairq webhook signing secrets").derive(secret_key.encode())
    return base64.urlsafe_b64encode(raw)


@lru_cache(maxsize=4)
def _fernet(keys: tuple[str, ...], secret_key: str) -> MultiFernet:
    derived = derived_key(secret_key)
    chain = [Fernet(k.encode()) for k in keys]
    if derived.decode() not in keys:
        chain.append(Fernet(derived))
    return MultiFernet(chain)


def fernet() -> MultiFernet:
    return _fernet(tuple(settings.FAIRQ_WEBHOOK_SECRET_KEYS), settings.SECRET_KEY)


def is_sealed(stored: str) -> bool:
    return not stored.startswith(CLEAR_PREFIX)


def seal(clear: str) -> str:
    """`clear` encrypted with the first key, as stored."""
    return fernet().encrypt(clear.encode()).decode()


def unseal(stored: str) -> str:
    """The secret in clear. A row still in clear (written before encryption, not yet
    migrated) is returned as it is. SealError when no key opens it."""
    if not is_sealed(stored):
        return stored
    try:
        return fernet().decrypt(stored.encode()).decode()
    except InvalidToken as exc:
        raise SealError("no key of FAIRQ_WEBHOOK_SECRET_KEYS opens this secret") from exc


def reseal(stored: str) -> str:
    """`stored` encrypted with the first key (a clear row sealed)."""
    if not is_sealed(stored):
        return seal(stored)
    try:
        return fernet().rotate(stored.encode()).decode()
    except InvalidToken as exc:
        raise SealError("no key of FAIRQ_WEBHOOK_SECRET_KEYS opens this secret") from exc
