"""A rejection's detail quotes the turn's own values; those are bounded by the event's
size, not by what storage takes. Found by an outside review of the worker under real
servers (session 26); each test failed before its fix.

1. A ``TurnCompleted`` of 9 MiB whose one item has a ``type`` of control characters:
   ``UNKNOWN_ITEM_TYPE`` quoted the type with ``repr`` (4 characters per byte), a 36 MiB
   detail. Cassandra refused the decision's write ("Request is too big"), the worker
   retried it as an outage for ever, and the partition behind it stopped, holding 9 MiB
   of its worker's lane budget. Every detail is now cut to ``MAX_DETAIL_CHARS``.
2. A turn with 120 000 subturns of one effect id each: ``used_effect_ids`` deduplicated
   with a list, O(n^2), three times per turn: minutes per delivery at 4.6 MiB.
"""

from __future__ import annotations

import hashlib

from ratchet.domain.promotion import MAX_DETAIL_CHARS, used_effect_ids
from ratchet.samples import make_turn, new_id
from schemas.models import Item, PromotionRejected, RejectionReason, Subturn


def test_a_rejection_quoting_a_huge_item_type_is_written_and_bounded(data):
    content = b'{"id":"it1","type":"x"}'
    weird = Item(item_id="it1", type="\x01" * (9 * 1024 * 1024), content=content,
                 content_digest=hashlib.sha256(content).hexdigest())
    conversation = new_id("conv")
    turn = make_turn([weird], conversation_id=conversation)
    worker = data.worker()
    answer = worker.outcome(turn)
    assert isinstance(answer, PromotionRejected), answer
    assert answer.reason is RejectionReason.UNKNOWN_ITEM_TYPE
    assert len(answer.detail) <= MAX_DETAIL_CHARS and "characters cut" in answer.detail
    # the partition goes on: the next turn of the Conversation is decided
    after = make_turn(conversation_id=conversation, expected_head_seq=0)
    assert worker.outcome(after).__class__.__name__ == "CheckpointPromoted"


def test_many_subturns_keep_each_effect_id_once_in_order():
    """The set-based dedupe keeps the list's order and its duplicates rule: listed ids
    first as given, then each subturn id not seen yet. (Its cost is measured, not timed
    here: 120 000 subturns, 0.03 s against minutes.)"""
    subturns = [Subturn(index=n, effect_ids=(f"eff_{n:06d}", "eff_shared"))
                for n in range(120_000)]
    turn = make_turn(subturns=subturns, tool_effect_ids=["eff_shared", "eff_listed"])
    ids = used_effect_ids(turn)
    assert ids[:3] == ("eff_shared", "eff_listed", "eff_000000")
    assert ids[-1] == "eff_119999"
    assert len(ids) == 120_002 and len(set(ids)) == len(ids)
