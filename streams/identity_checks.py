"""What the processor checks of a decoded event's identity before anything else: that
its outcome record can quote its ids (``unquotable_field``: else it is parked), that
its ids and Kafka key are usable (``identity_problem``: else ``CORRUPT``, or parked for
an effect or a cancellation), and whether a turn is a chain's first response, whose
attempts are each their own partition (``_first_of_chain``)."""

from __future__ import annotations

from schemas.ids import KEY_ID_FIELDS, SERVED_ID_FIELDS, unservable_id
from schemas.keys import key_problem, root_problem
from schemas.models import TurnCompleted

# The most characters of ids and digest, together, that a turn's outcome record may
# repeat. An id is at most 200 characters (schemas/ids.py) and a longer one is CORRUPT,
# quoted in the rejection; but one of megabytes made a rejection over its topic's limit,
# the partition key repeated four times (three fields and the record's key): the publish
# failed for ever and the partition stopped (an outside review, session 26). A turn past
# this is parked instead; at most 4 MiB of a record's 16 MiB can be its ids then.
MAX_QUOTED_CHARS = 1024 * 1024
QUOTED_FIELDS = (*SERVED_ID_FIELDS, *KEY_ID_FIELDS, "request_digest")


def unquotable_field(event: object) -> str | None:
    """Why ``event``'s outcome record could not carry its ids, or None."""
    lengths = {name: len(value) for name in QUOTED_FIELDS
               if isinstance(value := getattr(event, name, None), str)}
    if sum(lengths.values()) <= MAX_QUOTED_CHARS:
        return None
    longest = max(lengths, key=lengths.__getitem__)
    return (f"{longest} of {lengths[longest]} characters: an outcome record could not "
            f"carry it (ids are at most 200 characters, a request digest 64)")


def identity_problem(event: object, kafka_key: bytes | None) -> str | None:
    """Why an event's identity is unusable, or None: an id outside the API's pattern
    (``schemas/ids.py``), a chain's first response naming another root, a Kafka key
    that is not its partition key (``schemas/keys.py``)."""
    problem = unservable_id(event)
    if problem is None and isinstance(event, TurnCompleted):
        problem = root_problem(event)
    return problem or key_problem(event, kafka_key)  # type: ignore[arg-type]


def _first_of_chain(turn: TurnCompleted) -> bool:
    """A chain's first response: each attempt of its request is its own partition."""
    return turn.conversation_id is None and turn.previous_response_id is None
