"""Typed serialization errors. Each says where it happened and whether a retry helps.

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


class RegistryUnavailable(SerdeError):
    """The schema registry did not answer (network, 5xx): retry, do not dead-letter."""

    retryable = True


class EncodeError(SerdeError):
    """An event could not be serialized (schema not registered, or data invalid)."""

    def __init__(self, record: str, message: str) -> None:
        super().__init__(f"cannot encode {record}: {message}")
        self.record = record
