"""What the processor's parts share: what handling one record gives (``Handled``), a
record's name in the log (``lane_name``), and the facts of a turn decided without
reading its request's (``NO_FACTS``). A module of its own so that every part imports
it and none imports the facade (``streams/processor.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from services.ledger.base import TurnFacts
from streams.records import Outbound, RawRecord

# No fact of the request read (the fast path): what the batch asserts with no mark.
NO_FACTS = TurnFacts(decision=None, effects=(), cancellation=None, conversation_owner=None)


def lane_name(record: RawRecord) -> str:
    return f"{record.topic}[{record.partition}]@{record.offset}"


@dataclass(frozen=True)
class Handled:
    """What handling one record produced: records to publish and a label for metrics."""

    outbound: tuple[Outbound, ...]
    kind: str  # promoted | rejected | dead_lettered | effect | cancel
