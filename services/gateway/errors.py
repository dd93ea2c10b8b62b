"""Typed errors of the gateway library. Each says whether retrying can help."""

from __future__ import annotations

from schemas.keys import MissingChainRoot
from schemas.limits import MAX_EVENT_BYTES


class GatewayError(Exception):
    retryable: bool = False


class EventTooLarge(GatewayError):
    """The encoded event is above the protocol's maximum (``schemas/limits.py``); it was
    not produced. Not retryable: the same event is always too large."""

    def __init__(self, event_id: str, size: int) -> None:
        self.event_id = event_id
        self.size = size
        super().__init__(f"event {event_id} is {size} bytes, above the protocol maximum of "
                         f"{MAX_EVENT_BYTES} bytes: not produced")


class EventBeyondLimits(GatewayError):
    """A turn beyond the protocol's bounds on array items and map entries or on its
    items' arrays and objects, or an effect whose output is beyond the latter
    (``schemas/limits.py``) or whose ``tool_name`` (1 to 128 characters), ``call_id`` (1
    to 200) or ``arguments_digest`` (sha256 hex) is not (``ratchet.domain.bounds``); it
    was not produced (the processor would reject the turn
    ``UNSUPPORTED_FORMAT``, and dead-letter the effect). Also any event with a value
    outside its Avro type's range: an ``int`` beyond 32 bits, a ``long`` beyond 64, a
    timestamp outside years 1 to 9999 (the processor dead-letters it: no decision ever
    comes; session 48). Not retryable."""

    def __init__(self, event_id: str, detail: str) -> None:
        self.event_id = event_id
        self.detail = detail
        super().__init__(f"event {event_id}: {detail}: not produced")


class EventNotEncoded(GatewayError):
    """The event could not be encoded, so it was not produced: the schema registry did
    not answer (``retryable``: network, 5xx, a timeout), or its answer was not a schema
    of the event's subject (not registered: ratchet's worker registers them when it
    starts; or ``schema_registry_url`` is not a Confluent-compatible registry's, e.g.
    Apicurio's without ``/apis/ccompat/v7``), or the event does not fit its schema."""

    def __init__(self, event_id: str, detail: str, *, retryable: bool) -> None:
        self.event_id = event_id
        self.detail = detail
        self.retryable = retryable
        super().__init__(f"event {event_id} not encoded: {detail}: not produced "
                         + ("(the registry did not answer: retry)" if retryable else
                            "(is the schema registered, and is schema_registry_url a "
                            "Confluent-compatible registry?)"))


class ProducerMisconfigured(GatewayError, ValueError):
    """``GatewayProducer(config=...)`` overrides a setting the protocol's guarantees rest
    on (``enable.idempotence``, ``acks``, ``allow.auto.create.topics``,
    ``delivery.report.only.error``: ``producer.GUARANTEED``) with another value: no
    producer is made. Not retryable: drop the setting. Before session 44 it was taken:
    ``acks=1`` or idempotence off weakened every event's delivery silently."""


class EventNotQueued(GatewayError):
    """librdkafka refused to queue the event (``produce`` raised: e.g. after a fatal
    error of the idempotent producer, which then refuses every event): not produced.
    ``retryable`` when librdkafka says its error is retriable and not fatal; after a
    fatal one, close this producer and send with a new one (sending again is safe).
    confluent-kafka's untyped ``KafkaException`` before session 44.

    ``queued``: the ids of the events of the same call (``send_turn``: the turn's
    effects) handed to librdkafka before it, in order: they may still be written (their
    delivery is reported by ``flush`` as any event's; after a fatal error they fail
    there). ``not_queued``: this event and every later one of the call, never produced.
    A turn refused so is sent again whole, effects and all (since session 45 the error
    says which were queued; before, the caller had to guess)."""

    def __init__(self, event_id: str, detail: str, *, retryable: bool, fatal: bool,
                 queued: tuple[str, ...] = (), not_queued: tuple[str, ...] = ()) -> None:
        self.event_id = event_id
        self.detail = detail
        self.retryable = retryable
        self.fatal = fatal
        self.queued = tuple(queued)
        self.not_queued = tuple(not_queued) or (event_id,)
        super().__init__(
            f"event {event_id} not queued: {detail}: not produced"
            + (f"; queued before it: {', '.join(self.queued)}" if self.queued else "")
            + (f"; never produced: {', '.join(self.not_queued)}"
               if self.not_queued != (event_id,) else "")
            + ("; send the whole turn again, effects and all" if self.queued
               or len(self.not_queued) > 1 else "")
            + ("; the producer failed for good: close it and send with a new one"
               if fatal else ""))


class ProducerClosed(GatewayError):
    """``send`` once a ``close`` began (also one of another thread still waiting for
    the sends under way), or after the ``with`` block: nothing of the call was
    produced, and the message names its events.
    A signal handler's ``close`` inside a send of its own thread: the event named and
    the call's later ones not produced; the message names those queued before it
    (reported by that close): send the whole turn again with a new producer."""


class InvalidGatewayItem(GatewayError, ValueError):
    """A Responses item (a dict) the builders cannot turn into an ``Item``, or a call
    and output they cannot make an effect of: nothing built. Not retryable: the same
    item is always refused. A ``ValueError`` that was no ``GatewayError`` before
    session 44."""


class InvalidGatewayEvent(GatewayError, ValueError):
    """A builder's argument the event's schema refuses (``turn_completed``,
    ``tool_effect``, ``turn_cancelled``: pydantic's text says which field and why), or a
    ``TurnIdentity`` that is neither one Conversation nor one chain: nothing built. Not
    retryable: fix the argument. pydantic's ``ValidationError`` and a plain
    ``ValueError`` before session 44."""


class ClientClosed(GatewayError):
    """A request through a ``RehydrationClient`` or ``EffectClaims`` after its ``close``
    (or after its ``with`` block): nothing was sent. Create a new one. Before session 44
    httpx's untyped ``RuntimeError``."""


class UnservableId(GatewayError, ValueError):
    """An id of the event (tenant, response, Conversation, chain root, parent) does not
    match the HTTP API's id pattern (``schemas/ids.py``): the API could never serve the
    history, and the processor would reject the turn ``CORRUPT``. Not produced; not
    retryable."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"{detail}: not produced")


class EffectKeyedApart(GatewayError, ValueError):
    """``send_turn`` was given an effect whose partition key is not its turn's (built
    with another ``TurnIdentity``: another Conversation or chain). On another partition
    the turn's promotion would never see it (the turn ``MISSING_TOOL_EFFECT``). Nothing
    of the turn was produced; not retryable: build the effect with the turn's
    ``TurnIdentity``. A plain ``ValueError`` before session 44."""

    def __init__(self, effect_id: str, effect_key: str, turn_key: str) -> None:
        self.effect_id = effect_id
        self.effect_key = effect_key
        self.turn_key = turn_key
        super().__init__(f"effect {effect_id} is keyed {effect_key!r}, its turn "
                         f"{turn_key!r}: build it with the turn's TurnIdentity; nothing "
                         "of the turn produced")


class EffectOfAnotherTurn(GatewayError, ValueError):
    """``send_turn`` was given an effect of another request: its ``tenant_id``,
    ``idempotency_key``, ``response_id``, ``conversation_id`` or ``chain_root_id`` is
    not its turn's (``fields``: each such field, the effect's value and the turn's). The
    processor records an effect for the request its own fields name: the turn would not
    find it (``MISSING_TOOL_EFFECT``) and the other request would be given an effect it
    never ran. Nothing of the turn was produced; not retryable: build the effect with
    the turn's ``TurnIdentity`` and ``idempotency_key``. Before session 44 only the
    partition key was compared and such an effect was produced."""

    def __init__(self, effect_id: str, fields: list[tuple[str, object, object]]) -> None:
        self.effect_id = effect_id
        self.fields = fields
        apart = ", ".join(f"{name} {mine!r} (the turn's {theirs!r})"
                          for name, mine, theirs in fields)
        super().__init__(f"effect {effect_id} is of another request: {apart}; build it "
                         "with the turn's TurnIdentity and idempotency_key; nothing of "
                         "the turn produced")


class ChainRootUnknown(GatewayError, MissingChainRoot):
    """A continued chain's event (or ``TurnIdentity.chain``) without ``chain_root_id``:
    its partition, the chain's first response's id, cannot be derived, so it was not
    produced. Not retryable: pass ``chain_root_id`` (the root the parent's own events
    carried). Still a ``MissingChainRoot``; the producer let that untyped one out before
    session 44."""

    def __init__(self, response_id: str, previous_response_id: str) -> None:
        MissingChainRoot.__init__(self, response_id, previous_response_id)
        self.args = (f"{self.args[0]}: pass chain_root_id (the chain's first response's "
                     "id); not produced",)


class DeliveryError(GatewayError):
    """Kafka did not acknowledge an event; raised on ``flush`` (once per failed batch).
    ``pending``: events still in flight when it was raised (their fate is unknown yet,
    as with ``FlushTimeout``: an event not in ``failures`` is not known written unless
    ``pending`` is 0). ``forgotten``: failures reported since the calling thread's last
    flush that are no longer listed (the producer keeps at most ``MAX_KEPT_FAILURES``:
    a thread that flushes rarely); not retryable then, they cannot be named."""

    LISTED = 5  # failures its text names; ``failures`` holds them all

    def __init__(self, failures: list[tuple[str, str]], retryable: bool,
                 pending: int = 0, forgotten: int = 0) -> None:
        self.failures = failures  # (event_id, broker error text)
        self.retryable = retryable
        self.pending = pending
        self.forgotten = forgotten
        ids = ", ".join(f"{eid}: {err}" for eid, err in failures[:self.LISTED])
        more = (f" (+{len(failures) - self.LISTED} more)"
                if len(failures) > self.LISTED else "")
        flight = f"; {pending} event(s) still in flight" if pending else ""
        lost = (f"; {forgotten} earlier failure(s) no longer listed (the producer keeps "
                "the latest ones only: flush more often)" if forgotten else "")
        super().__init__(f"{len(failures) + forgotten} event(s) not delivered: "
                         f"{ids}{more}{lost}{flight}")


class FlushTimeout(GatewayError):
    """``flush`` returned with events still in flight; their fate is unknown yet."""

    retryable = True

    def __init__(self, pending: int) -> None:
        self.pending = pending
        super().__init__(f"{pending} event(s) still in flight after flush timeout")


class RehydrationUnavailable(GatewayError):
    """The rehydration service could not answer (network, 503): retry later."""

    retryable = True


class RehydrationServerError(GatewayError):
    """The service answered 5xx with a body saying it is not transient (``"retryable":
    false``): ``INTERNAL`` (a bug: report it), ``CORRUPT_HISTORY`` (``/status`` of a
    damaged history) or ``MISSING_HISTORY`` (``/status`` of a promoted turn whose row is
    gone). Not retryable: the same request gets the same answer; retry at
    most by hand, with backoff (docs/gateway-protocol.md section 8). A 5xx without such
    a body (a proxy's, a 503 ``UNAVAILABLE``) is ``RehydrationUnavailable``."""

    def __init__(self, status: int, error: str, detail: object) -> None:
        self.status = status
        self.error = error
        self.detail = detail
        super().__init__(f"HTTP {status}: {error}: {detail}")


class InvalidRehydrationRequest(GatewayError):
    """The service refused the request as malformed (4xx other than the typed outcomes)."""

    def __init__(self, status: int, detail: object) -> None:
        self.status = status
        self.detail = detail
        super().__init__(f"HTTP {status}: {detail}")
