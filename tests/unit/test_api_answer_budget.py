"""services/api/answer_budget.py: full reads wait for room in a byte budget, in
arrival order, and the answers they build hold their own bytes until written; a read
that finds no room in time is 503. Cache hits reserve nothing."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from ratchet.domain.plan import ResponseClaim
from services.api import answer_budget, metrics
from services.api.answer_budget import AnswerBudget, AnswersBusy
from services.api.service import RehydrationService
from services.api.slow_readers import PartsResponse
from tests.unit.test_api_cache import CachingStack
from tests.unit.test_api_http import FP, Stack, message, uid

MB = 1024 * 1024


def test_an_unknown_lookup_reserves_an_eighth_and_a_known_one_twice_its_last_answer():
    async def run():
        budget = AnswerBudget(64 * MB)
        first = await budget.reserve(("response", "t", "r1"))
        assert first.nbytes == 8 * MB and budget.held == 8 * MB
        first.settle(answer_bytes=3 * MB, own_bytes=3 * MB)  # built: its own bytes only
        assert budget.held == 3 * MB
        first.release()
        first.release()  # idempotent
        assert budget.held == 0
        again = await budget.reserve(("response", "t", "r1"))
        assert again.nbytes == 6 * MB  # the rows read and their JSON
        again.settle(answer_bytes=3 * MB, own_bytes=0)  # the cache's bytes: none held
        assert budget.held == 0
    asyncio.run(run())


def test_reads_wait_in_arrival_order_while_the_budget_is_full():
    async def run():
        budget = AnswerBudget(16 * MB)
        budget.learn(("big",), 4 * MB)  # costs 8 MB
        budget.learn(("small",), MB // 2)  # costs 1 MB
        holding = [await budget.reserve(("big",)), await budget.reserve(("big",))]
        assert budget.held == 16 * MB
        order = []

        async def read(key):
            reservation = await budget.reserve(key, wait_s=5)
            order.append(key[0])
            return reservation

        waiting = [asyncio.create_task(read(("big",))), asyncio.create_task(read(("small",)))]
        await asyncio.sleep(0.05)
        assert order == []  # the small one does not overtake the big one
        holding[0].release()
        await asyncio.sleep(0.05)
        assert order == ["big"] and budget.held == 16 * MB  # the small one: no room yet
        holding[1].release()
        await asyncio.sleep(0.05)
        assert order == ["big", "small"] and budget.held == 9 * MB
        for reservation in [await task for task in waiting]:
            reservation.release()
        assert budget.held == 0
    asyncio.run(run())


def test_a_read_with_no_room_in_time_is_busy_and_leaves_no_trace():
    async def run():
        budget = AnswerBudget(8 * MB)
        held = await budget.reserve(("a",))  # an unknown read: a whole eighth... of 8 MB
        budget.learn(("b",), 4 * MB)
        with pytest.raises(AnswersBusy, match="RATCHET_API_ANSWER_BUDGET_BYTES"):
            await budget.reserve(("b",), wait_s=0.05)
        cancelled = asyncio.create_task(budget.reserve(("b",), wait_s=5))
        await asyncio.sleep(0.02)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        held.release()
        assert budget.held == 0  # neither the refused nor the cancelled read holds any
        alone = AnswerBudget(MB)
        budget_of_one = await alone.reserve(("huge",))
        budget_of_one.settle(answer_bytes=50 * MB, own_bytes=50 * MB)
        budget_of_one.release()
        assert (await alone.reserve(("huge",))).nbytes == 100 * MB  # one alone always runs
    asyncio.run(run())


def _big_history(stack: Stack) -> tuple[str, str]:
    tenant, conv = uid("tenant"), uid("conv")
    items = tuple(message(f"{n}:" + "x" * (300 * 1024), item_id=uid("msg")) for n in range(4))
    return tenant, stack.promote(tenant, conv, 0, items)


async def _written(answer) -> None:
    async def send(_message):
        return None
    await PartsResponse(answer.parts, answer.status_code, held=answer.held)(
        {"type": "http"}, None, send)


def test_an_uncached_answer_holds_its_bytes_until_written_and_the_next_read_waits():
    stack = Stack()
    budget = AnswerBudget(3 * MB)
    service = RehydrationService(stack.store, stack.ledger, stack.waiters, clock=stack.clock,
                                 answers=budget)
    tenant, rid = _big_history(stack)

    async def run():
        first = await service.response_history(tenant, rid, FP, 0)
        assert first.outcome == "certified" and first.own_bytes == len(first.payload)
        assert budget.held == first.own_bytes > MB  # the cache is off: its own copy
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(answer_budget, "ROOM_WAIT_S", 0.05)
            with pytest.raises(AnswersBusy):  # twice the last answer does not fit beside it
                await service.response_history(tenant, rid, FP, 0)
            waiting = asyncio.create_task(service.response_history(tenant, rid, FP, 0))
            await asyncio.sleep(0.01)
            assert not waiting.done()
            await _written(first)  # written: its bytes released, the waiting read runs
            second = await asyncio.wait_for(waiting, 5)
        assert second.payload == first.payload
        await _written(second)
        assert budget.held == 0
    asyncio.run(run())


def test_a_cached_answer_holds_nothing_and_a_hit_never_waits():
    stack = CachingStack(cache_bytes=64 * MB)
    budget = AnswerBudget(3 * MB)
    service = RehydrationService(stack.store, stack.ledger, stack.waiters, clock=stack.clock,
                                 cache=stack.cache, answers=budget)
    tenant, rid = _big_history(stack)

    async def run():
        miss = await service.response_history(tenant, rid, FP, 0)
        # Pinned while written, counting nothing while the cache holds its bytes.
        assert miss.own_bytes == 0 and miss.held.nbytes == 0 and budget.held == 0
        blocker = await budget.reserve(("response", "other", "r"))
        budget.resize(blocker, 10 * MB)  # the budget full of another read
        hit = await asyncio.wait_for(service.response_history(tenant, rid, FP, 0), 1)
        assert hit.payload == miss.payload and hit.held.nbytes == 0
        blocker.release()
        await _written(miss)
        await _written(hit)
        assert budget.held == 0 and not budget._pins
    asyncio.run(run())


def test_a_failure_does_not_teach_a_lookup_its_cost():
    """A poll before promotion answers NOT_FOUND in a few hundred bytes: learned, it let
    the real read of the history slip in at that cost (an outside review, session 37)."""
    stack = Stack()
    budget = AnswerBudget(8 * MB)
    service = RehydrationService(stack.store, stack.ledger, stack.waiters, clock=stack.clock,
                                 answers=budget)

    async def run():
        missing = await service.response_history("t", "resp_never", FP, 0)
        assert missing.status_code == 404 and budget.held == 0
        assert budget._cost(("response", "t", "resp_never")) == MB  # still the default
    asyncio.run(run())


def test_a_conversation_extended_from_its_cached_prefix_does_not_wait_in_the_budget():
    """Only a full read waits: the next turn of a cached Conversation reads its one new
    row (an outside review: it waited, and was refused 503, with the budget full)."""
    stack = CachingStack(cache_bytes=64 * MB)
    budget = AnswerBudget(3 * MB)
    service = RehydrationService(stack.store, stack.ledger, stack.waiters, clock=stack.clock,
                                 cache=stack.cache, answers=budget)
    tenant, conv = uid("tenant"), uid("conv")
    stack.promote(tenant, conv, 0, (message("x" * (600 * 1024), item_id=uid("msg")),))

    async def run():
        first = await service.conversation_history(tenant, conv, FP)
        assert first.outcome == "certified"
        stack.promote(tenant, conv, 1, (message("next", item_id=uid("msg")),))
        blocker = await budget.reserve(("response", "other", "r"))
        budget.resize(blocker, 10 * MB)  # full
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(answer_budget, "ROOM_WAIT_S", 0.05)
            extended = await service.conversation_history(tenant, conv, FP)
        assert extended.outcome == "certified" and extended.head_seq == 2
        blocker.release()
    asyncio.run(run())


@pytest.mark.parametrize("fails", [RuntimeError("transport closed"), asyncio.CancelledError()])
def test_an_answer_whose_first_message_fails_releases_its_bytes(fails):
    async def run():
        budget = AnswerBudget(8 * MB)
        reservation = await budget.reserve(("response", "t", "r"))
        reservation.settle(MB, MB)

        async def send(_message):
            raise fails

        with pytest.raises(type(fails)):
            await PartsResponse((b"x" * MB,), 200, held=reservation)({"type": "http"}, None, send)
        assert budget.held == 0
    asyncio.run(run())


@pytest.mark.parametrize("cached", [False, True])
def test_a_response_promoted_nowhere_is_answered_at_once_when_the_budget_is_full(cached):
    """A poll before promotion, and a ``wait_ms`` request's last look at its deadline,
    have nothing to read: with the budget full they answered 503 after its wait where
    the answer is 404, or 409 for a recorded rejection (left open in session 37)."""
    stack = CachingStack(cache_bytes=64 * MB) if cached else Stack()
    budget = AnswerBudget(3 * MB)
    service = RehydrationService(stack.store, stack.ledger, stack.waiters, clock=stack.clock,
                                 cache=stack.cache if cached else None, answers=budget)
    tenant, rid = _big_history(stack)

    async def run():
        blocker = await budget.reserve(("response", "other", "r"))
        budget.resize(blocker, 10 * MB)  # the budget full of another read
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(answer_budget, "ROOM_WAIT_S", 0.05)
            pending = await service.response_history(tenant, uid("resp"), FP, 0)
            assert pending.status_code == 404 and pending.reason == "NOT_FOUND"
            rejected = uid("resp")
            stack.ledger.mark_rejected(tenant, rejected, "CONFLICT", "head moved")
            waited = await service.response_history(tenant, rejected, FP, 30)
            assert waited.status_code == 409 and waited.reason == "NOT_PROMOTED"
            timed_out = await service.response_history(tenant, uid("resp"), FP, 20)
            assert timed_out.status_code == 409 and "no decision within" in timed_out.detail
            # Claimed, not promoted: the processor claims every turn it starts on and
            # keeps the claim of a rejected one (an outside review: these waited, 503).
            claimed_rejected, claimed_pending = uid("resp"), uid("resp")
            for claimed in (claimed_rejected, claimed_pending):
                stack.store.start_claiming(
                    ResponseClaim(tenant, claimed, uid("conv"), uid("key"), "digest"))()
            stack.ledger.mark_rejected(tenant, claimed_rejected, "OUT_OF_ORDER", "ahead")
            for wait_ms in (0, 30):
                answer = await service.response_history(tenant, claimed_rejected, FP, wait_ms)
                assert (answer.status_code, answer.detail) == (409, "rejected: OUT_OF_ORDER")
            pending_now = await service.response_history(tenant, claimed_pending, FP, 0)
            assert pending_now.status_code == 404
            deadline = await service.response_history(tenant, claimed_pending, FP, 20)
            assert deadline.status_code == 409 and "no decision within" in deadline.detail
            # A promoted response still waits for room: it has a history to build.
            with pytest.raises(AnswersBusy):
                await service.response_history(tenant, rid, FP, 0)
        assert budget.held == 10 * MB
        blocker.release()
    asyncio.run(run())


def _uncached(budget_bytes: int) -> tuple[Stack, AnswerBudget, RehydrationService]:
    stack, budget = Stack(), AnswerBudget(budget_bytes)
    return stack, budget, RehydrationService(stack.store, stack.ledger, stack.waiters,
                                             clock=stack.clock, answers=budget)


def _pinning_service(cache_bytes: int, budget: AnswerBudget):
    stack = CachingStack(cache_bytes=cache_bytes)
    return stack, RehydrationService(stack.store, stack.ledger, stack.waiters,
                                     clock=stack.clock, cache=stack.cache, answers=budget)


def test_a_cached_answer_evicted_while_written_counts_its_bytes_until_written():
    """A slow reader of a history the cache then lets go held its bytes outside both
    bounds (left open in session 37): they now count in the budget, once however many
    answers write them, until the last is written; an eviction on a thread of the
    pool is counted too."""
    budget = AnswerBudget(64 * MB)
    stack, service = _pinning_service(64 * MB, budget)
    tenant, rid = _big_history(stack)

    async def run():
        first = await service.response_history(tenant, rid, FP, 0)
        second = await service.response_history(tenant, rid, FP, 0)  # a hit, same bytes
        entry = stack.cache.get(tenant, rid)
        assert first.held.nbytes == second.held.nbytes == 0 and budget.held == 0
        await asyncio.to_thread(stack.cache.discard, tenant, rid)  # let go on a thread
        await asyncio.sleep(0)  # the loop hears of it
        assert budget.held == len(entry.rendered.items_json) > MB
        assert first.held.nbytes == second.held.nbytes == budget.held
        await _written(first)
        assert budget.held == len(entry.rendered.items_json)  # the second still writes
        await _written(second)
        assert budget.held == 0 and not budget._pins
    asyncio.run(run())


def test_an_eviction_by_the_caches_own_bound_counts_and_admits_the_next_read_once_written():
    """The cache full: filling it with another history evicts the one being written;
    its bytes then fill the budget, and a full read waits until the answer is written."""
    budget = AnswerBudget(2 * MB)
    stack, service = _pinning_service(2 * MB, budget)  # room for one 1.2 MB history
    tenant, rid = _big_history(stack)
    other_tenant, other = _big_history(stack)

    async def run():
        slow = await service.response_history(tenant, rid, FP, 0)
        assert budget.held == 0
        filled = await service.response_history(other_tenant, other, FP, 0)  # evicts rid
        await asyncio.sleep(0)
        assert stack.cache.get(tenant, rid) is None
        assert budget.held == slow.held.nbytes > MB
        await _written(filled)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(answer_budget, "ROOM_WAIT_S", 0.05)
            with pytest.raises(AnswersBusy):  # its next full read does not fit beside it
                await service.response_history(tenant, rid, FP, 0)
        await _written(slow)
        assert budget.held == 0
        again = await service.response_history(tenant, rid, FP, 0)
        assert again.payload == slow.payload
    asyncio.run(run())


def test_a_pin_taken_after_the_cache_let_go_counts_at_once():
    """The eviction came between the answer and its pin: the cache, asked once the pin
    is taken, says it no longer holds those bytes."""
    budget = AnswerBudget(64 * MB)
    stack, service = _pinning_service(64 * MB, budget)
    tenant, rid = _big_history(stack)

    async def run():
        answer = await service.response_history(tenant, rid, FP, 0)
        await _written(answer)
        stack.cache.discard(tenant, rid)  # let go before the next answer's pin
        late = service._pinned(replace(answer, held=None))
        assert budget.held == late.held.nbytes == len(answer.shares.rendered.items_json)
        budget.evicted(answer.shares.rendered.items_json)  # told as well: counted once
        await asyncio.sleep(0)
        assert budget.held == late.held.nbytes
        late.held.release()
        late.held.release()  # idempotent
        assert budget.held == 0 and not budget._pins
    asyncio.run(run())


def test_no_cache_reads_of_a_cached_history_count_nothing_while_it_stays_cached():
    """A full read of a cached history renders the cache's own bytes and caches them
    again: that replaces the entry but lets no bytes go. The first draft counted each
    such read's answer once more (an outside review: 34 of 40 ``no-cache`` reads of an
    8.6 MB Conversation answered 503 with the budget 64 MiB)."""
    budget = AnswerBudget(4 * MB)
    stack, service = _pinning_service(64 * MB, budget)
    tenant, rid = _big_history(stack)

    async def run():
        answers = [await service.response_history(tenant, rid, FP, 0)]
        for _ in range(5):  # every one a full read, none of them written yet
            answers.append(await service.response_history(tenant, rid, FP, 0,
                                                          use_cache=False))
        await asyncio.sleep(0)  # any notice of the cache's has landed
        assert budget.held == 0
        assert len({id(a.parts[1]) for a in answers}) == 1  # one copy of the items
        stack.cache.discard(tenant, rid)
        assert budget.held == len(answers[0].parts[1])  # let go: counted once, at once
        for answer in answers:
            await _written(answer)
        assert budget.held == 0 and not budget._pins
    asyncio.run(run())


def test_a_read_waiting_behind_an_evicted_answer_is_admitted_once_it_is_written():
    budget = AnswerBudget(int(1.3 * MB))
    stack, service = _pinning_service(64 * MB, budget)
    tenant, rid = _big_history(stack)
    other_tenant, other = _big_history(stack)

    async def run():
        slow = await service.response_history(tenant, rid, FP, 0)
        stack.cache.discard(tenant, rid)
        assert budget.held == slow.held.nbytes > MB
        waiting = asyncio.create_task(service.response_history(other_tenant, other, FP, 0))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # an eighth of the budget does not fit beside 1.2 MiB
        await _written(slow)
        admitted = await asyncio.wait_for(waiting, 5)
        assert admitted.outcome == "certified"
        await _written(admitted)
        assert budget.held == 0
    asyncio.run(run())


def test_an_answer_of_one_slice_takes_no_pin():
    budget = AnswerBudget(8 * MB)
    stack, service = _pinning_service(64 * MB, budget)
    tenant, conv = uid("tenant"), uid("conv")
    rid = stack.promote(tenant, conv, 0, (message("small", item_id=uid("msg")),))

    async def run():
        answer = await service.response_history(tenant, rid, FP, 0)
        assert answer.shares is not None and answer.held is None
        assert budget.held == 0 and not budget._pins
    asyncio.run(run())


def test_the_cache_tells_of_bytes_it_lets_go_and_only_of_those():
    """Evicted, discarded, or replaced by an entry of other bytes: told. Replaced by an
    entry of the same bytes (a full read of a cached history): not told."""
    budget = AnswerBudget(64 * MB)
    stack, service = _pinning_service(64 * MB, budget)
    tenant, rid = _big_history(stack)
    told: list[bytes] = []

    async def run():
        await service.response_history(tenant, rid, FP, 0)
        stack.cache.on_evict = told.append
        entry = stack.cache.get(tenant, rid)
        same = replace(entry, linked=entry.linked)  # another entry, the same bytes
        stack.cache.put(rid, same)
        assert told == []
        other = replace(entry, rendered=replace(entry.rendered,
                                                items_json=bytes(bytearray(entry.rendered.items_json))))
        stack.cache.put(rid, other)
        assert len(told) == 1 and told[0] is entry.rendered.items_json
        stack.cache.discard(tenant, rid)
        assert len(told) == 2 and told[1] is other.rendered.items_json
    asyncio.run(run())


def test_a_responses_cost_is_learned_per_partition_when_the_partition_is_known():
    """A response id is new each turn: learned per response, every read of a growing
    Conversation was a lookup not read yet (an eighth of the budget, whatever its
    size). With the partition known (the caller's hint) the last answer there is the
    next read's guess: a 1.2 MiB history's next turn no longer slips in beside a full
    budget at 3/8 MiB."""
    stack, budget, service = _uncached(3 * MB)
    tenant, first = _big_history(stack)
    conv = stack.store.get_checkpoint(tenant, first).partition_key
    second = stack.promote(tenant, conv, 1, (message("next", item_id=uid("msg")),))

    async def run():
        answer = await service.response_history(tenant, first, FP, 0, partition_key=conv)
        await _written(answer)
        assert budget._cost(("partition", tenant, conv)) == 2 * len(answer.payload)
        blocker = await budget.reserve(("response", "other", "r"))
        budget.resize(blocker, MB)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(answer_budget, "ROOM_WAIT_S", 0.05)
            with pytest.raises(AnswersBusy):  # 1 MiB held + 2 x 1.2 MiB > 3 MiB
                await service.response_history(tenant, second, FP, 0, partition_key=conv)
            # Without the hint it is a lookup not read yet: an eighth, and it fits.
            unhinted = await service.response_history(tenant, second, FP, 0)
        assert unhinted.outcome == "certified"
        await _written(unhinted)
        blocker.release()
        assert budget.held == 0
    asyncio.run(run())


def test_a_response_with_no_claim_found_by_its_hint_still_waits_for_room():
    """A response promoted before migration 007 has no claim; the full read finds it by
    the request's ``partition_key``: it is promoted, and waits for room like any."""
    stack, budget, service = _uncached(3 * MB)
    tenant, rid = _big_history(stack)
    conv = stack.store.get_checkpoint(tenant, rid).partition_key
    del stack.store._claims[(tenant, rid)]  # as before migration 007

    async def run():
        blocker = await budget.reserve(("response", "other", "r"))
        budget.resize(blocker, 10 * MB)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(answer_budget, "ROOM_WAIT_S", 0.05)
            with pytest.raises(AnswersBusy):
                await service.response_history(tenant, rid, FP, 0, partition_key=conv)
            missing = await service.response_history(tenant, rid, FP, 0)  # no hint
            assert missing.status_code == 404  # as the full read answers it
        blocker.release()
        found = await service.response_history(tenant, rid, FP, 0, partition_key=conv)
        assert found.outcome == "certified"
    asyncio.run(run())


def test_a_wrong_partition_hint_does_not_teach_that_partition_another_histories_cost():
    """A read with a ``partition_key`` hint that names another partition (never
    trusted: the claim finds the response) is answered from the response's own
    partition; what it cost is that partition's, not the hinted one's. Before (an
    outside review, session 43) it was learned under the hint: one request naming a
    small Conversation for a large history made every later read of that Conversation
    reserve twice the large one, and wait or answer 503 beside a budget it fits in."""
    stack, budget, service = _uncached(3 * MB)
    tenant, big = _big_history(stack)
    small_conv = uid("conv")
    small = stack.promote(tenant, small_conv, 0, (message("small", item_id=uid("msg")),))

    async def run():
        await _written(await service.response_history(tenant, small, FP, 0,
                                                      partition_key=small_conv))
        wrong = await service.response_history(tenant, big, FP, 0, partition_key=small_conv)
        assert wrong.outcome == "certified" and len(wrong.payload) > MB
        await _written(wrong)
        blocker = await budget.reserve(("response", "other", "r"))
        budget.resize(blocker, MB)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(answer_budget, "ROOM_WAIT_S", 0.05)
            # 1 MiB held + twice the small history's answer: room.
            again = await service.response_history(tenant, small, FP, 0,
                                                   partition_key=small_conv)
        assert again.outcome == "certified"
        await _written(again)
        blocker.release()
        assert budget.held == 0
    asyncio.run(run())


def _wrong_hint_world(stack: Stack) -> tuple[str, str, str, str]:
    """A large history in one Conversation, and a small response in another: the
    tenant, the large Conversation, the small response and its Conversation."""
    tenant, big = _big_history(stack)
    big_conv = stack.store.get_checkpoint(tenant, big).partition_key
    small_conv = uid("conv")
    small = stack.promote(tenant, small_conv, 0, (message("small", item_id=uid("msg")),))
    return tenant, big_conv, small, small_conv


async def _honest_reads_beside_a_held_mib(service, budget, tenant, small, hint) -> list:
    """Two reads of ``small`` with the (wrong) ``hint``, 1 MiB of a 3 MiB budget held,
    the second once the response's location was learned by the first."""
    blocker = await budget.reserve(("response", "other", "r"))
    budget.resize(blocker, MB)
    outcomes = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(answer_budget, "ROOM_WAIT_S", 0.05)
        for _ in range(2):
            try:
                answer = await service.response_history(tenant, small, FP, 0, partition_key=hint,
                                                        use_cache=False)
            except AnswersBusy:
                outcomes.append("503")
                continue
            outcomes.append(answer.outcome)
            await _written(answer)
    blocker.release()
    assert budget.held == 0
    return outcomes


def test_a_wrong_hint_does_not_make_a_small_read_wait_for_the_hinted_partitions_cost():
    """A read of a small history whose ``partition_key`` hint names a large partition
    (its cost learned: 2 x 1.2 MiB) beside 1 MiB held in a 3 MiB budget: it reserves
    its own partition's cost and is answered. Before (left open in session 43), it
    reserved the hinted partition's and answered 503, also once its location was
    learned. The cache is off: nothing but the hint says where the response is."""
    stack, budget, service = _uncached(3 * MB)
    tenant, big_conv, small, _ = _wrong_hint_world(stack)

    async def run():
        big = stack.store.read_head(tenant, big_conv).response_id
        await _written(await service.response_history(tenant, big, FP, 0,
                                                      partition_key=big_conv))
        assert budget._cost(("partition", tenant, big_conv)) > 2 * MB
        return await _honest_reads_beside_a_held_mib(service, budget, tenant, small, big_conv)

    assert asyncio.run(run()) == ["certified", "certified"]


def test_a_wrong_hint_naming_a_partition_the_cache_cannot_extend_reserves_the_right_cost():
    """The same with the cache on: the large history is too large for it (its partition
    is not extendable, the hint not checked by a one-row read), and the reads bypass
    it (``no-cache``) with the wrong hint."""
    budget = AnswerBudget(3 * MB)
    stack, service = _pinning_service(MB // 2, budget)
    tenant, big_conv, small, _ = _wrong_hint_world(stack)

    async def run():
        big = stack.store.read_head(tenant, big_conv).response_id
        await _written(await service.response_history(tenant, big, FP, 0,
                                                      partition_key=big_conv))
        assert not stack.cache.extendable(tenant, big_conv)
        return await _honest_reads_beside_a_held_mib(service, budget, tenant, small, big_conv)

    assert asyncio.run(run()) == ["certified", "certified"]


def test_both_endpoints_learn_a_conversations_cost_under_its_partition():
    """A Conversation read and a response read with its partition known read the same
    partition's rows: the last answer of either is the other's guess. Before session 44
    the Conversation endpoint learned under a key of its own: after response reads of
    a 1.2 MiB history, its read reserved an eighth of the budget and slipped in beside
    a full one (and a response read after Conversation reads, the same)."""
    stack, budget, service = _uncached(3 * MB)
    tenant, first = _big_history(stack)
    conv = stack.store.get_checkpoint(tenant, first).partition_key

    async def busy_beside_a_held_mib(read) -> bool:
        blocker = await budget.reserve(("response", "other", "r"))
        budget.resize(blocker, MB)
        try:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(answer_budget, "ROOM_WAIT_S", 0.05)
                try:
                    await _written(await read())
                except AnswersBusy:
                    return True
                return False
        finally:
            blocker.release()

    async def run():
        await _written(await service.response_history(tenant, first, FP, 0,
                                                      partition_key=conv))
        # 1 MiB held + 2 x 1.2 MiB > 3 MiB: the Conversation's read waits.
        assert await busy_beside_a_held_mib(
            lambda: service.conversation_history(tenant, conv, FP))
        budget._costs.clear()
        conversation = await service.conversation_history(tenant, conv, FP)
        assert conversation.outcome == "certified"
        await _written(conversation)
        assert budget._cost(("partition", tenant, conv)) == 2 * len(conversation.payload)
        assert await busy_beside_a_held_mib(
            lambda: service.response_history(tenant, first, FP, 0, partition_key=conv))
        assert budget.held == 0
    asyncio.run(run())


N_WAITING = 4


def _cold_reads_behind_each_other(endpoint: str) -> tuple[list, int]:
    """``N_WAITING`` concurrent cold requests (the cache on, nothing of the history in it)
    for a 1.2 MiB history whose cost is learned (2 x 1.2 MiB in a 3 MiB budget: one read
    at a time). The answers, and the store's full reads they made."""
    budget = AnswerBudget(3 * MB)
    stack, service = _pinning_service(64 * MB, budget)
    tenant, rid = _big_history(stack)
    conv = stack.store.get_checkpoint(tenant, rid).partition_key
    budget.learn(("partition", tenant, conv), 1_250_000)

    def request():
        if endpoint == "conversation":
            return service.conversation_history(tenant, conv, FP)
        return service.response_history(tenant, rid, FP, 0, partition_key=conv)

    async def run():
        before = stack.reads.get("read_history", 0)
        answers = await asyncio.gather(*(request() for _ in range(N_WAITING)))
        for answer in answers:
            await _written(answer)
        assert budget.held == 0
        return list(answers), stack.reads.get("read_history", 0) - before

    return asyncio.run(run())


@pytest.mark.parametrize("endpoint", ["response", "conversation"])
def test_requests_waiting_for_room_behind_a_read_of_their_history_find_it_cached(endpoint):
    """The first request reads; the others wait for room behind it (its cost is most of
    the budget), and once they get it the history is cached: they answer from the cache.
    Before session 44 each read it again once admitted, one after another: 4 reads."""
    answers, reads = _cold_reads_behind_each_other(endpoint)
    assert {a.outcome for a in answers} == {"certified"}
    assert len({a.payload for a in answers}) == 1
    assert reads == 1, f"{N_WAITING} requests made {reads} full reads"



@pytest.mark.parametrize("endpoint", ["response", "conversation"])
def test_each_request_waiting_behind_a_read_of_its_history_counts_once_as_what_it_was(endpoint):
    """The cache's counter says how each request finally used it: the one that read, a
    miss; the ones that found the history cached once they got room, hits. Before, those
    were counted a miss when they queued and a hit when they found it: 4 misses and 3 hits
    for 4 requests."""
    def counts() -> dict[str, float]:
        return {result: metrics.HISTORY_CACHE.labels(endpoint, result)._value.get()
                for result in ("hit", "miss", "extended", "bypass")}

    before = counts()
    _, reads = _cold_reads_behind_each_other(endpoint)
    after = counts()
    counted = {result: after[result] - before[result] for result in after}
    assert reads == 1
    assert counted == {"hit": N_WAITING - 1, "miss": 1, "extended": 0, "bypass": 0}
