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


# (the hook replaced, a blocking public call that reaches it)
BLOCKING = {
    "promote/_write": lambda store: store.promote(conversation_turn(TENANT, uid("conv"), 0)),
    "promote/_read_view": lambda store: store.promote(
        conversation_turn(TENANT, uid("conv"), 3)),
    "promote/clock": lambda store: store.promote(conversation_turn(TENANT, uid("conv"), 0)),
    "judge/_read_view": lambda store: store.judge(conversation_turn(TENANT, uid("conv"), 0)),
    "start_claiming/_claim": lambda store: store.start_claiming(_claim()),
    "read_turn/_load_turn": lambda store: store.read_turn(TENANT, uid("conv"), uid("resp")),
    "locate/_locate": lambda store: store.locate(TENANT, uid("resp")),
    "turn_lost/_claim_of": lambda store: store.turn_lost(TENANT, uid("resp")),
    "read_promoted/_located_checkpoint": lambda store: store.read_promoted(TENANT, uid("resp")),
    "read_checkpoint/_located_checkpoint": lambda store: store.read_checkpoint(
        TENANT, uid("resp")),
    "get_checkpoint/_located_checkpoint": lambda store: store.get_checkpoint(
        TENANT, uid("resp")),
    "hold_request/_claim_request": lambda store: store.hold_request(
        TENANT, uid("key"), uid("resp")),
    "promoted_request/_read_view": lambda store: store.promoted_request(
        conversation_turn(TENANT, uid("conv"), 0)),
    "promoted_key/_read_view": lambda store: store.promoted_key(
        TENANT, uid("conv"), uid("key"), uid("resp"), first_of_chain=False),
    "mark_request_facts/_set_facts_mark": lambda store: store.mark_request_facts(
        TENANT, uid("conv"), uid("key")),
    "mark_claim/_mark_unless_promoted": lambda store: store.mark_claim(
        TENANT, uid("conv"), uid("key")),
    "read_history/clock": lambda store: store.read_history(TENANT, conversation_id=uid("conv")),
}


def _replace(store, hook: str) -> None:
    if hook == "clock":  # the store's clock, a hook of its options
        store.options.clock = _stop
    else:
        setattr(store, hook, _stop)


@pytest.mark.parametrize("case", sorted(BLOCKING))
def test_a_blocking_call_whose_hook_raises_stop_iteration_fails_typed(case):
    """A store call made by a caller's own iteration (``map``; a generator would make it
    a bare ``RuntimeError``) or in a thread (the worker runs its handler with
    ``run_in_executor``, whose future cannot hold one: it waited for ever): before
    session 48 a hook's bare ``StopIteration`` went out of the store's call as it came,
    so the ``map`` ended short with no error and the thread's caller hung; the history
    read's clock, asked inside its steps' generator, gave a bare ``RuntimeError``."""
    store = MemoryCheckpointStore()
    _replace(store, case.split("/")[1])
    call = BLOCKING[case]
    with pytest.raises(StrayStopIteration):
        list(map(call, [store]))
    with pytest.raises(StrayStopIteration):
        _bounded(asyncio.to_thread(call, store))


def test_an_awaited_promotion_whose_clock_raises_stop_iteration_fails_typed():
    """The store's clock is asked by ``promote_from_hints_async`` in its coroutine: a
    bare ``StopIteration`` out of it was Python's bare ``RuntimeError`` there."""
    store = MemoryCheckpointStore()
    store.options.clock = _stop
    with pytest.raises(StrayStopIteration):
        _bounded(store.promote_from_hints_async(conversation_turn(TENANT, uid("conv"), 0)))
