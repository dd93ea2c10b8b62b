"""The FastAPI application: routes, parameter validation, typed errors, OpenAPI.

Routes only translate HTTP to ``RehydrationService`` calls and back; every rule is
in the domain. Malformed input never reaches the domain: FastAPI validates the
parameters against the constraints below (published in ``/openapi.json``) and the
handlers here turn any validation error into a typed 422 ``ErrorBody``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Annotated, Literal

from fastapi import APIRouter, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ratchet.metric_children import child
from ratchet.settings import Settings
from schemas.ids import ID_PATTERN
from services.api import metrics
from services.api.answer_budget import AnswersBusy
from services.api.body_limit import BodyBudget, BodyLimit
from services.api.models import ErrorBody, HealthBody, HistoryBody, StatusBody
from services.api.service import WAIT_MS_CAP, Answer, RehydrationService
from services.api.slow_readers import PartsResponse
from services.ledger.base import LedgerUnavailable
from services.store.base import CorruptPartition, StoreUnavailable, TurnLost

log = logging.getLogger("ratchet.api")

# Ids are opaque strings chosen by gateways; ID_PATTERN (schemas/ids.py) bounds them so a
# request line stays small. The processor rejects a turn whose ids it refuses (CORRUPT).
SHA256_PATTERN = r"^[0-9a-f]{64}$"
_ID, _SHA256 = ID_PATTERN, SHA256_PATTERN

TenantId = Annotated[str, Query(pattern=_ID, description="Tenant that owns the history.")]
FingerprintHash = Annotated[
    str,
    Query(pattern=_SHA256, description="The caller's execution fingerprint hash (sha256 hex)."),
]
WaitMs = Annotated[
    int,
    Query(
        ge=0,
        le=WAIT_MS_CAP,
        description="Wait up to this long for a pending promotion (read-your-writes).",
    ),
]

PartitionHint = Annotated[
    str | None,
    Query(
        pattern=_ID,
        description="Optional hint: the response's partition key (its `conversation_id`, "
        "else its chain's `chain_root_id`, else its own id). Saves locating the response "
        "by its id; never trusted (a response not found there is located as without it).",
    ),
]

CacheControl = Annotated[
    str | None,
    Header(
        description="`no-cache`: do not answer from the API's verified-history cache; "
        "read and verify the whole history from the store (a cached history was verified "
        "when it was loaded and is immutable; see docs/service.md).",
    ),
]

_HISTORY_RESPONSES = {
    404: {"model": HistoryBody, "description": "failure NOT_FOUND (also another tenant's id)"},
    409: {"model": HistoryBody, "description": "failure NOT_PROMOTED"},
    410: {"model": HistoryBody, "description": "failure EXPIRED"},
    422: {"model": ErrorBody, "description": "malformed request"},
    # A history body for an integrity failure; ErrorBody ``INTERNAL`` for a bug.
    500: {"model": HistoryBody | ErrorBody,
          "description": "integrity failure (a history body: CORRUPT_HISTORY, ...), or "
                         "{\"error\": \"INTERNAL\"} for an error of the service itself"},
    503: {"model": ErrorBody, "description": "store unavailable, or the answer budget "
                                             "full; retry"},
}
# The Conversation endpoint never answers NOT_PROMOTED (a Conversation has a head or
# is NOT_FOUND): its spec does not list 409 (an outside review, session 38).
_CONVERSATION_RESPONSES = {code: answer for code, answer in _HISTORY_RESPONSES.items()
                           if code != 409}


# The largest request body read (the effect-claims calls are the only bodies). A
# completion's output content holds up to 8 MiB of UTF-8 (services/api/claims.py); as a
# JSON string from an encoder that escapes every non-ASCII character (Python's default),
# a 2- or 4-byte character takes 6 or 12 bytes: at most 3 x 8 MiB. 32 MiB admits every
# valid completion however it is escaped, and bounds what a client can make the server
# hold and parse before the content rules are judged. RATCHET_API_MAX_BODY_BYTES.
MAX_BODY_BYTES = Settings.api_max_body_bytes


def create_app(service: RehydrationService, notifier_up: Callable[[], bool],
               routers: Sequence[APIRouter] = (),
               on_start: Callable[[], None] | None = None,
               max_body_bytes: int = MAX_BODY_BYTES,
               body_budget_bytes: int | None = None) -> FastAPI:
    """``routers``: route modules of their own (the effect claims, services/api/claims.py).
    ``on_start``: called on the serving event loop before the first request.
    ``max_body_bytes``: a larger body is refused with 413 ``INVALID_REQUEST``
    (body_limit.py: a ``Content-Length`` above it unread, a chunked body as soon as it
    passes it). ``body_budget_bytes``: the bytes of large bodies read or handled at once
    (body_limit.py, ``BodyBudget``; None: no bound)."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if on_start is not None:
            on_start()
        yield

    app = FastAPI(
        lifespan=lifespan,
        title="ratchet rehydration service",
        version="1",
        description="Complete certified histories, typed fallbacks and typed failures "
        "(CONTRACT section 5). Item `content` is the canonical JSON text, byte-exact.",
        # A path with a trailing slash is an unknown path (a typed 404), not Starlette's
        # 307 to a Location built from the client's Host header.
        redirect_slashes=False,
    )
    budget = None if body_budget_bytes is None else BodyBudget(body_budget_bytes)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes, budget=budget)
    _install_error_handlers(app)
    for router in routers:
        app.include_router(router)

    @app.get(
        "/v1/conversations/{conversation_id}/history",
        response_model=HistoryBody,
        response_model_exclude_none=False,
        responses=_CONVERSATION_RESPONSES,
        summary="Rehydrate a Conversation up to its head",
    )
    async def conversation_history(
        conversation_id: Annotated[str, Path(pattern=_ID)],
        tenant_id: TenantId,
        fingerprint_hash: FingerprintHash,
        cache_control: CacheControl = None,
    ) -> Response:
        answer = await service.conversation_history(
            tenant_id, conversation_id, fingerprint_hash, use_cache=use_cache(cache_control)
        )
        return history_response(answer)

    @app.get(
        "/v1/responses/{response_id}/history",
        response_model=HistoryBody,
        responses=_HISTORY_RESPONSES,
        summary="Rehydrate the history ending with a response",
    )
    async def response_history(
        response_id: Annotated[str, Path(pattern=_ID)],
        tenant_id: TenantId,
        fingerprint_hash: FingerprintHash,
        wait_ms: WaitMs = 0,
        partition_key: PartitionHint = None,
        cache_control: CacheControl = None,
    ) -> Response:
        with child(metrics.REQUEST_SECONDS, "response").time():
            answer = await service.response_history(
                tenant_id,
                response_id,
                fingerprint_hash,
                wait_ms,
                use_cache=use_cache(cache_control),
                partition_key=partition_key,
            )
        return history_response(answer)

    @app.get(
        "/v1/responses/{response_id}/status",
        response_model=StatusBody,
        responses={422: {"model": ErrorBody},
                   500: {"model": ErrorBody, "description": "CORRUPT_HISTORY: the response's "
                         "checkpoint row is damaged, or its Conversation's head (no "
                         "checkpoint backs it, or it is behind the response); "
                         "MISSING_HISTORY: the response was promoted and its turn row is "
                         "gone; INTERNAL: "
                         "an error of the service itself"},
                   503: {"model": ErrorBody}},
        summary="Was a response promoted, rejected (and why), or is it unknown?",
    )
    async def response_status(
        response_id: Annotated[str, Path(pattern=_ID)], tenant_id: TenantId
    ) -> StatusBody:
        return await run_in_threadpool(service.status, tenant_id, response_id)

    @app.get(
        "/healthz",
        response_model=HealthBody,
        responses={503: {"model": HealthBody}},
        summary="Liveness (probe=live) or readiness (probe=ready, the default: the store "
                "answers); any other probe is a typed 422",
    )
    async def healthz(probe: Literal["live", "ready"] | None = None) -> Response:
        notifier = notifier_up()
        if probe == "live":  # the process answers; the store is not read (store: null)
            return _json(HealthBody(status="ok", store=None, notifier=notifier), 200)
        store = await run_in_threadpool(service.store_ok)
        # A down notifier only slows wait_ms (to its deadline read): degraded, still ready.
        status = "ok" if store and notifier else "degraded"
        return _json(
            HealthBody(status=status, store=store, notifier=notifier), 200 if store else 503
        )

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response)
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app


def use_cache(cache_control: str | None) -> bool:
    """False for a ``Cache-Control`` with ``no-cache`` or ``no-store``."""
    if not cache_control:
        return True
    directives = {d.strip().lower() for d in cache_control.split(",")}
    return not directives & {"no-cache", "no-store"}


def history_response(answer: Answer) -> Response:
    # The body is already JSON (rendered once per verified history, see render.py), sent
    # in slices so a client that does not read holds little (slow_readers.py).
    return PartsResponse(answer.parts, answer.status_code, held=answer.held)


def _json(body: HealthBody | StatusBody, status_code: int) -> Response:
    # pydantic's own serializer: one pass, no intermediate dicts (100-item histories).
    return Response(body.model_dump_json(), status_code=status_code, media_type="application/json")


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        detail = [
            {"loc": list(err.get("loc", ())), "msg": err.get("msg", ""), "type": err.get("type")}
            for err in exc.errors()
        ]
        return _error(422, ErrorBody(error="INVALID_REQUEST", detail=detail))

    @app.exception_handler(StoreUnavailable)
    @app.exception_handler(LedgerUnavailable)
    @app.exception_handler(CorruptPartition)
    @app.exception_handler(Exception)
    async def service_error(_: Request, exc: Exception) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # 404 for unknown paths, 405 for wrong methods, 413 for a body above the limit
        # (body_limit.py): typed like every other error.
        return _error(exc.status_code, ErrorBody(error="INVALID_REQUEST", detail=exc.detail))


def error_response(exc: Exception) -> JSONResponse:
    """The answer to an exception out of the service: 503 when the store or the ledger
    is unavailable (retry), 500 ``CORRUPT_HISTORY`` for a damaged row, 500
    ``MISSING_HISTORY`` for a promoted turn's row that is gone, else 500 (a bug:
    typed, logged with its traceback)."""
    if isinstance(exc, StoreUnavailable):
        child(metrics.STORE_ERRORS, "any").inc()
        return _error(503, ErrorBody(error="UNAVAILABLE", detail=str(exc), retryable=exc.retryable))
    if isinstance(exc, LedgerUnavailable):
        child(metrics.STORE_ERRORS, "ledger").inc()
        return _error(503, ErrorBody(error="UNAVAILABLE", detail=str(exc), retryable=True))
    if isinstance(exc, AnswersBusy):  # the answer budget had no room (answer_budget.py)
        return _error(503, ErrorBody(error="UNAVAILABLE", detail=str(exc), retryable=True))
    if isinstance(exc, TurnLost):  # a promoted turn's row is gone (the status endpoint)
        log.error("lost turn row: %s", exc)
        return _error(500, ErrorBody(error="MISSING_HISTORY", detail=str(exc)))
    # A damaged row: the status endpoint's read, or a claim's request claim (claims.py).
    if isinstance(exc, CorruptPartition):
        log.error("damaged row: %s", exc)
        return _error(500, ErrorBody(error="CORRUPT_HISTORY", detail=str(exc)))
    log.error("unhandled error", exc_info=exc)
    return _error(500, ErrorBody(error="INTERNAL", detail=type(exc).__name__))


def _error(status_code: int, body: ErrorBody) -> JSONResponse:
    return JSONResponse(body.model_dump(mode="json"), status_code=status_code)
