"""A history read of several pages while the Conversation grows (an outside review,
session 31): a promotion between two pages showed its turn on a later page with the
head of the first, a turn beyond the head, and a Conversation longer than a page
(5 000 rows) answered ``CORRUPT_HISTORY`` while it was being promoted to, the read made
again racing the same way. Here a page holds two rows, and a turn is promoted between
the first page and the next of EVERY partition read (``RacingSession``), on real
Cassandra, through the blocking reads and the event loop's."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from ratchet.domain.history import HistoryFailure, HistoryFailureReason, VerifiedHistory
from services.store.cassandra import CassandraCheckpointStore
from services.store.statements import HISTORY_FETCH_SIZE
from tests.contract.store_support import conversation_turn, uid

pytestmark = pytest.mark.integration
PAGE = 2  # rows a page


class _FuturePromotingBetweenPages:
    """cassandra-driver's ``ResponseFuture`` of an event-loop read: before the next
    page is asked for, a turn is promoted (in a thread: the driver's I/O thread, which
    asks, must not wait for a request of its own)."""

    def __init__(self, future: Any, promote_next: Any) -> None:
        self._future = future
        self._promote_next = promote_next
        self._promoted = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._future, name)

    def start_fetching_next_page(self) -> None:
        if self._promoted:
            self._future.start_fetching_next_page()
            return
        self._promoted = True

        def promote_then_fetch() -> None:
            self._promote_next()
            self._future.start_fetching_next_page()

        threading.Thread(target=promote_then_fetch, daemon=True).start()


class RacingSession:
    """The store's session, but every partition read (``_select_partition``, and the
    structure read of a response, ``_select_structure``) has a turn promoted after its
    first page came and before the next is fetched."""

    def __init__(self, session: Any, statements: tuple[Any, ...], promote_next: Any) -> None:
        self._session = session
        self._statements = statements
        self._promote_next = promote_next

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def execute(self, statement: Any, *args: Any, **kwargs: Any) -> Any:
        result = self._session.execute(statement, *args, **kwargs)  # its first page
        if statement in self._statements and result.has_more_pages:
            self._promote_next()  # the next pages are fetched as the rows are iterated
        return result

    def execute_async(self, statement: Any, *args: Any, **kwargs: Any) -> Any:
        future = self._session.execute_async(statement, *args, **kwargs)
        if statement in self._statements:
            return _FuturePromotingBetweenPages(future, self._promote_next)
        return future


@pytest.fixture
def growing(store_session):
    """A Conversation of three turns and a store whose partition reads each race the
    promotion of the next turn. The promoted turns' ids sort after the first three
    (rows are ordered by response id), so they land on a later page than the first.
    Returns (reader, tenant, conv, response ids promoted so far, ids to come)."""
    tenant, conv = uid("tenant"), uid("conv")
    promoter = CassandraCheckpointStore(store_session, timeout_s=30)
    promoted: list[str] = []
    coming = [f"resp_z{n:03d}_{uid('r')}" for n in range(4, 40)]

    def promote(response_id: str) -> None:
        promoter.promote(conversation_turn(tenant, conv, len(promoted),
                                           response_id=response_id))
        promoted.append(response_id)

    for n in (1, 2, 3):
        promote(f"resp_a{n:03d}_{uid('r')}")

    reader = CassandraCheckpointStore(store_session, timeout_s=30)
    raced = (reader.cql.select_partition, reader.cql.select_structure)
    for statement in raced:
        statement.fetch_size = PAGE
    reader._session = RacingSession(store_session, raced, lambda: promote(coming.pop(0)))
    yield reader, tenant, conv, promoted, coming
    for statement in raced:
        statement.fetch_size = HISTORY_FETCH_SIZE


def _whole(history: Any) -> VerifiedHistory:
    """A certified history with every turn from 1 to its head, in order."""
    assert isinstance(history, VerifiedHistory), history
    assert [c.seq for c in history.lineage] == list(range(1, history.head_seq + 1))
    assert len(history.turns) == history.head_seq == history.checkpoint.seq
    return history


@pytest.mark.parametrize("awaited", [False, True], ids=["blocking", "event loop"])
def test_a_conversation_read_while_it_grows_is_whole_as_of_its_head(growing, awaited):
    reader, tenant, conv, promoted, _ = growing

    def read() -> Any:
        if awaited:
            return asyncio.run(reader.read_history_async(tenant, conversation_id=conv))
        return reader.read_history(tenant, conversation_id=conv)

    for _ in range(3):
        before = len(promoted)
        history = _whole(read())
        # the first read raced one promotion, the second another: the answer is the
        # partition as of the second read's head, which the first one's turn is under
        assert before + 1 <= history.head_seq <= before + 2 == len(promoted)
        assert history.checkpoint.response_id == promoted[history.head_seq - 1]


@pytest.mark.parametrize("awaited", [False, True], ids=["blocking", "event loop"])
def test_a_response_promoted_during_its_own_read_is_found_whole(growing, awaited):
    """The response asked for is promoted while its partition is read (its id named
    with the partition hint, as a gateway's ``wait_ms`` request names it): the first
    read sees it beyond the head, the second under it."""
    reader, tenant, conv, promoted, coming = growing
    for _ in range(2):
        wanted = coming[0]
        ids = {"response_id": wanted, "partition_key": conv}
        history = _whole(asyncio.run(reader.read_history_async(tenant, **ids)) if awaited
                         else reader.read_history(tenant, **ids))
        assert history.checkpoint.response_id == wanted == promoted[history.checkpoint.seq - 1]


def test_turns_beyond_a_head_that_does_not_move_are_still_corrupt(store_session):
    """Left out only when a head read after them covers them: a head rolled back onto
    an earlier turn (its four cells that turn's own) with a later turn's row still
    there is damage, read across pages or not."""
    tenant, conv = uid("tenant"), uid("conv")
    store = CassandraCheckpointStore(store_session, timeout_s=30)
    for seq in range(3):
        store.promote(conversation_turn(tenant, conv, seq))
    second = store.read_history(tenant, conversation_id=conv).lineage[1]
    store_session.execute(
        "UPDATE turns SET head_seq = %s, head_response_id = %s, head_item_count = %s, "
        "head_lineage_digest = %s WHERE tenant_id = %s AND partition_key = %s",
        (second.seq, second.response_id, second.last_item_seq, second.lineage_digest,
         tenant, conv), timeout=30)
    store.cql.select_partition.fetch_size = PAGE
    try:
        for result in (store.read_history(tenant, conversation_id=conv),
                       asyncio.run(store.read_history_async(tenant, conversation_id=conv))):
            assert isinstance(result, HistoryFailure), result
            assert result.reason is HistoryFailureReason.CORRUPT_HISTORY
    finally:
        store.cql.select_partition.fetch_size = HISTORY_FETCH_SIZE
