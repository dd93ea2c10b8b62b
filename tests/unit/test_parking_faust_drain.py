"""A parked partition's resumption against Faust's own drain (``Consumer._drain_messages``
and ``Consumer.getmany`` of faust-streaming, with our consumer class): the records Faust
hands over, its read offset and its gaps. Only the fetch is faked (the batches aiokafka
would return) and the seek (what ``seek_wait`` does on the consumer: the read offset set
to P, aiokafka's buffer of the partition dropped).

An outside review (session 29) found that a resumption which put the partition back
into the fetch set before seeking let records of it fetched before the parking reach
the drain after the seek: Faust took their offsets as its read offset, noted the
records between as a gap (which commits may pass), and dropped P when the seek fetched
it again. The resumption now seeks first, while the partition is out of the fetch set,
and waits for the drain to end the batch it was in at the parking.
"""
from __future__ import annotations

import asyncio

import pytest
from faust.types import TP, Message

from streams.parking import Parking
from tests.unit.stream_world import TOPIC, build

P0, P1 = TP(TOPIC, 0), TP(TOPIC, 1)


def message(tp: TP, offset: int) -> Message:
    return Message(TOPIC, tp.partition, offset, 0.0, 0, None, b"k", b"v", None)


class RoomyLanes:
    """A lane with room as soon as asked (the parking's wait is not what is tested)."""

    def generation(self, tp) -> int:
        return 0

    async def lane_room(self, tp, size: int = 0) -> None:
        return None


@pytest.mark.parametrize("flow_control", [False, True])
def test_the_first_record_after_a_resumption_is_p_and_faust_notes_no_gap(tmp_path,
                                                                          monkeypatch,
                                                                          flow_control):
    """``flow_control``: Faust's own stream-buffer flow control had taken partition 0
    out of its fetch set into its ``_buffered_partitions`` (whose records it still hands
    over) before the parking, and puts it back (``on_buffer_drop``) while it is parked."""
    async def scenario():
        w = build(tmp_path, monkeypatch)
        faust = w.app._new_consumer()  # the worker's consumer class, not started
        monkeypatch.setattr(w.app.topics, "acks_enabled_for", lambda topic: True)
        faust._set_active_tps({P0, P1})
        faust._committed_offset[P0] = 5
        parking = Parking(RoomyLanes(), lambda: faust)  # type: ignore[arg-type]
        # aiokafka's log of partition 0 from offset 5; what the fetcher holds for it
        log = {P0: [message(P0, o) for o in range(5, 13)]}
        buffered = {P0: list(log[P0])}
        # the batch in progress at the parking: 5 (parked), 6, 7 of partition 0, then
        # partition 1's record, then 8, 9 of partition 0 (all fetched before the pause)
        batches = [[(P0, buffered[P0].pop(0)) for _ in range(3)]
                   + [(P1, message(P1, 0))]
                   + [(P0, buffered[P0].pop(0)) for _ in range(2)]]
        delivered: list[tuple[int, int]] = []
        stop = asyncio.Event()

        async def wait_next_records(timeout):
            active = faust._get_active_partitions()  # the live set, as Faust passes it
            if batches:
                records = batches.pop(0)
            else:  # what aiokafka returns now: partitions in the fetch set only
                records = [(tp, m) for tp, ms in buffered.items() if tp in active
                           for m in ms]
                for tp, _m in records:
                    buffered[tp] = []
                if not records:
                    await asyncio.sleep(0.01)
            grouped: dict = {}
            for tp, m in records:
                grouped.setdefault(tp, []).append(m)
            return grouped, active

        async def seek_wait(partitions):  # what Faust's _seek_wait does on the consumer
            for tp, offset in partitions.items():
                faust._read_offset[tp] = offset
                buffered[tp] = [m for m in log[tp] if m.offset >= offset]

        if flow_control:
            faust.on_buffer_full(P0)

        async def callback(m):
            delivered.append((m.partition, m.offset))
            if delivered == [(0, 5)]:
                parking.park(P0, 5)  # the dispatcher: lane full at 5, the first time
            if flow_control and m.partition == 1:
                faust.on_buffer_drop(P0)  # the stream buffer drained meanwhile
            if len([d for d in delivered if d[0] == 0]) >= 7:
                stop.set()

        monkeypatch.setattr(faust, "_wait_next_records", wait_next_records)
        monkeypatch.setattr(faust, "_to_message", lambda tp, record: record)
        monkeypatch.setattr(faust, "highwater", lambda tp: 13)
        monkeypatch.setattr(faust, "seek_wait", seek_wait)
        faust.callback = callback

        class Fetcher:
            _stopped = stop

        await asyncio.wait_for(faust._drain_messages(Fetcher()), 10)
        return faust, delivered

    faust, delivered = asyncio.run(scenario())
    mine = [offset for partition, offset in delivered if partition == 0]
    # 5 parked; 6..9 of the batch in progress are not handed over (out of the fetch set);
    # after the seek to 5 and the resumption: 5, 6, ... in order
    assert mine[0] == 5 and mine[1:] == list(range(5, 5 + len(mine) - 1)), delivered
    assert (1, 0) in delivered
    assert not list(faust._gap[P0]), f"Faust noted a gap: {faust._gap[P0]}"
