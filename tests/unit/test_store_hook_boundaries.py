"""A store hook that raises ``StopIteration`` (a used-up ``Mock(side_effect=[...])``, a
subclass's bare ``next``) fails the store's call with ``StrayStopIteration`` across every
boundary the hook is called over: a thread (``asyncio.to_thread``, whose future cannot
hold a ``StopIteration``: the awaiting caller waited for ever), a coroutine (Python
turns it into a bare ``RuntimeError``) and a caller's own iteration (a ``map`` or a
generator over the store's calls takes a bare one for its end and stops short).

On the memory store, which keeps the base's thread hop for the hooks it does not
answer in place (``_write_async``, ``_locate_async``, ``claim_async``); the histories'
reads, both backends: ``tests/contract/test_store_contract.py``."""

from __future__ import annotations

import asyncio

import pytest

from ratchet.domain.plan import ResponseClaim
from services.store.errors import StrayStopIteration
from services.store.memory import MemoryCheckpointStore
from tests.contract.store_support import conversation_turn, uid

TENANT = "tenant_hooks"


def _stop(*args):
    raise StopIteration


def _bounded(awaitable):
    """Run it with a bound: the hang these cases are about must fail them, not the run."""
    async def bounded():
        return await asyncio.wait_for(awaitable, 30)
    return asyncio.run(bounded())


def _claim() -> ResponseClaim:
    return ResponseClaim(TENANT, uid("resp"), uid("conv"), uid("key"), "d" * 64)


# (the hook replaced, the awaited call that reaches it)
AWAITED = {
    "_write": lambda store: store.promote_from_hints_async(
        conversation_turn(TENANT, uid("conv"), 0)),
    "_locate": lambda store: store._locate_async(TENANT, uid("resp")),
    "_claim": lambda store: store.claim_async(_claim()),
    "turn_lost": lambda store: store.turn_lost_async(TENANT, uid("resp"), uid("conv")),
    "read_head": lambda store: store.read_head_async(TENANT, uid("conv")),
    "read_turn": lambda store: store.read_turn_async(TENANT, uid("conv"), uid("resp")),
    "locate": lambda store: store.locate_async(TENANT, uid("resp")),
}


@pytest.mark.parametrize("hook", sorted(AWAITED))
def test_an_awaited_call_whose_hook_raises_stop_iteration_fails_typed(hook):
    """Before session 48: ``_write``, ``_locate`` (a thread) hung; the others (called
    in the coroutine) raised Python's bare ``RuntimeError``."""
    store = MemoryCheckpointStore()
    setattr(store, hook, _stop)
    with pytest.raises(StrayStopIteration) as raised:
        _bounded(AWAITED[hook](store))
    assert isinstance(raised.value.__cause__, StopIteration)
    assert isinstance(raised.value, RuntimeError)  # what Python makes of one, PEP 479


def test_a_caller_iterating_over_reads_is_not_stopped_short():
    """A blocking read whose hook raised a bare ``StopIteration`` (session 47's fix of
    the folded reader raised it as it came) ended a caller's ``map`` over reads as if
    its input had run out: an empty answer, no error. Now the read's failure is the
    caller's."""
    store = MemoryCheckpointStore()
    claim = _claim()
    assert store.start_claiming(claim)() == claim  # claimed, never promoted: turn_lost asked
    store.turn_lost = _stop

    def read(response_id):
        return store.read_history(TENANT, response_id=response_id)

    with pytest.raises(StrayStopIteration):
        list(map(read, [claim.response_id, claim.response_id]))
