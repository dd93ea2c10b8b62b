"""Claim before execute over HTTP: ``POST /v1/effects/claims`` and
``POST /v1/effects/claims/{effect_id}/complete`` (docs/service.md, "Effect claims").

A route module of its own: it only translates HTTP to the ledger's claim methods and
back; the rules are in ``ratchet/domain/claims.py``. Every claim outcome is a 200 with
a typed ``state``; 4xx only for bad input (400 a body that is not JSON, 413 a body above
the API's limit (body_limit.py), 415 a body declared another type than JSON, 422
malformed, 404 unknown claim, 409 not the holder / another outcome already recorded);
503 the store or ledger unavailable, 500 ``CORRUPT_HISTORY`` a damaged request claim
(``mark_claim``) or an effect claim row with a null cell (``claims.claim_damage``),
typed by the app's handlers (services/api/app.py).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from ratchet.domain import claims
from ratchet.domain.bounds import container_problem
from ratchet.domain.catalogue import EFFECT_OUTPUT_TYPES, shape_problem
from ratchet.domain.claims import (
    EFFECT_ID_PATTERN,
    LEASE_MS_MAX,
    LEASE_MS_MIN,
    Answer,
    ClaimRecord,
    ClaimRequest,
    ClaimState,
    CompletionState,
    EffectPolicy,
)
from ratchet.domain.plan import IdempotencyRecord
from schemas.canonical import parse_json
from schemas.ids import ID_PATTERN
from schemas.limits import MIB
from schemas.models import SUPPORTED_FORMAT_VERSIONS, Item, sha256_hex
from services.api.models import ErrorBody, HistoryItem
from services.ledger.base import Ledger
from services.store.base import CheckpointStore, CorruptPartition

_ID = ID_PATTERN  # schemas/ids.py: the ids of the history routes and of turns
_NAME = r"^[A-Za-z0-9_.:\-]{1,128}$"
_SHA256 = r"^[0-9a-f]{64}$"
# A recorded output's content: at most 8 MiB of UTF-8 (bytes, not characters), so that a
# turn carrying it stays within the event limit (schemas/limits.py).
MAX_OUTPUT_CONTENT_BYTES = 8 * MIB
# The claim keeps the output's content as a JSON string (claims.output_to_json), where
# each '"', '\\' and control character (a newline between JSON tokens) takes two bytes
# or more: content made of them nearly doubles,
# past Cassandra's largest mutation (half a 32 MiB commit log segment). The stored form
# is bounded so that a completion is refused at once (422), never retried against a
# write that can never succeed (found by an outside review, session 25).
MAX_STORED_OUTPUT_BYTES = 12 * MIB


def _json_integer(value: object) -> object:
    """A JSON Schema integer (``3`` or ``3.0``), never ``true`` or ``"3"``, which
    pydantic's lax mode would turn into one (schemathesis' negative cases found it)."""
    if isinstance(value, bool | str | bytes):
        raise ValueError("must be a JSON integer")
    return value


JsonInt = Annotated[int, BeforeValidator(_json_integer)]


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _InPartition(_Body):
    partition_key: str = Field(pattern=_ID, description=(
        "The history partition of the request's turns: their Kafka key (CONTRACT "
        "section 2: the conversation_id, else the chain_root_id, else, for a chain's "
        "first response, its own response_id). The claim marks the "
        "request's facts there, so the promotion of a turn of the request sees it."))


class ClaimIn(_InPartition):
    tenant_id: str = Field(pattern=_ID)
    idempotency_key: str = Field(pattern=_ID, description="The logical request's key.")
    attempt: JsonInt = Field(ge=1, le=1_000_000)
    subturn_index: JsonInt = Field(ge=0, le=10_000)
    tool_name: str = Field(pattern=_NAME)
    occurrence: JsonInt = Field(ge=0, le=10_000, description="The n-th call of this tool in "
                            "this subturn, from 0 (model output order).")
    arguments_digest: str = Field(pattern=_SHA256, description="sha256 hex of the "
                                  "canonical JSON arguments.")
    call_id: str = Field(pattern=_ID, description="This attempt's call id (not in the key).")
    token: str = Field(pattern=_ID, description="Unique per claimant (a UUID); re-send the "
                       "same token to repeat a claim call whose answer was lost.")
    lease_ms: JsonInt = Field(ge=LEASE_MS_MIN, le=LEASE_MS_MAX)
    policy: EffectPolicy
    effect_id: str | None = Field(None, pattern=EFFECT_ID_PATTERN, description="Optional: "
                                  "the key the caller computed; refused if it differs.")
    response_id: str | None = Field(None, pattern=_ID, description=(
        "Optional: this attempt's response id. For a chain's first response "
        "(partition_key equal to it) the claim also learns a promotion of the request "
        "under another response id (PROMOTED); without it only partition_key's "
        "partition is looked at."))


class OutputIn(_Body):
    item_id: str = Field(pattern=_ID)
    type: str = Field(pattern=_NAME)
    role: str | None = Field(None, max_length=64)
    call_id: str | None = Field(None, pattern=_ID)
    # max_length counts characters: a cheap first bound (a character is 1 to 4 bytes);
    # the limit itself is on the UTF-8 bytes (``_output_item``).
    content: str = Field(max_length=MAX_OUTPUT_CONTENT_BYTES, description=(
        "Canonical JSON text, at most 8 MiB (8388608 bytes) of UTF-8."))
    content_digest: str = Field(pattern=_SHA256)
    format_version: JsonInt = Field(1, ge=1, le=1000)


class CompleteIn(_InPartition):
    tenant_id: str = Field(pattern=_ID)
    idempotency_key: str = Field(pattern=_ID)
    token: str = Field(pattern=_ID)
    status: Literal["succeeded", "failed"]
    output: OutputIn


class ClaimErrorBody(_Body):
    """A refused completion: no such claim (also another tenant's), not the holder, or
    another outcome already recorded by the holder."""

    error: Literal["UNKNOWN_CLAIM", "NOT_HOLDER", "OUTCOME_CONFLICT", "EFFECT_KEY_MISMATCH"]
    detail: str = ""


class ClaimBody(_Body):
    state: Literal["CLAIMED", "COMPLETED", "IN_PROGRESS", "LEASE_EXPIRED", "CONFLICT",
                   "CANCELLED", "PROMOTED", "ALREADY_COMPLETED"]
    effect_id: str
    attempt: int | None = Field(None, description="The attempt holding (or that held) it.")
    lease_until: int | None = Field(None, description="Lease end, epoch millis.")
    wait_ms: int | None = Field(None, description="IN_PROGRESS: wait this long, then claim "
                                "again.")
    previous_attempt: int | None = Field(None, description="CLAIMED by taking over the "
                                         "expired lease of this attempt.")
    existing_response_id: str | None = Field(None, description="PROMOTED: the response "
                                             "the request stands promoted as.")
    existing_request_digest: str | None = Field(None, description=(
        "PROMOTED: the request_digest of the promoted request; another than yours: the "
        "key was used for another request (IDEMPOTENCY_KEY_REUSED)."))
    status: Literal["succeeded", "failed"] | None = None
    output: HistoryItem | None = Field(None, description="COMPLETED: the recorded output "
                                       "(re-key it to the new call id before use).")
    detail: str = ""


def _body(state: str, effect_id: str, claim: ClaimRecord | None, **extra) -> ClaimBody:
    out = None if claim is None or claim.output is None else claim.output
    return ClaimBody(
        state=state, effect_id=effect_id,
        attempt=None if claim is None else claim.attempt,
        lease_until=None if claim is None or claim.completed else claim.lease_until,
        status=None if claim is None else claim.status,
        output=None if out is None else HistoryItem(
            item_id=out.item_id, type=out.type, role=out.role, call_id=out.call_id,
            content=out.content.decode("utf-8"), content_digest=out.content_digest,
            format_version=out.format_version),
        **extra)


def _error(status: int, error: str, detail: str) -> JSONResponse:
    body = ErrorBody(error=error, detail=detail) if error == "INVALID_REQUEST" \
        else ClaimErrorBody(error=error, detail=detail)
    return JSONResponse(body.model_dump(mode="json"), status_code=status)


_COMPLETE_HTTP = {
    CompletionState.UNKNOWN_CLAIM: 404,
    CompletionState.NOT_HOLDER: 409,
    CompletionState.OUTCOME_CONFLICT: 409,
}


class _ClaimsRoute(APIRoute):
    """A body that is not JSON, or none at all, is a 400 ``INVALID_REQUEST``
    (docs/gateway-protocol.md, section 8), not the 422 FastAPI answers; so is a body
    FastAPI cannot read at all (its own 400). Other validation errors stay 422s. Here,
    not in the app's handlers, so the routes answer the same wherever they are mounted."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                errors = exc.errors()
                declared = request.headers.get("content-type")
                if declared is not None and not _is_json(declared):
                    return _error(415, "INVALID_REQUEST", f"Content-Type {declared!r} is "
                                  "not JSON: send application/json (or no Content-Type)")
                if any(e.get("type") == "missing" and tuple(e.get("loc", ())) == ("body",)
                       for e in errors):
                    return _error(400, "INVALID_REQUEST", "body is empty: a JSON object "
                                  "is expected")
                not_json = [e for e in errors if e.get("type") == "json_invalid"]
                if not not_json:
                    raise
                where = not_json[0].get("loc", ())[1:]
                why = not_json[0].get("ctx", {}).get("error", "")
                return _error(400, "INVALID_REQUEST", f"body is not JSON: {why}"
                              + (f" at character {where[0]}" if where else ""))
            except HTTPException as exc:
                if exc.status_code != 400:
                    raise
                return _error(400, "INVALID_REQUEST", _unreadable_body(await request.body())
                              or str(exc.detail))

        return route


def _is_json(content_type: str) -> bool:
    """``application/json`` or ``application/<anything>+json``, parameters aside (as
    FastAPI reads a body as JSON)."""
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/")
                                          and kind.endswith("+json"))


def _unreadable_body(body: bytes) -> str | None:
    """Why and where a body FastAPI could not read is not UTF-8, or None."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"body is not UTF-8: {exc.reason} at byte {exc.start}"
    return None


# The answers after which a holder may run the tool, now or after waiting: a request
# found promoted after the claim's write is answered PROMOTED instead (``mark_claim``).
_MAY_RUN = frozenset({ClaimState.CLAIMED, ClaimState.IN_PROGRESS, ClaimState.LEASE_EXPIRED})


def claims_router(ledger: Ledger, store: CheckpointStore,
                  clock_ms: Callable[[], int] | None = None) -> APIRouter:
    """``store``'s request facts marks, in the request's history partition (a claim
    and its outcome are facts a promotion of the request must see): its
    ``mark_request_facts`` around every write (``_marked``), after it as every fact
    writer does, and also before it, because a gateway whose call failed may never
    send it again (the processor's writers get that from Kafka's redelivery). Around a
    claim both marks are ``mark_claim``, which says whether the request stands
    promoted (``_claimed``)."""
    now = clock_ms or (lambda: time.time_ns() // 1_000_000)
    mark_facts = store.mark_request_facts

    async def _marked(body: _InPartition, write: Callable[..., Any], *args: Any) -> Any:
        mark = (mark_facts, body.tenant_id, body.partition_key, body.idempotency_key)
        await run_in_threadpool(*mark)
        try:
            return await run_in_threadpool(write, *args)
        finally:
            # Also after a write that failed: its outcome may be unknown (landed, the
            # answer lost), and a promotion that read the facts since the first mark
            # asserts that mark (the 503's gateway may never send the call again).
            await run_in_threadpool(*mark)

    async def _claimed(body: ClaimIn,
                       request: ClaimRequest) -> Answer | IdempotencyRecord:
        """The claim's answer, or the record of the promotion its request stands with.

        Before the claim is written: a request that stands promoted writes no claim
        (nothing would use a run; a claim written would be published for compensation,
        and a takeover would lock out a holder still running). After it, for an answer
        that lets the holder run the tool: a promotion that landed between the two is
        learnt too. Both marks are conditional, in one Paxos round with the promotion
        batch (``CheckpointStore.mark_claim``), so either the promotion sees the claim
        or the claim is answered PROMOTED."""
        mark = functools.partial(store.mark_claim, body.tenant_id, body.partition_key,
                                 body.idempotency_key,
                                 first_of_chain=body.response_id == body.partition_key)
        promoted = await run_in_threadpool(mark)
        if promoted is not None:
            return promoted
        try:
            answer: Answer = await run_in_threadpool(ledger.claim_effect, request, now())
        except Exception:
            # The claim's outcome may be unknown (``_marked``): the facts are marked
            # after it all the same, then the failure answered (503).
            await run_in_threadpool(mark_facts, body.tenant_id, body.partition_key,
                                    body.idempotency_key)
            raise
        if answer.state not in _MAY_RUN:
            await run_in_threadpool(mark_facts, body.tenant_id, body.partition_key,
                                    body.idempotency_key)
            return answer
        return await run_in_threadpool(mark) or answer

    # A body without a Content-Type is read as JSON (Java's HttpClient sends none by
    # default); one declared as another type is a 415 (``_ClaimsRoute``).
    router = APIRouter(tags=["effect claims"], route_class=_ClaimsRoute,
                       strict_content_type=False)
    # The refusals of a body itself, on both endpoints (gateway-protocol.md section 8).
    body_refused = {
        400: {"model": ErrorBody, "description": "body is not JSON (or not UTF-8)"},
        413: {"model": ErrorBody, "description": "body larger than "
              "RATCHET_API_MAX_BODY_BYTES (32 MiB by default), refused unread"},
        415: {"model": ErrorBody, "description": "body declared as another type than "
              "JSON"},
        422: {"model": ErrorBody}, 503: {"model": ErrorBody}}

    @router.post(
        "/v1/effects/claims",
        response_model=ClaimBody,
        responses={**body_refused,
                   409: {"model": ClaimErrorBody, "description": "EFFECT_KEY_MISMATCH: "
                         "the effect_id given is not the key of the parts given"},
                   # A damaged request claim (``check_request_claim``, met by
                   # ``mark_claim``): the app's handler types it (session 52).
                   500: {"model": ErrorBody, "description": "CORRUPT_HISTORY (not "
                         "retryable): the request's claim row is damaged (a chain's first "
                         "request), or the effect's claim row has a null cell: do not "
                         "execute, report it; INTERNAL: a bug"}},
        summary="Claim a tool effect before executing it",
    )
    async def claim(body: ClaimIn) -> JSONResponse:
        effect_id = claims.effect_id_for_claim(body.idempotency_key, body.subturn_index,
                                               body.tool_name, body.occurrence)
        if body.effect_id is not None and body.effect_id != effect_id:
            return _error(409, "EFFECT_KEY_MISMATCH", f"effect_id {body.effect_id} is not the "
                          f"key of these parts ({effect_id})")
        request = ClaimRequest(
            body.tenant_id, body.idempotency_key, effect_id, body.attempt, body.subturn_index,
            body.call_id, body.tool_name, body.arguments_digest, body.token, body.lease_ms,
            body.policy)
        answer = await _claimed(body, request)
        if isinstance(answer, IdempotencyRecord):
            # No claim's fields: nobody holds the effect for a promoted request.
            out = _body(ClaimState.PROMOTED.value, effect_id, None,
                        existing_response_id=answer.response_id,
                        existing_request_digest=answer.request_digest, detail=(
                            f"request {body.idempotency_key} stands promoted as response "
                            f"{answer.response_id}: do not run the tool"))
        else:
            if answer.claim is not None:
                _check_whole(answer.claim)
            out = _body(answer.state.value, effect_id, answer.claim, wait_ms=answer.wait_ms,
                        previous_attempt=answer.previous_attempt, detail=answer.detail)
        return JSONResponse(out.model_dump(mode="json"))

    @router.post(
        "/v1/effects/claims/{effect_id}/complete",
        response_model=ClaimBody,
        responses={**body_refused,
                   500: {"model": ErrorBody, "description": "CORRUPT_HISTORY (not "
                         "retryable): the effect's claim row has a null cell, report it; "
                         "INTERNAL: a bug"},
                   404: {"model": ClaimErrorBody, "description": "UNKNOWN_CLAIM"},
                   409: {"model": ClaimErrorBody,
                         "description": "NOT_HOLDER, OUTCOME_CONFLICT"}},
        summary="Record the outcome of a claimed effect (the holder's token only)",
    )
    async def complete(effect_id: Annotated[str, Path(pattern=EFFECT_ID_PATTERN)],
                       body: CompleteIn) -> JSONResponse:
        # An unknown claim (also another tenant's) is told before the output is judged.
        held = await run_in_threadpool(ledger.claim, body.tenant_id, body.idempotency_key,
                                       effect_id)
        if held is None:
            return _error(404, "UNKNOWN_CLAIM", f"effect {effect_id}")
        _check_whole(held)
        # Judging an output parses it (twice, with the duplicate-key check): 1.95 s for
        # an 8 MiB one, a review found, on the event loop every request shares. A large
        # one is judged on a worker thread; a small one costs less than the hop.
        if len(body.output.content) > _JUDGED_INLINE_BYTES:
            output, problem = await run_in_threadpool(_output_item, body.output)
        else:
            output, problem = _output_item(body.output)
        if problem is not None:
            return _error(422, "INVALID_REQUEST", problem)
        state, claim = await _marked(
            body, ledger.complete_claim, body.tenant_id, body.idempotency_key, effect_id,
            body.token, body.status, output, now())
        if claim is not None:
            _check_whole(claim)  # damaged since the read above: never answered by it
        if state in _COMPLETE_HTTP:
            return _error(_COMPLETE_HTTP[state], state.value, f"effect {effect_id}")
        return JSONResponse(_body(state.value, effect_id, claim).model_dump(mode="json"))

    return router


_JUDGED_INLINE_BYTES = 64 * 1024


def _check_whole(claim: ClaimRecord) -> None:
    """A stored claim with a null cell (``claims.claim_damage``) is damage: the app's
    500 ``CORRUPT_HISTORY`` (not retryable), never an answer the row does not hold."""
    problem = claims.claim_damage(claim)
    if problem is not None:
        raise CorruptPartition(problem)


def _output_item(o: OutputIn) -> tuple[Item, str | None]:
    """The output as an Item, or why it cannot be recorded (fail closed: a recorded
    output is replayed to later attempts, so it must be one a turn could carry)."""
    data = o.content.encode("utf-8")
    item = Item(item_id=o.item_id, type=o.type, role=o.role, call_id=o.call_id, content=data,
                content_digest=o.content_digest, format_version=o.format_version)
    if len(data) > MAX_OUTPUT_CONTENT_BYTES:
        return item, (f"content is {len(data)} bytes of UTF-8, above the limit of "
                      f"{MAX_OUTPUT_CONTENT_BYTES} (8 MiB)")
    # The stored form exactly (not an estimate: JSON's whitespace between tokens, \n \r
    # \t, is escaped too; an outside review found an estimate that missed it).
    stored = len(claims.output_to_json(item).encode("utf-8"))
    if stored > MAX_STORED_OUTPUT_BYTES:
        return item, (f"output is {stored} bytes as the claim stores it (its content as a "
                      "JSON string: each '\"', '\\' and control character escaped), above "
                      f"the limit of {MAX_STORED_OUTPUT_BYTES} (12 MiB)")
    if o.type not in EFFECT_OUTPUT_TYPES:
        return item, f"output type {o.type!r} is not a tool output type"
    if o.format_version not in SUPPORTED_FORMAT_VERSIONS:
        # Every turn carrying it would be UNSUPPORTED_FORMAT: the request could never
        # be promoted with the outcome its claim replays.
        return item, (f"format_version {o.format_version} is not supported "
                      f"({sorted(SUPPORTED_FORMAT_VERSIONS)})")
    if sha256_hex(data) != o.content_digest:
        return item, "content_digest is not the sha256 of content"
    problem = container_problem((item,))  # before parsing: every turn carrying it would
    if problem is not None:               # be UNSUPPORTED_FORMAT, like the format above
        return item, problem
    try:
        parse_json(data)  # named here: the shape check says only "not a JSON object"
    except ValueError as exc:
        return item, f"content is not valid JSON: {exc}"
    return item, shape_problem(item)
