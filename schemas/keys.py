"""The partition key (CONTRACT section 2): the one rule the gateway library, the models
and the processor share, so an event, its outcomes and its stored history always meet
on the same Kafka partition and the same Cassandra partition.

``conversation_id`` when the turn belongs to a Conversation; else the chain's root
(``chain_root_id``); a chain's first response is its own root, so without
``chain_root_id`` and without ``previous_response_id`` the key is its ``response_id``.
A continued chain (``previous_response_id`` set) without ``chain_root_id`` has no key:
its root, where its parent is stored, cannot be derived from the event.
"""

from __future__ import annotations

from typing import Protocol


class Keyed(Protocol):
    """What the rule reads; ``previous_response_id`` is optional (only turns carry it)."""

    conversation_id: str | None
    chain_root_id: str | None
    response_id: str


class MissingChainRoot(ValueError):
    """A continued chain event without ``chain_root_id``: its partition is unknown."""

    def __init__(self, response_id: str, previous_response_id: str) -> None:
        super().__init__(
            f"{response_id} continues {previous_response_id} without chain_root_id: "
            "the chain's partition (its first response's id) is unknown"
        )
        self.response_id = response_id
        self.previous_response_id = previous_response_id


def partition_key(event: Keyed) -> str:
    """The partition key of a gateway event or turn identity; raises ``MissingChainRoot``."""
    if event.conversation_id is not None:
        return event.conversation_id
    if event.chain_root_id is not None:
        return event.chain_root_id
    previous = getattr(event, "previous_response_id", None)
    if previous is not None:
        raise MissingChainRoot(event.response_id, previous)
    return event.response_id


def root_problem(event: Keyed) -> str | None:
    """Why a chain's first response (no Conversation, no ``previous_response_id``)
    names another chain root than itself, or None. Its children are keyed by its own
    ``response_id`` (the first response of their chain): stored under another root, its
    chain could never be continued, and its response id would be bound in a partition
    no retry of it names."""
    if event.conversation_id is not None or getattr(event, "previous_response_id", None):
        return None
    root = event.chain_root_id
    if root is None or root == event.response_id:
        return None
    return (f"chain_root_id {root!r} of a chain's first response (no previous_response_id) "
            f"must be null or its own response_id {event.response_id!r}")


def key_problem(event: Keyed, kafka_key: bytes | None) -> str | None:
    """Why a record's Kafka key is not its event's partition key (CONTRACT section 2:
    the key is the partition key as raw UTF-8 bytes), or None. The order the rules
    rely on (per partition key, in Kafka order) holds only then. An event whose key
    cannot be derived (``MissingChainRoot``) is None here: its own rule decides."""
    try:
        key = getattr(event, "partition_key", None)
        if not isinstance(key, str):
            key = partition_key(event)
    except MissingChainRoot:
        return None
    if kafka_key == key.encode():
        return None
    shown = kafka_key if kafka_key is None or len(kafka_key) <= 60 else kafka_key[:60] + b"..."
    return (f"Kafka key {shown!r} is not the event's partition key {key[:60]!r}: "
            "the key must be the partition key (CONTRACT section 2)")


# The request scope of every chain of a tenant (``request_scope``).
CHAINS_SCOPE = ""


def request_scope(event: Keyed) -> str:
    """Where an idempotency key names ONE request for the ledger's facts (tool effects,
    cancellations; docs/gateway-protocol.md, section 6): its Conversation, or, in chain
    mode, the tenant's chains together. A chain's first responses are each a partition
    of their own, and an effect or cancellation does not say whether it belongs to a
    first response or to a continuation (a cancellation's ``response_id`` is never
    compared), so chains cannot be told apart by partition: the same key in another
    Conversation is another request; in another chain, the same one for the ledger."""
    return event.conversation_id if event.conversation_id is not None else CHAINS_SCOPE
