"""The worker's event loop choice (``RATCHET_WORKER_EVENT_LOOP``, ``streams.worker``)."""

from __future__ import annotations

import asyncio

import uvloop

from streams.worker import use_event_loop


def test_uvloop_policy_makes_every_new_loop_a_uvloop():
    before = asyncio.get_event_loop_policy()
    try:
        use_event_loop("uvloop")
        loop = asyncio.new_event_loop()  # as Faust's consumer thread makes its own
        try:
            assert isinstance(loop, uvloop.Loop)
        finally:
            loop.close()
    finally:
        asyncio.set_event_loop_policy(before)


def test_asyncio_keeps_the_standard_loop():
    before = asyncio.get_event_loop_policy()
    try:
        use_event_loop("asyncio")
        assert asyncio.get_event_loop_policy() is before
    finally:
        asyncio.set_event_loop_policy(before)
