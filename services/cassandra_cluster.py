"""How ratchet's processes open a Cassandra cluster: the driver settings in one place.

Native protocol v4, not v5 (which the driver would negotiate with Cassandra 5): v5
wraps every frame in a segment with a CRC24 header and a CRC32 payload checksum, and
cassandra-driver computes the CRC24 in pure Python on both directions. Measured on
this stack (one client, 12 requests in flight, half 1 KiB inserts, half reads):
173-180 us of client CPU per request with v4 against 202-230 us with v5, and the
driver is the worker's largest CPU cost (docs/decisions.md, "Promotion cost"). v4
has everything the store uses: prepared statements, conditional batches, SERIAL
reads, paging. What v5 adds is the segment checksum on top of TCP's.
"""

from __future__ import annotations

import asyncio
from typing import Any

from cassandra import DriverException
from cassandra.cluster import Cluster, NoHostAvailable, ResponseFuture
from cassandra.connection import ConnectionException
from cassandra.protocol import ErrorMessage

from ratchet.settings import Settings

PROTOCOL_VERSION = 4

# What cassandra-driver raises when Cassandra, or the way to it, fails a request: the
# store's and the ledger's guards turn these into an outage to retry, never a record
# dead-lettered as a bug. They share no base class: ``DriverException`` (timeouts and
# the server's answers the driver maps, ``RequestExecutionException`` among them),
# ``NoHostAvailable``, ``ErrorMessage`` (every server error answer, e.g. "Server is
# shutting down", mapped or not) and ``ConnectionException`` (e.g.
# ``ConnectionShutdown``: the connection reset after the request was sent). The last
# two were each once missed by a guard, and a Cassandra restart in a chaos run
# dead-lettered the event they failed (docs/decisions.md, "Every driver outage is
# retried").
DRIVER_OUTAGES: tuple[type[BaseException], ...] = (
    DriverException,
    NoHostAvailable,
    ErrorMessage,
    ConnectionException,
    OSError,
)


def open_cluster(settings: Settings, **options: Any) -> Cluster:
    """A ``Cluster`` for ``settings``' hosts (not connected yet); ``options`` go to the
    driver as they are (e.g. a reconnection policy)."""
    return Cluster(list(settings.cassandra_hosts), port=settings.cassandra_port,
                   protocol_version=PROTOCOL_VERSION, **options)


async def completed(future: ResponseFuture) -> None:
    """Wait on the event loop, without a thread, until a driver request is answered
    (or failed); ``future.result()`` then returns or raises at once. The driver's I/O
    thread hands the answer over with one ``call_soon_threadsafe``."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(_: object = None) -> None:
        loop.call_soon_threadsafe(_resolve, done)

    future.add_callbacks(settle, settle)
    await done


def _resolve(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)
