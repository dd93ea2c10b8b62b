"""Domain results -> HTTP bodies and status codes (CONTRACT section 5).

``history_outcome_body`` asks the domain for the outcome of a verified read and the
caller's fingerprint, then renders it. Nothing here decides; it only translates.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

import orjson
from pydantic import TypeAdapter

from ratchet.domain.catalogue import json_object
from ratchet.domain.history import (
    CheckpointRecord,
    HistoryFailure,
    PromotionMode,
    StoredTokenArtifact,
    TurnItems,
    VerifiedHistory,
)
from ratchet.domain.rehydration import Certified, Failure, Fallback, FallbackReason, rehydrate
from ratchet.speedups import SPEEDUPS
from schemas.canonical import canonical_json_text
from schemas.models import Item
from services.api.models import (
    FAILURE_HTTP_STATUS,
    CheckpointBody,
    HistoryBody,
    HistoryItem,
)


class _Undecodable(ValueError):
    """Stored bytes that passed their digest check but are not a UTF-8 JSON object."""


def history_outcome_body(
    history: VerifiedHistory | HistoryFailure, fingerprint_hash: str, now: datetime
) -> tuple[HistoryBody, int]:
    outcome = rehydrate(history, fingerprint_hash, now)
    if isinstance(outcome, Failure):
        reason = str(outcome.reason)
        return failure_body(reason, detail=outcome.detail), _status(reason)
    response_id = outcome.checkpoint.response_id
    seqs = {"head_seq": outcome.checkpoint.seq,
            "conversation_head_seq": conversation_head_seq(outcome.checkpoint, outcome.head_seq)}
    try:
        items = [item_body(item) for item in outcome.items]
        # Rendered for a fallback too: a damaged row answers alike whatever the caller's
        # fingerprint (as the cached path, which renders it once per history).
        _checkpoint_json(outcome.checkpoint)
        checkpoint = checkpoint_body(outcome.checkpoint)
    except _Undecodable as exc:
        # Never return a partly decoded history: the whole answer is an integrity failure.
        return failure_body("CORRUPT_HISTORY", response_id=response_id, detail=str(exc)), 500
    if isinstance(outcome, Certified):
        body = HistoryBody(
            outcome="certified",
            **seqs,
            response_id=response_id,
            items=items,
            checkpoint=checkpoint,
        )
        return body, 200
    assert isinstance(outcome, Fallback)
    body = HistoryBody(
        outcome="fallback",
        reason=str(outcome.reason),
        **seqs,
        response_id=response_id,
        items=items,
    )
    return body, 200


def conversation_head_seq(checkpoint: CheckpointRecord, head_seq: int) -> int | None:
    """``conversation_head_seq`` of a body: the Conversation's head (``VerifiedHistory.
    head_seq``) in Conversation mode, null in chain mode."""
    return head_seq if checkpoint.mode is PromotionMode.CONVERSATION else None


@dataclass(frozen=True)
class RenderedHistory:
    """A verified history's JSON parts, rendered once (and cached with it, cache.py).

    What differs per request (outcome, fallback reason, head_seq) is spliced around them
    by ``history_json``; ``tests/unit/test_api_render.py`` proves the result is byte
    for byte what pydantic renders for the same ``HistoryBody``."""

    response_id: str
    items_json: bytes
    checkpoint_json: bytes


# pydantic's own serializers for the pieces rendered once per turn, so the spliced body
# cannot differ from what ``HistoryBody.model_dump_json`` would write.
_CHECKPOINT = TypeAdapter(CheckpointBody)
_STR = TypeAdapter(str)


def render_history(history: VerifiedHistory) -> RenderedHistory | HistoryBody:
    """The JSON parts of a verified history, or the CORRUPT_HISTORY failure body if
    an item's stored bytes are not a UTF-8 JSON object (a history is never partly
    decoded)."""
    return render_extension(history.checkpoint, b"[]", history.turns)


def render_extension(
    checkpoint: CheckpointRecord, prefix_items_json: bytes, turns: Iterable[TurnItems]
) -> RenderedHistory | HistoryBody:
    """The JSON parts of a history ending at ``checkpoint``: the (already rendered)
    items array of its verified prefix with the items of ``turns`` appended, rendered
    once."""
    response_id = checkpoint.response_id
    try:
        appended = items_json(turns)
        checkpoint_json = _checkpoint_json(checkpoint)
    except _Undecodable as exc:
        return failure_body("CORRUPT_HISTORY", response_id=response_id, detail=str(exc))
    if appended == b"[]":
        joined = prefix_items_json
    elif prefix_items_json == b"[]":
        joined = appended
    else:
        joined = prefix_items_json[:-1] + b"," + appended[1:]
    return RenderedHistory(
        response_id=response_id,
        items_json=joined,
        checkpoint_json=checkpoint_json,
    )


def items_json(turns: Iterable[TurnItems]) -> bytes:
    """The JSON array of the turns' items as ``HistoryItem`` serialises them (field
    order, escaping), straight from the loaded columns (no model object per item).
    In C when ``ratchet._speedups`` is built (ratchet/speedups.py: its checker hands
    every content it is not sure of to ``content_text``), else ``items_json_py``.
    Raises ``_Undecodable`` (see ``content_text``)."""
    if SPEEDUPS is None:
        return items_json_py(turns)
    return SPEEDUPS.render_items(
        [(t.ids, t.types, t.roles, t.call_ids, t.contents, t.digests, t.formats) for t in turns],
        content_text,
    )


def items_json_py(turns: Iterable[TurnItems]) -> bytes:
    """``items_json`` in Python, the reference the C twin is tested against: ONE
    ``orjson.dumps`` call, about 4x cheaper than pydantic's own serializer
    (``pydantic_core.to_json``) on these dicts, with the same bytes: orjson escapes
    every code point as pydantic does (docs/decisions.md, "Cold miss").
    ``tests/unit/test_api_render.py`` proves both: the bytes equal pydantic's body for
    every catalogue item type, and the escaping of every code point."""
    return orjson.dumps(
        [
            {
                "item_id": item_id,
                "type": item_type,
                "role": role,
                "call_id": call_id,
                "content": content_text(item_id, content),
                "content_digest": digest,
                "format_version": int(version),
            }
            for turn in turns
            for item_id, item_type, role, call_id, content, digest, version in turn.rows()
        ]
    )


def history_json(
    rendered: RenderedHistory,
    head_seq: int,
    conversation_head: int | None,
    fallback: FallbackReason | None,
) -> bytes:
    """The whole certified (``fallback`` None) or fallback body, in ``HistoryBody``'s
    field order; the checkpoint travels with certified answers only."""
    return b"".join(history_parts(rendered, head_seq, conversation_head, fallback))


def history_parts(
    rendered: RenderedHistory,
    head_seq: int,
    conversation_head: int | None,
    fallback: FallbackReason | None,
) -> tuple[bytes, bytes, bytes]:
    """``history_json`` in three parts, the rendered items' own bytes in the middle (not
    copied: an answer is sent in slices, services/api/slow_readers.py)."""
    if fallback is None:
        head = b'{"outcome":"certified","reason":null,"head_seq":'
        checkpoint = rendered.checkpoint_json
    else:
        head = b'{"outcome":"fallback","reason":' + _STR.dump_json(str(fallback))
        head += b',"head_seq":'
        checkpoint = b"null"
    before = b"".join(
        (
            head,
            str(int(head_seq)).encode(),
            b',"conversation_head_seq":',
            b"null" if conversation_head is None else str(int(conversation_head)).encode(),
            b',"response_id":',
            _STR.dump_json(rendered.response_id),
            b',"items":',
        )
    )
    return before, rendered.items_json, b',"checkpoint":' + checkpoint + b',"detail":null}'


def failure_body(reason: str, *, response_id: str | None = None, detail: str = "") -> HistoryBody:
    return HistoryBody(
        outcome="failure", reason=str(reason), response_id=response_id, detail=detail or None
    )


def _status(reason: str) -> int:
    return FAILURE_HTTP_STATUS.get(str(reason), 500)


def content_text(item_id: str, content: bytes) -> str:
    """An item's stored canonical JSON, as text, unchanged (see models.py for why).

    Checked with the catalogue's ``json_object``, the very function validation accepted
    the item with (one item codec), so a promoted item always renders; both renderings
    (``item_body`` and the once-rendered ``items_json``) go through it."""
    if json_object(content) is None:
        raise _Undecodable(f"item {item_id} content is not a UTF-8 JSON object")
    return content.decode("utf-8")


def item_body(item: Item) -> HistoryItem:
    """One item as the response model (``content_text`` decides what renders): the
    model rendering that ``items_json`` must equal byte for byte."""
    text = content_text(item.item_id, item.content)
    # model_construct: every field comes from a verified Item, validating again costs
    # ~1 ms per 100-item history for nothing.
    return HistoryItem.model_construct(
        item_id=item.item_id,
        type=item.type,
        role=item.role,
        call_id=item.call_id,
        content=text,
        content_digest=item.content_digest,
        format_version=item.format_version,
    )


def checkpoint_body(checkpoint: CheckpointRecord) -> CheckpointBody:
    """The checkpoint as the answer carries it. Raises ``_Undecodable`` when a stored
    cell does not render (a receipt or proof that is not a JSON object, a value the
    response model refuses): a damaged row, never an untyped error."""
    artifact = checkpoint.token_artifact
    try:
        return CheckpointBody(
            seq=checkpoint.seq,
            fingerprint_hash=checkpoint.fingerprint_hash or "",
            expires_at=_iso(artifact.expires_at) if artifact is not None else None,
            token_artifact=_artifact(artifact),
            router_receipt=_json_object(checkpoint.router_receipt),
            boundary_proof=_json_object(checkpoint.boundary_proof),
        )
    except (ValueError, RecursionError) as exc:  # json's errors, pydantic's ValidationError
        raise _Undecodable(f"checkpoint of {checkpoint.response_id} cannot be rendered "
                           f"({type(exc).__name__})") from exc


def _checkpoint_json(checkpoint: CheckpointRecord) -> bytes:
    """``checkpoint_body`` as JSON; ``_Undecodable`` when it cannot be written (e.g. a
    lone surrogate in a stored string)."""
    body = checkpoint_body(checkpoint)
    try:
        return _CHECKPOINT.dump_json(body)
    except (ValueError, RecursionError) as exc:  # pydantic's PydanticSerializationError
        raise _Undecodable(f"checkpoint of {checkpoint.response_id} cannot be rendered "
                           f"({type(exc).__name__})") from exc


def _artifact(artifact: StoredTokenArtifact | None) -> dict | None:
    return None if artifact is None else json.loads(artifact.to_json())


def _json_object(text: str | None) -> dict | None:
    """A stored receipt or proof: the canonical JSON object the processor wrote, byte
    for byte (a cell that parses to something else, e.g. with duplicate keys or NaN,
    would be served altered: it is damaged)."""
    if text is None:
        return None
    value = json.loads(text)
    if not isinstance(value, dict) or canonical_json_text(value) != text:
        raise ValueError("not its canonical JSON object")
    return value


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat().replace("+00:00", "Z")
