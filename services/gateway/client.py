"""Rehydration client: typed outcomes over the HTTP API (CONTRACT section 5).

A gateway about to run turn N+1 asks for the history it must render:

    with RehydrationClient("http://127.0.0.1:8080") as client:
        outcome = client.response_history(
            tenant, prev_id, my_fp_hash, wait_ms=2000, partition_key=conversation_id
        )
        match outcome:
            case Certified(): reuse outcome.checkpoint.token_artifact, render outcome.items
            case Fallback():  re-render outcome.items from scratch (no reuse)
            case Failure():   refuse or start over; outcome.reason says why

Expected answers (including 404/409/410/500 with a failure body) are outcomes;
only a broken transport or an unavailable service raises.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

from services.gateway.errors import (
    ClientClosed,
    InvalidRehydrationRequest,
    RehydrationServerError,
    RehydrationUnavailable,
)


@dataclass(frozen=True)
class HistoryItem:
    item_id: str
    type: str
    role: str | None
    call_id: str | None
    content: str  # canonical JSON text, byte-exact with what was certified
    content_digest: str
    format_version: int

    def parsed(self) -> Any:
        """The item as a Responses-style object."""
        return json.loads(self.content)


@dataclass(frozen=True)
class Checkpoint:
    seq: int
    fingerprint_hash: str
    expires_at: str | None
    token_artifact: dict[str, Any] | None
    router_receipt: dict[str, Any] | None
    boundary_proof: dict[str, Any] | None


@dataclass(frozen=True)
class Certified:
    response_id: str
    head_seq: int | None
    items: tuple[HistoryItem, ...]
    checkpoint: Checkpoint


@dataclass(frozen=True)
class Fallback:
    reason: str
    response_id: str
    head_seq: int | None
    items: tuple[HistoryItem, ...]


@dataclass(frozen=True)
class Failure:
    reason: str
    http_status: int
    response_id: str | None = None
    detail: str | None = None


Outcome = Certified | Fallback | Failure


# The states of ``/status`` (``services.api.models.StatusBody``); any other is refused
# as not the service's answer (``RehydrationUnavailable``).
STATUS_STATES = ("promoted", "rejected", "unknown")


@dataclass(frozen=True)
class Status:
    response_id: str
    state: str  # one of STATUS_STATES
    reason: str | None
    seq: int | None


class RehydrationClient:
    """Thin synchronous client; one ``httpx.Client`` (connection pool) per instance."""

    def __init__(
        self,
        base_url: str,
        timeout_s: float = 5.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(base_url=base_url, timeout=timeout_s, transport=transport)

    @property
    def base_url(self) -> str:
        """The service this client talks to (for the effect claims of the same API)."""
        return str(self._http.base_url)

    def __enter__(self) -> RehydrationClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the connection pool; a request after it is ``ClientClosed``."""
        self._http.close()

    def response_history(
        self,
        tenant_id: str,
        response_id: str,
        fingerprint_hash: str,
        wait_ms: int = 0,
        partition_key: str | None = None,
    ) -> Outcome:
        """``partition_key``: the response's partition key if the gateway knows it (its
        ``conversation_id``, else its chain's ``chain_root_id``): a hint that saves the
        service locating the response by its id (an unknown or wrong one costs a read,
        never a wrong answer)."""
        params: dict[str, Any] = {"tenant_id": tenant_id, "fingerprint_hash": fingerprint_hash}
        if wait_ms:
            params["wait_ms"] = wait_ms
        if partition_key is not None:
            params["partition_key"] = partition_key
        # The HTTP timeout must outlast the server-side wait.
        timeout = self._http.timeout.read or 5.0
        return self._history(
            f"/v1/responses/{response_id}/history", params, timeout + wait_ms / 1000
        )

    def conversation_history(
        self, tenant_id: str, conversation_id: str, fingerprint_hash: str
    ) -> Outcome:
        params = {"tenant_id": tenant_id, "fingerprint_hash": fingerprint_hash}
        return self._history(f"/v1/conversations/{conversation_id}/history", params, None)

    def status(self, tenant_id: str, response_id: str) -> Status:
        resp = self._get(f"/v1/responses/{response_id}/status", {"tenant_id": tenant_id}, None)
        if resp.status_code != 200:
            raise _unexpected(resp)
        body = answer_object(resp)
        try:
            state = _field(body, "state", str)
            if state not in STATUS_STATES:
                # Fail closed: a state the client does not know is not the service's
                # answer (before session 44 it was handed on as ``Status.state``).
                raise ValueError(f"state {state!r} is not one of {STATUS_STATES}")
            return Status(_field(body, "response_id", str), state,
                          _field(body, "reason", str, optional=True),
                          _field(body, "seq", int, optional=True))
        except (KeyError, TypeError, ValueError):
            raise not_the_service(resp) from None

    def _history(self, path: str, params: dict[str, Any], timeout: float | None) -> Outcome:
        resp = self._get(path, params, timeout)
        try:
            body = resp.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or "outcome" not in body:
            # A 200 that is not a history answer is not the service's (a proxy's page):
            # before session 43 it was ``InvalidRehydrationRequest`` ("do not retry").
            raise not_the_service(resp) if resp.status_code == 200 else _unexpected(resp)
        return parse_outcome(body, resp.status_code)

    def _get(self, path: str, params: dict[str, Any], timeout: float | None) -> httpx.Response:
        if self._http.is_closed:
            raise ClientClosed(f"{path}: the rehydration client is closed: create a new one")
        try:
            if timeout is None:
                return self._http.get(path, params=params)
            return self._http.get(path, params=params, timeout=timeout)
        except httpx.HTTPError as exc:
            raise RehydrationUnavailable(f"{path}: {exc!r}") from exc
        except RuntimeError:  # httpx's "the client has been closed": by another thread,
            if not self._http.is_closed:  # after the check above (session 45)
                raise
            raise ClientClosed(f"{path}: the rehydration client was closed: create a new "
                               "one") from None


def parse_outcome(body: dict[str, Any], http_status: int) -> Outcome:
    """Map a history body to its typed outcome (exposed for tests and other transports).

    A body that contradicts its HTTP status (a history with anything but 200, a failure
    with 200: CONTRACT 5) is not trusted: ``RehydrationUnavailable``, as for any answer
    that is not the service's; so is a body without the fields its outcome has (before
    session 43 a raw ``KeyError``)."""
    try:
        return _outcome(body, http_status)
    except (KeyError, TypeError, AttributeError) as exc:
        raise RehydrationUnavailable(f"HTTP {http_status}: the answer lacks a field of its "
                                     f"outcome ({type(exc).__name__}: {exc}): not the "
                                     "rehydration service's answer") from exc


def _outcome(body: dict[str, Any], http_status: int) -> Outcome:
    kind = body["outcome"]
    if (kind in ("certified", "fallback")) != (http_status == 200):
        raise RehydrationUnavailable(f"outcome {kind!r} with HTTP {http_status}")
    items: tuple[HistoryItem, ...] = ()
    if kind in ("certified", "fallback"):
        if not isinstance(body["items"], list):  # a history is a list, maybe empty
            raise TypeError(f"items is {type(body['items']).__name__}, not a list")
        items = tuple(_pick(HistoryItem, item) for item in body["items"])
    if kind == "certified":
        checkpoint = _pick(Checkpoint, body["checkpoint"])
        return Certified(_field(body, "response_id", str),
                         _field(body, "head_seq", int, optional=True), items, checkpoint)
    if kind == "fallback":
        return Fallback(_field(body, "reason", str), _field(body, "response_id", str),
                        _field(body, "head_seq", int, optional=True), items)
    if kind == "failure":
        return Failure(_field(body, "reason", str), http_status,
                       _field(body, "response_id", str, optional=True),
                       _field(body, "detail", str, optional=True))
    raise RehydrationUnavailable(f"unknown outcome {kind!r} (HTTP {http_status})")


def _pick(cls: type, data: dict[str, Any]) -> Any:
    """Build ``cls`` from the fields it knows: newer servers may add fields. A field
    the server always sends (its type is not ``X | None``) that is missing, null or of
    another type is ``KeyError`` / ``TypeError`` (so ``RehydrationUnavailable``: not the
    service's answer); before session 44 it became ``None``: an item without
    ``content``, a checkpoint without ``seq``."""
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__} is {type(data).__name__}, not an object")
    values = {}
    for name, spec in cls.__dataclass_fields__.items():
        value = data.get(name)
        kind, _, optional = str(spec.type).partition(" | ")
        if value is None:
            if not optional:
                raise KeyError(f"{cls.__name__}.{name}")
        elif not isinstance(value, _JSON_TYPES[kind.split("[")[0]]) or isinstance(value, bool):
            raise TypeError(f"{cls.__name__}.{name} is {type(value).__name__}, not {kind}")
        values[name] = value
    return cls(**values)


def _field(body: dict[str, Any], name: str, kind: type, *, optional: bool = False) -> Any:
    """``body[name]`` when it is a ``kind`` (or null and ``optional``), else ``KeyError``
    / ``TypeError``: not the service's answer (before session 44 a null ``reason`` or
    ``response_id`` was handed on as the outcome's)."""
    value = body.get(name)
    if value is None:
        if optional:
            return None
        raise KeyError(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"{name} is {type(value).__name__}, not {kind.__name__}")
    return value


# The JSON types of the answer's fields, by the name their annotation starts with.
_JSON_TYPES: dict[str, type] = {"str": str, "int": int, "dict": dict}


def answer_object(resp: httpx.Response) -> dict[str, Any]:
    """The JSON object of a 200 answer, else ``RehydrationUnavailable``."""
    try:
        body = resp.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise not_the_service(resp)
    return body


def not_the_service(resp: httpx.Response) -> RehydrationUnavailable:
    """A 2xx whose body is not the answer the API gives (a proxy's page, a truncated
    body): not the service's answer, so retry later, as for an unreachable service."""
    return RehydrationUnavailable(f"HTTP {resp.status_code} that is not the rehydration "
                                  f"service's answer: {resp.text[:200]!r}")


def server_error(resp: httpx.Response) -> Exception:
    """A 5xx answer's error: ``RehydrationServerError`` when its body says it is not
    transient (``"retryable": false``, ratchet's ``INTERNAL``, ``CORRUPT_HISTORY``
    and ``MISSING_HISTORY``),
    else ``RehydrationUnavailable`` (a 503, a proxy's page: retry later). Taken for a
    transient failure, a bug's answer was retried for ever (found by the chaos review,
    session 40)."""
    try:
        body = resp.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("retryable") is False \
            and isinstance(body.get("error"), str):
        return RehydrationServerError(resp.status_code, body["error"], body.get("detail"))
    return RehydrationUnavailable(f"HTTP {resp.status_code}: {resp.text[:200]}")


def _unexpected(resp: httpx.Response) -> Exception:
    if resp.status_code >= 500:
        return server_error(resp)
    if resp.status_code == 429:
        return RehydrationUnavailable(f"HTTP {resp.status_code}: {resp.text[:200]}")
    try:
        detail: object = resp.json()
    except ValueError:
        detail = resp.text[:200]
    return InvalidRehydrationRequest(resp.status_code, detail)
