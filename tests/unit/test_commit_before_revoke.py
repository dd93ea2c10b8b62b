"""What the lanes acked before a rebalance is committed before Faust forgets it.

Faust's ``Consumer.on_partitions_revoked`` drops its acks of the revoked partitions
(``_acked``) before the app's revoke handler runs: the handler's commit
(``streams/app.py``, then ``on_revoked``) committed only what the lanes ack during the
grace. Every event finished since the last periodic commit (``broker_commit_interval``,
1 s) was handled again by the partition's next owner, and its outcomes published twice:
on every rebalance, for every partition (an eager rebalance revokes them all, also the
ones assigned back to the same worker). Not wrong (outcome topics are at-least-once),
but needless work and duplicates. (An outside review of the worker across rebalances,
session 42.)"""
from __future__ import annotations

import asyncio

import pytest
from faust.types import TP
from faust.types.tuples import Message

from streams.consumer_loop import LoopConsumerApp, WorkerApp


class _Producer:
    async def flush(self):
        return None


def _recording_consumer(cls, name: str, tmp_path, monkeypatch):
    """A worker app's consumer of one assigned partition whose commits are recorded
    (``committed``) instead of sent; acks enabled. Call on the event loop."""
    app = cls(name, broker="kafka://127.0.0.1:1", web_enabled=False, store="memory://",
              datadir=str(tmp_path / "faust"))
    consumer = app.consumer
    committed: dict = {}

    async def commit(offsets):
        committed.update(offsets)
        return True

    monkeypatch.setattr(app.topics, "acks_enabled_for", lambda topic: True)
    monkeypatch.setattr(consumer, "assignment", lambda: {TP("events", 0)})
    monkeypatch.setattr(consumer, "_commit", commit)
    app.producer = _Producer()
    return consumer, committed



@pytest.mark.parametrize("cls", [LoopConsumerApp, WorkerApp])
def test_acked_offsets_are_committed_before_faust_drops_them_on_revoke(tmp_path, monkeypatch,
                                                                      cls):
    async def check() -> dict:
        consumer, committed = _recording_consumer(cls, "unit-commit-before-revoke",
                                                  tmp_path, monkeypatch)

        async def app_revoke_handler(revoked):
            return None

        monkeypatch.setattr(consumer, "_on_partitions_revoked", app_revoke_handler)
        for offset in range(3):  # handled and acked by its lane, not committed yet
            consumer.ack(Message("events", 0, offset, 0.0, 0, None, b"k", b"v", None))
        await consumer.on_partitions_revoked({TP("events", 0)})
        return committed

    committed = asyncio.run(asyncio.wait_for(check(), 10))
    assert committed.get(TP("events", 0)) == 3, (
        f"offsets 0-2 were acked before the revocation; committed: {committed}: the next "
        "owner handles them again")


@pytest.mark.parametrize("cls", [LoopConsumerApp, WorkerApp])
def test_acks_are_committed_when_a_periodic_commit_is_in_flight(tmp_path, monkeypatch, cls):
    """Faust's ``commit`` called while its periodic commit is in flight waits for that one
    and commits nothing itself: what was acked after it (during the revoke handler's
    grace, say) waited for the next period, which a revocation does not leave it."""
    from streams.consumer_loop import commit_acked

    async def check() -> dict:
        consumer, committed = _recording_consumer(cls, "unit-commit-in-flight",
                                                  tmp_path, monkeypatch)
        periodic = asyncio.get_running_loop().create_future()
        consumer._commit_fut = periodic  # the periodic commit, in flight
        consumer.ack(Message("events", 0, 0, 0.0, 0, None, b"k", b"v", None))

        def periodic_done():  # what the end of Faust's commit does
            consumer._commit_fut = None
            periodic.set_result(None)

        asyncio.get_running_loop().call_later(0.05, periodic_done)
        await commit_acked(consumer)
        return committed

    committed = asyncio.run(asyncio.wait_for(check(), 10))
    assert committed.get(TP("events", 0)) == 1, committed


@pytest.mark.parametrize("cls", [LoopConsumerApp, WorkerApp])
def test_an_ack_that_lands_while_the_commit_is_on_its_way_is_committed(tmp_path, monkeypatch,
                                                                      cls):
    """The lanes go on finishing events while the commit before the revocation waits
    for the broker. Committed before the lanes were settled (session 42), an event acked
    during that round trip was forgotten by Faust right after it, and the next owner
    published its outcome again (CI, session 43: 2 outcomes twice across one rebalance).
    Now the app's ``settle_revoked`` runs first: its lanes finish what is in flight and
    ack nothing after it, and then everything acked is committed."""

    async def check() -> tuple[dict, int]:
        consumer, committed = _recording_consumer(cls, "unit-ack-during-commit",
                                                  tmp_path, monkeypatch)
        lane = {"next": 3, "running": True}

        def finish_one():  # an event of the partition handled to the end: acked
            consumer.ack(Message("events", 0, lane["next"], 0.0, 0, None, b"k", b"v", None))
            lane["next"] += 1

        async def commit(offsets):  # the round trip to the broker: the lane goes on
            await asyncio.sleep(0)
            if lane["running"]:
                finish_one()
            committed.update(offsets)
            return True

        async def settle_revoked(revoked):  # the event in flight finishes, then no more
            finish_one()
            lane["running"] = False

        async def app_revoke_handler(revoked):
            return None

        monkeypatch.setattr(consumer, "_commit", commit)
        monkeypatch.setattr(consumer, "_on_partitions_revoked", app_revoke_handler)
        monkeypatch.setattr(consumer.app, "settle_revoked", settle_revoked, raising=False)
        for offset in range(3):
            consumer.ack(Message("events", 0, offset, 0.0, 0, None, b"k", b"v", None))
        await consumer.on_partitions_revoked({TP("events", 0)})
        return committed, lane["next"]

    committed, acked_up_to = asyncio.run(asyncio.wait_for(check(), 10))
    assert committed.get(TP("events", 0)) == acked_up_to, (
        f"offsets 0-{acked_up_to - 1} were acked by the end of the revocation; committed: "
        f"{committed}: the next owner handles the rest again and publishes their outcomes "
        "twice")


# A revocation whose settling raises (an outside review of session 44's fixes,
# session 45; docs/processor.md, "Rebalance"): on a revocation the app's
# ``settle_revoked`` runs first, then the commit, then Faust's revocation.
# ``settle_revoked`` raising escaped into aiokafka, which logs a rebalance listener's
# error and goes on: nothing committed, Faust never told, the worker running on.
@pytest.mark.parametrize("cls", [LoopConsumerApp, WorkerApp])
def test_a_revocation_whose_settling_fails_crashes_the_worker(tmp_path, monkeypatch, cls):
    """``settle_revoked`` raising (a bug) escaped the consumer's revocation into
    aiokafka, which logs a rebalance listener's error and goes on: nothing committed,
    Faust never told (its acks of the partitions kept, its flow not stopped), the
    lanes of partitions now another worker's maybe still running. Before session 44 the
    same error in the app's revoke handler crashed the worker (Faust's rule): fail
    closed, the supervisor starts it again from the committed offsets."""
    async def check():
        consumer, committed = _recording_consumer(cls, "unit-settle-fails", tmp_path,
                                                  monkeypatch)
        told: list[set] = []

        async def app_revoke_handler(revoked):
            told.append(revoked)

        async def settle_revoked(revoked):
            raise RuntimeError("a bug while settling")

        monkeypatch.setattr(consumer, "_on_partitions_revoked", app_revoke_handler)
        monkeypatch.setattr(consumer.app, "settle_revoked", settle_revoked, raising=False)
        consumer.ack(Message("events", 0, 0, 0.0, 0, None, b"k", b"v", None))
        try:
            await consumer.on_partitions_revoked({TP("events", 0)})
            escaped = None
        except Exception as exc:  # noqa: BLE001 - asserted below
            escaped = exc
        return consumer.app, committed, told, escaped

    app, committed, told, escaped = asyncio.run(asyncio.wait_for(check(), 10))
    assert escaped is None, f"{escaped!r} escaped to aiokafka, which logs it and goes on"
    assert app.crashed and str(app.crash_reason) == "a bug while settling"
    assert told == [{TP("events", 0)}]  # Faust still told (it forgets the partition)
    assert committed.get(TP("events", 0)) == 1  # what was acked is committed all the same


# A revocation whose settling fails crashes the worker (session 45) "what was acked is
# still committed and Faust still told". With the thread consumer
# (``RATCHET_WORKER_CONSUMER=thread``) a commit is a call to the consumer's thread, and
# the app's crash crashes that thread's service: on a real broker its method queue
# served one more call after ``app.crash``, then none (the review's probe), so the
# second of ``commit_acked``'s two commits, needed when Faust's periodic commit is in
# flight, was never served. The commits and Faust's revocation come first, the crash last.
@pytest.mark.parametrize("cls", [LoopConsumerApp, WorkerApp])
def test_a_revocation_whose_settling_fails_commits_and_tells_faust_before_the_crash(
        tmp_path, monkeypatch, cls):
    async def check():
        consumer, committed = _recording_consumer(cls, "unit-settle-fails-order", tmp_path,
                                                  monkeypatch)
        order: list[str] = []
        plain_commit = consumer._commit

        async def commit(offsets):
            order.append("commit, crashed" if consumer.app.crashed else "commit")
            return await plain_commit(offsets)

        async def app_revoke_handler(revoked):
            order.append("told, crashed" if consumer.app.crashed else "told")

        async def settle_revoked(revoked):
            raise RuntimeError("a bug while settling")

        monkeypatch.setattr(consumer, "_commit", commit)
        monkeypatch.setattr(consumer, "_on_partitions_revoked", app_revoke_handler)
        monkeypatch.setattr(consumer.app, "settle_revoked", settle_revoked, raising=False)
        consumer.ack(Message("events", 0, 0, 0.0, 0, None, b"k", b"v", None))
        await consumer.on_partitions_revoked({TP("events", 0)})
        return consumer.app, committed, order

    app, committed, order = asyncio.run(asyncio.wait_for(check(), 10))
    assert app.crashed and str(app.crash_reason) == "a bug while settling"
    assert committed.get(TP("events", 0)) == 1
    assert order == ["commit", "told"], order  # both before the crash
