"""A small REST client: one JSON error shape in, one `ApiError` with a one-line reason out."""

from __future__ import annotations

import time
import uuid
from typing import Any, Protocol

import requests


class ApiError(Exception):
    def __init__(self, message: str, *, status: int = 0, code: str = "error") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


class Transport(Protocol):
    """What the client needs from HTTP (requests.Session; tests plug in Django's client)."""

    def request(self, method: str, url: str, **kwargs: Any) -> Any: ...


def api_base(url: str) -> str:
    """The API's root from a server URL, which may already end in /api/v1 (with or
    without a slash): `https://fq.example.org/` and `https://fq.example.org/api/v1/`
    both give `https://fq.example.org/api/v1`."""
    url = url.strip().rstrip("/")
    if url.endswith("/api/v1"):
        url = url[: -len("/api/v1")]
    return url + "/api/v1"


class Client:
    def __init__(self, url: str, token: str, *, transport: Transport | None = None,
                 timeout: float = 30.0) -> None:
        self.base = api_base(url)
        self.timeout = timeout
        self.http: Any = transport or requests.Session()
        self.headers = {"Authorization": f"Token {token}", "Accept": "application/json",
                        "User-Agent": "fairq-cli/0.1"}

    def request(self, method: str, path: str, *, json: Any = None,
                params: dict[str, Any] | list[tuple[str, Any]] | None = None,
                retries: int = 0) -> Any:
        """The decoded JSON answer. POSTs carry a fresh Idempotency-Key, so retrying one
        after a lost connection or a 5xx cannot submit twice."""
        url = path if path.startswith("http") else f"{self.base}{path}"
        headers = dict(self.headers)
        if method == "POST":
            headers["Idempotency-Key"] = str(uuid.uuid4())
        for attempt in range(retries + 1):
            try:
                r = self.http.request(method, url, json=json, params=params, headers=headers,
                                      timeout=self.timeout)
            except requests.RequestException as exc:
                if attempt < retries:
                    time.sleep(0.5 * 2**attempt)
                    continue
                raise ApiError(f"cannot reach {self.base}: {exc.__class__.__name__}",
                               code="unreachable") from exc
            if r.status_code >= 500 and attempt < retries:
                time.sleep(0.5 * 2**attempt)
                continue
            return _decode(r)
        raise AssertionError("unreachable")  # pragma: no cover

    def fetch(self, path: str, *, params: dict[str, Any] | list[tuple[str, Any]] | None = None,
              timeout: float | None = None) -> tuple[int, Any, dict[str, str]]:
        """One GET as (status, decoded JSON or None, headers), a 304 included: for the
        watch (a long poll answers 304 when nothing changed). ApiError for a 4xx or 5xx
        (`status` set) and for a server not reached (`code` "unreachable")."""
        url = path if path.startswith("http") else f"{self.base}{path}"
        try:
            r = self.http.request("GET", url, json=None, params=params,
                                  headers=dict(self.headers), timeout=timeout or self.timeout)
        except requests.RequestException as exc:
            raise ApiError(f"cannot reach {self.base}: {exc.__class__.__name__}",
                           code="unreachable") from exc
        headers = {k.lower(): v for k, v in dict(getattr(r, "headers", None) or {}).items()}
        if r.status_code == 304:
            return 304, None, headers
        return r.status_code, _decode(r), headers

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, json=body, retries=2)

    def pages(self, path: str, params: list[tuple[str, Any]], limit: int) -> list[dict[str, Any]]:
        """Follow cursor pages until `limit` items."""
        out: list[dict[str, Any]] = []
        page = self.request("GET", path, params=params)
        while True:
            out.extend(page["results"])
            if len(out) >= limit or not page.get("next"):
                return out[:limit]
            page = self.request("GET", page["next"])


def _decode(r: Any) -> Any:
    if r.status_code == 204:
        return None
    try:
        body = r.json()
    except ValueError:
        body = None
    if r.status_code >= 400:
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            e = body["error"]
            message = str(e.get("message", "")).rstrip(".")
            fields = e.get("fields") or {}
            if fields:
                message += ": " + "; ".join(f"{k}: {' '.join(v)}" for k, v in fields.items())
            raise ApiError(message, status=r.status_code, code=str(e.get("code", "error")))
        raise ApiError(f"HTTP {r.status_code} from the server", status=r.status_code)
    return body
