"""Claim before execute, for gateways: run a side-effecting tool at most once per
logical request, even when the request is retried with regenerated call ids.

    with EffectClaims(base_url, identity, idempotency_key=key, attempt=2,
                      producer=producer, policies={"send_email": AT_MOST_ONCE}) as claims:
        with claims.effect(call, subturn_index=0) as effect:
            effect.run(lambda: send_email(**json.loads(call["arguments"])))
        effect.output      # the function_call_output answering THIS call (maybe reused)
        effect.effect_id   # list it in the turn's subturn / tool_effect_ids

``run`` executes the function only when the claim says so (CLAIMED), records the
outcome (the synchronous complete call, then a ``ToolEffect`` through the producer, if
one is given, with the claim's effect id), and otherwise reuses the recorded output
(COMPLETED), waits for a live holder (IN_PROGRESS), or raises a typed error:
``EffectOutcomeUnknown`` (LEASE_EXPIRED under ``at_most_once``), ``EffectConflict``,
``RequestCancelled``, ``RequestPromoted`` (another attempt's turn was promoted),
``EffectOutputUnusable``. The rules are the server's
(``ratchet/domain/claims.py``). Leaving the ``with`` block closes the claims: an
outcome whose completion failed is sent once more, a claim still held without an
outcome is never released, and is reported (``ClaimsLeftOpen``).
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import httpx

from ratchet.domain.catalogue import CATALOGUE, Kind
from ratchet.domain.claims import EffectPolicy, effect_id_for_claim, rekey_output
from schemas.items import from_responses
from schemas.models import Item, ToolEffect
from services.gateway.client import answer_object, not_the_service, server_error
from services.gateway.errors import (
    ClientClosed,
    GatewayError,
    InvalidRehydrationRequest,
    RehydrationServerError,
    RehydrationUnavailable,
)
from services.gateway.events import (
    InvalidGatewayItem,
    TurnIdentity,
    arguments_digest_of,
    tool_effect,
    tool_name_of,
)
from services.gateway.producer import GatewayProducer

__all__ = ["ClaimTakenOver", "ClaimsLeftOpen", "ClientClosed", "Effect", "EffectClaims",
           "EffectConflict", "EffectOutcomeUnknown", "EffectOutputUnrecordable",
           "EffectOutputUnusable", "EffectPolicy", "RequestCancelled", "RequestPromoted",
           "StillInProgress"]


class EffectOutcomeUnknown(GatewayError):
    """LEASE_EXPIRED under ``at_most_once``: an earlier attempt claimed this effect and
    vanished without recording an outcome; it may or may not have run. Not executed.
    Also raised by ``run`` for an effect whose function this very attempt started and
    that was interrupted by a ``BaseException`` (a cancellation, a timeout of a
    green-thread library, ``KeyboardInterrupt``): it may have run, so it never runs
    again, and no outcome was recorded."""

    def __init__(self, effect_id: str, attempt: int | None, detail: str) -> None:
        self.effect_id, self.attempt = effect_id, attempt
        super().__init__(f"{effect_id}: {detail}")


class EffectConflict(GatewayError):
    """The effect key was claimed with other arguments (the retry asks something else)."""


class EffectOutputUnusable(GatewayError, ValueError):
    """COMPLETED, but the recorded output cannot answer this call: its content is not a
    JSON object with a canonical form (e.g. a number beyond a double's range, recorded by
    a server from before the claims API refused such outputs). Not executed again; not
    retryable: every attempt of the request is given the same output."""

    def __init__(self, effect_id: str, detail: str) -> None:
        self.effect_id = effect_id
        super().__init__(f"{effect_id}: {detail}")


class RequestCancelled(GatewayError):
    """The request was cancelled: no new effects may start."""


class RequestPromoted(GatewayError):
    """PROMOTED: the request's key already stands promoted as ``response_id`` (another
    attempt's turn) with ``request_digest``. Not executed: no turn of this attempt can
    be promoted any more. The same digest as this request's: stop the attempt and
    answer the client with that response (its history); another: the key was used for
    another request (what the turn would be rejected as: IDEMPOTENCY_KEY_REUSED)."""

    def __init__(self, effect_id: str, response_id: str, request_digest: str,
                 detail: str) -> None:
        self.effect_id, self.response_id = effect_id, response_id
        self.request_digest = request_digest
        super().__init__(f"{effect_id}: {detail}")


class EffectOutputUnrecordable(GatewayError, ValueError):
    """The tool ran, but what it returned cannot be an output item (not a ``str``, or a
    ``str`` that is not valid Unicode, e.g. a lone surrogate from ``os.fsdecode``), or
    the API refuses it (422: e.g. larger than a claim can store). The claim is completed
    as ``failed`` with this error as its output; ``run`` again returns that failed
    outcome and never runs the tool again. Not retryable."""

    def __init__(self, effect_id: str, detail: str) -> None:
        self.effect_id = effect_id
        super().__init__(f"{effect_id}: {detail}")


class ClaimTakenOver(GatewayError):
    """This holder's lease ran out and another attempt took the claim over: its
    completion was refused (``NOT_HOLDER``), so its own run's outcome is not the
    effect's. Retryable: ``run`` again claims again and returns the outcome the claim
    records (``COMPLETED``), waits while the taker holds it (``StillInProgress``), or
    raises ``EffectOutcomeUnknown``."""

    retryable = True

    def __init__(self, effect_id: str) -> None:
        self.effect_id = effect_id
        super().__init__(f"{effect_id}: the claim was taken over by another attempt; "
                         "this run's outcome was not recorded")


class ClaimsLeftOpen(GatewayError):
    """``close`` (also leaving ``with EffectClaims(...)``) found claims this attempt may
    still hold with no outcome recorded; they are not released (the API has no release,
    and a lease whose tool may have run must never be freed for another attempt to run
    it): each stays held until its lease ends, then an ``at_most_once`` effect answers
    every later attempt ``LEASE_EXPIRED`` (``EffectOutcomeUnknown``: never run again)
    and an ``at_least_once`` one is taken over (it may run twice). ``unrecorded``: the
    tool ran and its completion did not get through, not even the one re-sent by
    ``close``; ``interrupted``: the tool was started and interrupted (it may have run);
    ``unanswered``: the claim call's answer was lost (it may hold the claim; the tool
    never ran). Not retryable: the holders' tokens go with this object."""

    def __init__(self, unrecorded: list[str], interrupted: list[str],
                 unanswered: list[str]) -> None:
        self.unrecorded, self.interrupted = unrecorded, interrupted
        self.unanswered = unanswered
        # ToolEffects of completed claims the producer refused (``ToolEffectsNotProduced``,
        # noted on this error when claims are left open too).
        self.unsent: list[ToolEffect] = []
        parts = [f"{label}: {', '.join(ids)}" for label, ids in (
            ("ran, outcome not recorded", unrecorded),
            ("interrupted, may have run", interrupted),
            ("claim answer lost, never run", unanswered)) if ids]
        super().__init__("claims left open, held until their leases end (at_most_once: "
                         "LEASE_EXPIRED to later attempts; at_least_once: taken over): "
                         + "; ".join(parts))


class ToolEffectsNotProduced(GatewayError):
    """``close`` (also leaving ``with EffectClaims(...)``) found effects whose claim was
    completed (the outcome is recorded: the turn can use it) but whose ``ToolEffect``
    the producer refused (``ProducerClosed``, ``EventNotQueued``, ``EventNotEncoded``),
    again when ``close`` sent it once more. ``effects``: those ``ToolEffect`` events,
    built: send them with the turn (``producer.send_turn(turn, [*effects, ...])``, with
    a new producer if this one is closed or failed for good). Retryable. Before session
    44 ``close`` dropped them without a word."""

    retryable = True

    def __init__(self, effects: list[ToolEffect]) -> None:
        self.effects = effects
        super().__init__(
            "claims completed whose ToolEffect was not produced: "
            + ", ".join(e.effect_id for e in effects)
            + "; send these ToolEffects (.effects) with the turn (producer.send_turn)")


class StillInProgress(GatewayError):
    """Another live attempt held the effect for longer than ``max_wait_s``."""

    retryable = True


class Effect:
    """One call's effect inside ``EffectClaims.effect``."""

    def __init__(self, owner: EffectClaims, call: Mapping[str, Any], subturn_index: int,
                 occurrence: int) -> None:
        entry = CATALOGUE.get(str(call.get("type")))
        if entry is None or entry.kind is not Kind.CALL or "call_id" not in call:
            # The helper records a text output item answering the call by call_id; a
            # self-contained executed item (mcp_call) carries its own result: record it
            # with a ToolEffect (services.gateway.events.tool_effect) instead.
            raise InvalidGatewayItem(
                f"claims.effect needs a call answered by an output item (function, custom "
                f"tool, computer, local shell, shell, apply patch), not {call.get('type')!r}")
        self._owner = owner
        self.call = call
        self.output_type = entry.output_type  # the item type that answers this call
        self.call_id = str(call["call_id"])
        self.tool_name = tool_name_of(call)
        self.subturn_index = subturn_index
        self.occurrence = occurrence
        self.effect_id = effect_id_for_claim(owner.idempotency_key, subturn_index,
                                             self.tool_name, occurrence)
        self.token = uuid.uuid4().hex
        self.output: Item | None = None
        # An outcome whose completion did not get through: sent again (same token) by
        # the next ``run`` instead of running the tool again.
        self._unrecorded: tuple[Item, bool] | None = None
        self.executed = False  # True only if THIS attempt ran the function
        self.state: str | None = None
        # The vanished attempt whose expired lease this one took over (``at_least_once``:
        # the tool may have run twice), else None.
        self.previous_attempt: int | None = None
        # The function was started and neither returned nor raised an ``Exception``:
        # it may have run, its outcome is unknown, it is never started again.
        self._interrupted = False
        # The last claim call got no answer of the service (lost, 5xx, interrupted): it
        # may have written the claim, held by this token; the function never started.
        self._unanswered = False
        # The completion of ``_unrecorded`` landed (its ``ToolEffect`` did not go).
        self._completion_landed = False
        # The ``ToolEffect`` of a landed completion, while the producer has not taken it.
        self._unsent: ToolEffect | None = None

    def run(self, fn: Callable[[], str]) -> Item:
        """Claim, then run ``fn`` (returning the tool's output text) only if CLAIMED."""
        if self.output is not None:
            return self.output
        if self._unrecorded is not None:
            return self._record(*self._unrecorded)
        if self._interrupted:
            raise EffectOutcomeUnknown(self.effect_id, self._owner.attempt, (
                "this attempt's run of the tool was interrupted and recorded no outcome: "
                "it may have run, so it is not run again"))
        self._unanswered = True
        try:
            body = self._owner._claim(self)
        except GatewayError as exc:  # a typed answer wrote no claim of this token
            self._unanswered = isinstance(exc, RehydrationUnavailable | RehydrationServerError)
            raise
        self._unanswered = False
        self.state = body["state"]
        self.previous_attempt = body.get("previous_attempt")
        if body["state"] == "COMPLETED":
            recorded = _item(body["output"])
            try:
                self.output = rekey_output(recorded, call_id=self.call_id,
                                           item_id=f"{self.effect_id}:{self._owner.attempt}")
            except ValueError as exc:
                raise EffectOutputUnusable(self.effect_id, str(exc)) from exc
            return self.output
        self._interrupted = True  # until fn returns or raises an Exception
        try:
            text = fn()
        except Exception as exc:  # recorded as failed, then re-raised
            self._interrupted = False
            self._record(self._output(f"error: {type(exc).__name__}: {exc}"), False)
            raise
        self._interrupted = False
        self.executed = True
        try:
            output = self._output(text)
        except (TypeError, ValueError) as exc:
            # The tool ran: its outcome is recorded (failed) before anything is raised,
            # so that a retry finds it and never runs the tool a second time.
            return self._unrecordable(f"the tool's output cannot be recorded "
                                      f"({type(exc).__name__})", exc)
        try:
            return self._record(output, True)
        except InvalidRehydrationRequest as exc:
            if exc.status != 422:
                raise
            # The API refuses this output for good (e.g. larger than a claim can store):
            # resending it would be refused for ever, and the claim would stay open
            # until another attempt took it over and ran the tool again.
            self._unrecorded = None
            return self._unrecordable(f"the API refused the tool's output: {exc}", exc)

    def _unrecordable(self, detail: str, cause: Exception) -> Item:
        self._record(self._output(f"error: {detail[:1000]}"), False)
        raise EffectOutputUnrecordable(self.effect_id, detail) from cause

    def _output(self, text: str) -> Item:
        output = {"type": self.output_type, "call_id": self.call_id, "output": text,
                  "id": f"{self.effect_id}:{self._owner.attempt}"}
        return from_responses(output, item_id=output["id"])

    def _record(self, output: Item, succeeded: bool) -> Item:
        """Complete the claim with the outcome; the output is this effect's only once
        that got through (a retryable failure keeps it for the next ``run``)."""
        self._unrecorded = (output, succeeded)
        self._completion_landed = False
        try:
            self._owner._complete(self, output, succeeded)
        except InvalidRehydrationRequest as exc:
            if exc.status == 409 and _error_of(exc) == "NOT_HOLDER":
                self._unrecorded = None  # never recordable: claim again on the next run
                raise ClaimTakenOver(self.effect_id) from exc
            raise
        self._unrecorded = None
        self.output = output
        return output


class EffectClaims:
    """The claims of one attempt of one logical request (not thread-safe: one loop).

    ``with EffectClaims(...) as claims:`` closes it on leaving (``close``): a claim it
    may still hold with no outcome recorded is never released, and is reported
    (``ClaimsLeftOpen``). The producer it was given is the caller's: not closed."""

    def __init__(self, base_url: str, identity: TurnIdentity, *, idempotency_key: str,
                 attempt: int, producer: GatewayProducer | None = None,
                 policies: Mapping[str, EffectPolicy] | None = None,
                 default_policy: EffectPolicy = EffectPolicy.AT_MOST_ONCE,
                 lease_ms: int = 30_000, max_wait_s: float = 60.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.identity = identity
        self.idempotency_key = idempotency_key
        self.attempt = attempt
        self._producer = producer
        self._policies = dict(policies or {})
        self._default = default_policy
        self._lease_ms = lease_ms
        self._max_wait_s = max_wait_s
        self._seen: Counter[tuple[int, str]] = Counter()
        # Each call's effect, by (subturn, call id): a call entered again (a retry after
        # StillInProgress or a lost answer) keeps its occurrence, key and token.
        self._effects: dict[tuple[int, str], Effect] = {}
        self._http = httpx.Client(base_url=base_url, timeout=10.0, transport=transport)

    def __enter__(self) -> EffectClaims:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        """``close``; when the block is already raising, its error is the one to see,
        and what ``close`` raises is added to it as a note."""
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except GatewayError as left:
            exc.add_note(f"on leaving the EffectClaims block: {left}")

    def close(self) -> None:
        """Re-send, once, each completion that did not get through (the tool ran: its
        outcome is recorded with its token, as ``run`` would), release the HTTP session,
        then raise ``ClaimsLeftOpen`` if a claim may still be held with no outcome
        recorded: a tool that ran and whose completion failed again, a tool interrupted
        (it may have run), a claim call whose answer was lost. None is released or
        completed for it (nothing is reported done that was not, and no lease whose
        tool may have run is freed for another attempt): each lease runs out. A claim
        completed whose ``ToolEffect`` the producer refused (in ``run`` or in this
        re-send) is sent once more; if refused again, ``close`` raises
        ``ToolEffectsNotProduced`` carrying the events to send with the turn (when claims
        are left open too, ``ClaimsLeftOpen`` is raised, with them in its ``unsent`` and
        a note). A request after ``close`` is ``ClientClosed``. Idempotent."""
        if self._http.is_closed:
            return
        try:
            for effect in self._effects.values():
                if effect._unrecorded is not None and not effect._completion_landed:
                    with contextlib.suppress(GatewayError):
                        effect._record(*effect._unrecorded)
                elif effect._unsent is not None and self._producer is not None:
                    # Completed, its ToolEffect refused (by an earlier run): once more.
                    with contextlib.suppress(GatewayError):
                        self._producer.send(effect._unsent)
                        effect._unsent = None
        finally:
            self._http.close()
        effects = self._effects.values()
        unrecorded = [e.effect_id for e in effects
                      if e._unrecorded is not None and not e._completion_landed]
        interrupted = [e.effect_id for e in effects if e._interrupted]
        unanswered = [e.effect_id for e in effects if e._unanswered]
        unsent = [e._unsent for e in effects if e._unsent is not None]
        if unrecorded or interrupted or unanswered:
            left = ClaimsLeftOpen(unrecorded, interrupted, unanswered)
            if unsent:
                left.add_note(str(ToolEffectsNotProduced(unsent)))
            left.unsent = unsent
            raise left
        if unsent:
            raise ToolEffectsNotProduced(unsent)

    def policy(self, tool_name: str) -> EffectPolicy:
        return self._policies.get(tool_name, self._default)

    @contextmanager
    def effect(self, call: Mapping[str, Any], *, subturn_index: int,
               occurrence: int | None = None) -> Iterator[Effect]:
        """The effect of ``call`` (a Responses call item); ``occurrence`` defaults to the
        count of earlier calls of the same tool in this subturn. The same call entered
        again is the same effect (its occurrence, key and token)."""
        if not isinstance(call, Mapping):
            raise InvalidGatewayItem(f"call is a Responses call item dict, not "
                                     f"{type(call).__name__}")
        seen = self._effects.get((subturn_index, str(call.get("call_id"))))
        if seen is not None and occurrence in (None, seen.occurrence):
            yield seen
            return
        name = tool_name_of(call)
        if occurrence is None:
            occurrence = self._seen[(subturn_index, name)]
        self._seen[(subturn_index, name)] += 1
        effect = Effect(self, call, subturn_index, occurrence)
        self._effects[(subturn_index, effect.call_id)] = effect
        yield effect

    # -- HTTP -------------------------------------------------------------------------------
    def _claim(self, effect: Effect) -> dict[str, Any]:
        """The claim's answer once it is CLAIMED or COMPLETED (else a typed error). An
        answer without the fields its state has is not the service's: it is never run on
        (``RehydrationUnavailable``; re-sent with the same token by the next ``run``)."""
        try:
            return self._claim_answer(effect)
        except (KeyError, TypeError, AttributeError) as exc:
            raise RehydrationUnavailable(
                f"{effect.effect_id}: the claim's answer lacks a field of its state "
                f"({type(exc).__name__}: {exc}): not the service's answer") from exc

    def _claim_answer(self, effect: Effect) -> dict[str, Any]:
        deadline = time.monotonic() + self._max_wait_s
        while True:
            body = self._post("/v1/effects/claims", {
                **self._partition(),
                "tenant_id": self.identity.tenant_id, "idempotency_key": self.idempotency_key,
                "attempt": self.attempt, "subturn_index": effect.subturn_index,
                "tool_name": effect.tool_name, "occurrence": effect.occurrence,
                "arguments_digest": arguments_digest_of(effect.call),
                "call_id": effect.call_id, "token": effect.token,
                "lease_ms": self._lease_ms, "policy": self.policy(effect.tool_name).value,
                "effect_id": effect.effect_id, "response_id": self.identity.response_id})
            state = body["state"]
            if state == "COMPLETED":
                try:
                    _item(body["output"])  # an output that is not an item: not the service's
                except ValueError as exc:  # pydantic's ValidationError: a field's type
                    raise RehydrationUnavailable(
                        f"{effect.effect_id}: the claim's recorded output is not an item "
                        f"({type(exc).__name__}): not the service's answer") from exc
            if state in ("CLAIMED", "COMPLETED"):
                return body
            if state == "IN_PROGRESS":
                if time.monotonic() + body["wait_ms"] / 1000 > deadline:
                    raise StillInProgress(f"{effect.effect_id}: held by attempt "
                                          f"{body['attempt']}")
                time.sleep(max(body["wait_ms"], 10) / 1000)
                continue
            if state == "LEASE_EXPIRED":
                raise EffectOutcomeUnknown(effect.effect_id, body.get("attempt"),
                                           body.get("detail", ""))
            if state == "CONFLICT":
                raise EffectConflict(f"{effect.effect_id}: {body.get('detail', '')}")
            if state == "PROMOTED":
                raise RequestPromoted(effect.effect_id, body["existing_response_id"],
                                      body["existing_request_digest"],
                                      body.get("detail", ""))
            # CANCELLED, and any state this library does not know: never execute
            raise RequestCancelled(f"{effect.effect_id}: {body.get('detail', '')}")

    def _complete(self, effect: Effect, output: Item, succeeded: bool) -> None:
        self._post(f"/v1/effects/claims/{effect.effect_id}/complete", {
            **self._partition(),
            "tenant_id": self.identity.tenant_id, "idempotency_key": self.idempotency_key,
            "token": effect.token, "status": "succeeded" if succeeded else "failed",
            "output": {"item_id": output.item_id, "type": output.type, "role": output.role,
                       "call_id": output.call_id, "content": output.content.decode("utf-8"),
                       "content_digest": output.content_digest,
                       "format_version": output.format_version}})
        effect._completion_landed = True
        if self._producer is not None:
            effect._unsent = tool_effect(
                self.identity, idempotency_key=self.idempotency_key,
                subturn_index=effect.subturn_index, call=effect.call,
                output=json.loads(output.content), attempt=self.attempt,
                succeeded=succeeded, effect_id=effect.effect_id)
            self._producer.send(effect._unsent)
            effect._unsent = None

    def _partition(self) -> dict[str, str]:
        """The request's history partition (its turns' Kafka key)."""
        key = self.identity.conversation_id or self.identity.chain_root_id
        assert key is not None  # TurnIdentity holds exactly one of them
        return {"partition_key": key}

    def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        if self._http.is_closed:
            raise ClientClosed(f"{path}: the EffectClaims is closed: nothing sent; create "
                               "a new one")
        try:
            resp = self._http.post(path, json=payload)
        except httpx.HTTPError as exc:
            raise RehydrationUnavailable(f"{path}: {exc!r}") from exc
        if resp.status_code >= 500:
            raise server_error(resp)
        if resp.status_code != 200:
            raise InvalidRehydrationRequest(resp.status_code, resp.text[:500])
        body = answer_object(resp)
        if not isinstance(body.get("state"), str):
            raise not_the_service(resp)
        return body


def _error_of(exc: InvalidRehydrationRequest) -> str | None:
    """The ``error`` code of a refused request's JSON body, if it has one."""
    try:
        body = json.loads(str(exc.detail))
    except ValueError:
        return None
    return body.get("error") if isinstance(body, dict) else None


def _item(body: Mapping[str, Any]) -> Item:
    content = body["content"].encode("utf-8")
    return Item(item_id=body["item_id"], type=body["type"], role=body.get("role"),
                call_id=body.get("call_id"), content=content,
                content_digest=body["content_digest"],
                format_version=body.get("format_version", 1))
