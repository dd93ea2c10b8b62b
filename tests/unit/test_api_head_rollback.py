"""A Conversation head rolled back onto an earlier turn is never served from the cache.

The damage (an outside review, session 31): the head cells rewritten with an earlier
turn's own four values (seq, response id, last item seq, lineage digest) while the
later turns' rows stand. The cells are backed by that earlier turn's row, so the cached
paths, which read the head alone, served the shortened history 200 ``certified``; a
full read sees the rows beyond the head and answers ``CORRUPT_HISTORY`` (docs/store.md,
rule 3). A head never moves back: the cache remembers the highest Conversation seq it
verified per partition, and a head below it sends the request to the full read."""

from __future__ import annotations

from ratchet.domain.history import Head
from tests.unit.test_api_cache import CachingStack, _conv_of, _third_turn, two_turns


def _rolled_back_after_caching(stack):
    """Three turns, each history read (cached), then the head rolled back onto turn
    2: (tenant, conv, turn 1's id, turn 2's id)."""
    tenant, second, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, second)
    third = _third_turn(stack, tenant, conv)
    partition = stack.store._partitions[(tenant, conv)]
    first = next(c.response_id for c in partition.checkpoints.values() if c.seq == 1)
    for rid in (first, second, third):
        assert stack.history(tenant, rid).status_code == 200
    assert stack.conversation(tenant, conv).json()["head_seq"] == 3
    partition.head = Head.of(partition.checkpoints[second])
    return tenant, conv, first, second


def test_a_rolled_back_head_is_corrupt_on_the_cached_conversation_path():
    stack = CachingStack()
    tenant, conv, _, _ = _rolled_back_after_caching(stack)
    cold = stack.conversation(tenant, conv, **{"Cache-Control": "no-cache"})
    assert (cold.status_code, cold.json()["reason"]) == (500, "CORRUPT_HISTORY")
    cached = stack.conversation(tenant, conv)
    assert (cached.status_code, cached.json()["reason"]) == (500, "CORRUPT_HISTORY")


def test_a_rolled_back_head_is_corrupt_for_every_cached_response_of_it():
    stack = CachingStack()
    tenant, conv, first, second = _rolled_back_after_caching(stack)
    for rid in (first, second):
        answer = stack.history(tenant, rid, partition_key=conv)
        assert (answer.status_code, answer.json()["reason"]) == (500, "CORRUPT_HISTORY"), rid


def test_a_rolled_back_head_is_corrupt_for_a_turn_loaded_by_extension():
    """The head's own turn was never cached (its earlier turn and the later one were):
    a read of it loads the row and extends the cached prefix, which served it 200
    ``certified`` on the rolled-back head (a third review, session 31)."""
    stack = CachingStack()
    tenant, second, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, second)
    third = _third_turn(stack, tenant, conv)
    partition = stack.store._partitions[(tenant, conv)]
    first = next(c.response_id for c in partition.checkpoints.values() if c.seq == 1)
    for rid in (first, third):
        assert stack.history(tenant, rid).status_code == 200
    stack.cache.discard(tenant, second)  # the third's read may have cached its lineage
    partition.head = Head.of(partition.checkpoints[second])
    for _ in range(2):  # the extension, then whatever the first read left cached
        answer = stack.history(tenant, second)
        assert (answer.status_code, answer.json()["reason"]) == (500, "CORRUPT_HISTORY")


def test_a_turn_beyond_a_rolled_back_head_is_corrupt_when_loaded_by_extension():
    """The turn beyond a rolled-back head, never cached, read while its parent (the
    head's turn) is cached: the extension loads its row with the head, which is behind
    it (rows beyond the head: damage, docs/store.md rule 3), and must leave the answer
    to the full read (``CORRUPT_HISTORY``), never serve the turn 200 on a head that no
    longer reaches it. Found by a mutation review: dropping the extension's "head not
    behind the turn" check passed every test (the head's cached turn backs the head)."""
    stack = CachingStack()
    tenant, second, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, second)
    partition = stack.store._partitions[(tenant, conv)]
    first = next(c.response_id for c in partition.checkpoints.values() if c.seq == 1)
    for rid in (first, second):
        assert stack.history(tenant, rid).status_code == 200
    third = _third_turn(stack, tenant, conv)
    assert stack.cache.get(tenant, third) is None  # loaded by the next read: an extension
    partition.head = Head.of(partition.checkpoints[second])
    answer = stack.history(tenant, third, partition_key=conv)
    assert (answer.status_code, answer.json()["reason"]) == (500, "CORRUPT_HISTORY")
