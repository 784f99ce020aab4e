"""Domain errors: raised by services, mapped to HTTP once (queueing.api.errors)."""

from __future__ import annotations


class DomainError(Exception):
    status_code = 400
    code = "invalid"

    def __init__(self, message: str, *, fields: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields or {}


class NotFound(DomainError):
    status_code = 404
    code = "not_found"


class PermissionDenied(DomainError):
    """The caller may see the thing but not do this to it (queueing/services/access.py)."""

    status_code = 403
    code = "permission_denied"


class Conflict(DomainError):
    status_code = 409
    code = "conflict"


class InvalidTransition(Conflict):
    code = "invalid_transition"


class IdempotencyKeyReused(DomainError):
    """An idempotency key sent again with a different request (or by someone else)."""

    status_code = 422
    code = "idempotency_key_reused"
