"""Faust's Kafka consumer on the worker's own event loop instead of a thread of its own.

faust-streaming runs aiokafka's consumer in a dedicated thread with a second event loop
(``ThreadDelegateConsumer``): every fetch the agent asks for crosses threads twice (a
call queued into the consumer's loop, its result posted back), each crossing a wake-up
of the other loop, and the two threads share one interpreter lock. On a backlog a fetch
carries hundreds of records and the crossing is nothing; at a production pace records
arrive one at a time and every record waits for it: ~6 ms of a paced turn's p50 from
produce to dispatch (docs/decisions.md, "Paced latency").

Here the same consumer (faust's ``AIOKafkaConsumerThread``, unchanged: its rebalance
listener, commits, seeks and fetches) is served on the app's loop: mode's thread worker
is replaced by a task, and a call "into the thread" is a plain await. Everything Faust
does with the consumer stays as it was; only the hop goes. ``RATCHET_WORKER_CONSUMER=thread``
restores Faust's default.
"""

from __future__ import annotations

import asyncio
from typing import Any

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka
from mode.utils.futures import maybe_async


class _LoopTask:
    """Stands in for mode's ``WorkerThread``: serves the service on its parent loop."""

    def __init__(self, service: Any) -> None:
        self.service = service
        # Held here: the loop keeps only a weak reference to a task.
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = self.service.parent_loop.create_task(self.service._serve(),
                                                         name="kafka-consumer")

    def stop(self) -> None:
        """Nothing to join: ``_serve`` ends on the loop once the service is stopped."""


class _ConsumerOnLoop(faust_aiokafka.AIOKafkaConsumerThread):
    async def call_thread(self, fun: Any, *args: Any, **kwargs: Any) -> Any:
        # What mode's method queue does in the consumer's thread, without the queue.
        return await maybe_async(fun(*args, **kwargs))

    async def _gather_remaining_tasks(self) -> None:
        # mode cancels every task left on the thread's loop when the thread ends: here
        # that loop is the worker's, and its tasks (lanes, timers) are not ours.
        pass


class _Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return _ConsumerOnLoop(self, loop=self.loop, thread_loop=self.loop,
                               Worker=_LoopTask, beacon=self.beacon)


class _Transport(faust_aiokafka.Transport):
    Consumer = _Consumer


class LoopConsumerApp(faust.App):
    """A ``faust.App`` whose Kafka consumer runs on the app's event loop."""

    def _new_transport(self) -> faust_aiokafka.Transport:
        return _Transport(self.conf.broker_consumer, self)
