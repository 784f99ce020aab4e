"""`Idempotency-Key` on every POST of API v1.

The first POST with a key claims it (accounts.IdempotencyRecord) before the view runs and
stores the response after; a retry with the same key and the same request gets that
response back (a replayed 201 answers 200: nothing was created this time) with the header
`Idempotent-Replayed: true`. The same key with a different request is 422; a retry while
the first is still running is 409. 5xx and 429 answers are not stored, so they may be
retried. Keys are scoped per user and forgotten after a day.

One layer per POST: `POST /jobs/` keeps its key on the job instead (unique per team, as
long as the job exists; `services/jobs.py::job_submit_with_event`), so this mixin stands
aside for it (`idempotency_recorded`).

What is stored is `idempotent_body(data)` of the view: a view whose answer holds a secret
(a new token's key) stores it without, so the secret exists only in the one response that
created it, and a replay says so.
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.http.request import RawPostDataException
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.services import idempotency_claim, idempotency_complete, idempotency_release
from queueing.errors import Conflict, DomainError, IdempotencyKeyReused

HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 200


def idempotency_key(request: Request) -> str | None:
    """The request's `Idempotency-Key` (None when absent or empty); 400 on the header
    when it is longer than the column that keeps it."""
    key = request.headers.get(HEADER) or None
    if key is not None and len(key) > MAX_KEY_LENGTH:
        raise DomainError(f"{HEADER} is longer than {MAX_KEY_LENGTH} characters.",
                          fields={HEADER: [f"At most {MAX_KEY_LENGTH} characters."]})
    return key


class _Replay(Exception):
    def __init__(self, response: Response) -> None:
        self.response = response


def _fingerprint(request: Request) -> str:
    try:
        body = request.body  # Django's HttpRequest.body, which DRF's Request proxies
    except RawPostDataException:  # already parsed (form posts): hash what was parsed
        body = repr(sorted(request.data.items()) if hasattr(request.data, "items")
                    else request.data).encode()
    h = hashlib.sha256()
    h.update(f"{request.method} {request.path}\n".encode())
    h.update(body)
    return h.hexdigest()


class IdempotentPostMixin:
    """Mix into an APIView (before it) so every POST honours `Idempotency-Key`."""

    _idempotency_record: Any = None

    def idempotent_body(self, data: Any, status_code: int) -> Any:
        """What the record keeps of an answer for replays: the answer itself, unless the
        view holds secrets in it (then it returns a copy without them)."""
        return data

    def idempotency_recorded(self, request: Request) -> bool:
        """Whether this mixin's records answer for `request` (a view whose service keeps
        the key itself, as `POST /jobs/` does on the job, says no: one layer per POST)."""
        return True

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # type: ignore[misc]
        self._idempotency_record = None
        if request.method != "POST" or not request.user.is_authenticated:
            return
        key = idempotency_key(request)
        if key is None or not self.idempotency_recorded(request):
            return
        fingerprint = _fingerprint(request)
        claim = idempotency_claim(user=request.user, key=key, fingerprint=fingerprint)
        if claim.replay is None:
            self._idempotency_record = claim.record
            return
        previous = claim.replay
        if previous.fingerprint != fingerprint:
            raise IdempotencyKeyReused(
                f"{HEADER} {key!r} was used for a different request; use a new key.")
        if previous.status_code is None:
            raise Conflict(f"A request with {HEADER} {key!r} is still in progress; retry later.")
        status = 200 if previous.status_code == 201 else previous.status_code
        raise _Replay(Response(previous.body, status=status,
                               headers={"Idempotent-Replayed": "true"}))

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, _Replay):
            return exc.response
        try:
            return super().handle_exception(exc)  # type: ignore[misc, no-any-return]
        except BaseException:
            # An unhandled error (a 500) never reaches finalize_response: free the key
            # here, or the client's retry would be refused as "still in progress".
            record, self._idempotency_record = self._idempotency_record, None
            if record is not None:
                idempotency_release(record=record)
            raise

    def finalize_response(self, request: Request, response: Response, *args: Any,
                          **kwargs: Any) -> Response:
        response = super().finalize_response(request, response, *args, **kwargs)  # type: ignore[misc]
        record, self._idempotency_record = self._idempotency_record, None
        if record is not None:
            if response.status_code >= 500 or response.status_code == 429:
                idempotency_release(record=record)
            else:
                idempotency_complete(
                    record=record, status_code=response.status_code,
                    body=self.idempotent_body(getattr(response, "data", None),
                                              response.status_code))
        return response
