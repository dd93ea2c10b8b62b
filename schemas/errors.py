"""Typed errors of the bottom layer: the retryable ``Unavailable`` base, and serialization.

* ``Unavailable``: a dependency (the store, the ledger, the schema registry) could not
  be reached or did not answer in time. The base every backend's "down" error
  subclasses (``StoreUnavailable``, ``LedgerUnavailable``, ``RegistryUnavailable``), so
  the processor retries one type. It lives here because ``schemas`` is the bottom layer:
  every adapter can import it without importing another adapter.

Serialization errors say where they happened and whether a retry helps:

* ``DecodeError``: the record itself is bad (bad magic byte, truncated, unknown schema
  id, schema mismatch, ...). Retrying cannot help: route it to the dead-letters topic
  (``schemas.avro.dead_letter_for``) and continue with the next offset.
* ``RegistryUnavailable``: the schema registry could not be asked. The record may be
  fine: do NOT dead-letter it; retry with backoff and keep the offset uncommitted.
* ``EncodeError``: an event could not be encoded (not registered, invalid data). A bug
  or a deployment mistake in the producer, never a property of the data in Kafka.
"""

from __future__ import annotations

from schemas.models import DeadLetterReason


class Unavailable(Exception):
    """A dependency could not be reached or timed out; the same call may succeed later.

    ``retryable`` is False only where the subclass knows better (a missing schema:
    retrying the same call cannot help, an operator must act).
    """

    retryable: bool = True
    # What was unavailable, as the worker's log says it ("the store (Cassandra)").
    dependency: str = "a dependency"


class SerdeError(Exception):
    """Base of the errors of ``schemas.avro``."""

    retryable: bool = False


class DecodeError(SerdeError):
    """A Kafka record that can never be decoded into a ratchet event."""

    def __init__(
        self,
        reason: DeadLetterReason,
        message: str,
        *,
        topic: str,
        partition: int,
        offset: int,
        schema_id: int | None = None,
    ) -> None:
        super().__init__(f"{reason.value} at {topic}[{partition}]@{offset}: {message}")
        self.reason = reason
        self.message = message
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.schema_id = schema_id


class TooManyElements(DecodeError):
    """A gateway event holding more array items and map entries than
    ``schemas.limits.MAX_EVENT_ELEMENTS``: ``INVALID_EVENT`` as a dead letter, unless
    ``turn`` is set: a ``TurnCompleted``'s fields read without its arrays, for the
    processor to reject it ``UNSUPPORTED_FORMAT`` like a turn above the size limit."""

    def __init__(self, message: str, *, turn: object | None, topic: str, partition: int,
                 offset: int, schema_id: int | None = None) -> None:
        super().__init__(DeadLetterReason.INVALID_EVENT, message, topic=topic,
                         partition=partition, offset=offset, schema_id=schema_id)
        self.turn = turn


class RegistryUnavailable(SerdeError, Unavailable):
    """The schema registry did not answer (network, 5xx): retry, do not dead-letter."""

    retryable = True
    dependency = "the schema registry"


class EncodeError(SerdeError):
    """An event could not be serialized (schema not registered, or data invalid)."""

    def __init__(self, record: str, message: str) -> None:
        super().__init__(f"cannot encode {record}: {message}")
        self.record = record
