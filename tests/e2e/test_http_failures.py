"""Failures through the real stack: not found, not promoted (then promoted), rejected,
and every integrity failure after corrupting Cassandra directly."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from services.demo.simulator import SimulatedGateway, assistant, uid, user
from services.gateway.client import Certified, Failure
from services.gateway.events import TurnIdentity
from tests.e2e.helpers import WAIT_MS, promoted_conversation


@pytest.fixture
def gw(e2e_stack) -> SimulatedGateway:
    return SimulatedGateway(e2e_stack.producer, e2e_stack.client)


def test_another_tenants_response_is_not_found_like_an_unknown_one(gw, e2e_stack):
    _, turns = promoted_conversation(gw, turns=1)
    rid = turns[0].response_id
    url = f"{e2e_stack.base_url}/v1/responses/{rid}/history"
    other = httpx.get(
        url, params={"tenant_id": "intruder", "fingerprint_hash": gw.fingerprint_hash}
    )
    unknown = httpx.get(
        f"{e2e_stack.base_url}/v1/responses/{uid('resp')}/history",
        params={"tenant_id": "intruder", "fingerprint_hash": gw.fingerprint_hash},
    )
    assert other.status_code == unknown.status_code == 404
    assert other.json() == {**unknown.json(), "response_id": other.json()["response_id"]}
    assert other.json()["reason"] == "NOT_FOUND" and other.json()["items"] is None
    assert e2e_stack.client.status("intruder", rid).state == "unknown"


def test_not_promoted_then_promoted_within_wait_ms(gw):
    identity = TurnIdentity.conversation(gw.tenant_id, uid("conv"), uid("resp"), 0)
    turn = gw.turn(identity, [user("hi")], [assistant("hello")])
    assert gw.rehydrate(turn.response_id) == Failure("NOT_FOUND", 404, None, "no such response")

    answers: list = []
    waiter = threading.Thread(
        target=lambda: answers.append(gw.rehydrate(turn.response_id, wait_ms=WAIT_MS))
    )
    started = time.monotonic()
    waiter.start()
    time.sleep(0.5)  # the request is waiting before the turn even exists
    gw.publish(turn)
    waiter.join()
    elapsed = time.monotonic() - started
    assert isinstance(answers[0], Certified), answers
    assert elapsed < WAIT_MS / 1000 - 1  # woken by the promotion, not by the deadline


def test_a_wait_that_names_no_partition_is_answered_after_the_promotion(gw, e2e_stack):
    """A gateway that sends no ``partition_key``: the woken request reads first where the
    decision record says the response lives (never trusted: the row must be there) and
    answers the complete history."""
    conv, turns = promoted_conversation(gw, turns=1)
    identity = TurnIdentity.conversation(gw.tenant_id, conv, uid("resp"), 1)
    second = gw.turn(identity, [user("again")], [assistant("hello again")])
    answers: list = []

    def wait() -> None:
        answers.append(httpx.get(
            f"{e2e_stack.base_url}/v1/responses/{second.response_id}/history",
            params={"tenant_id": gw.tenant_id, "fingerprint_hash": gw.fingerprint_hash,
                    "wait_ms": WAIT_MS},
            timeout=WAIT_MS / 1000 + 10))

    waiter = threading.Thread(target=wait)
    started = time.monotonic()
    waiter.start()
    time.sleep(0.5)  # the request is waiting before the turn is even produced
    gw.publish(second)
    waiter.join()
    assert time.monotonic() - started < WAIT_MS / 1000 - 1  # woken, not the deadline
    body = answers[0].json()
    assert answers[0].status_code == 200 and body["outcome"] == "certified", body
    assert (body["response_id"], body["head_seq"]) == (second.response_id, 2)
    assert [i["item_id"] for i in body["items"]] == [
        item.item_id for turn in (*turns, second) for item in turn.items]


def test_rejected_turn_is_409_not_promoted_and_status_says_why(gw, e2e_stack):
    identity = TurnIdentity.conversation(gw.tenant_id, uid("conv"), uid("resp"), 5)
    turn = gw.turn(identity, [user("hi")], [assistant("hello")])  # head is 0: OUT_OF_ORDER
    gw.publish(turn)
    outcome = gw.rehydrate(turn.response_id, wait_ms=WAIT_MS)
    assert isinstance(outcome, Failure) and (outcome.reason, outcome.http_status) == (
        "NOT_PROMOTED",
        409,
    )
    assert "OUT_OF_ORDER" in (outcome.detail or "")
    status = e2e_stack.client.status(gw.tenant_id, turn.response_id)
    assert (status.state, status.reason) == ("rejected", "OUT_OF_ORDER")


def test_wait_ms_gives_up_at_its_deadline(gw):
    started = time.monotonic()
    outcome = gw.rehydrate(uid("resp"), wait_ms=1_000)
    assert 1.0 <= time.monotonic() - started < 3
    assert outcome == Failure("NOT_PROMOTED", 409, outcome.response_id, outcome.detail)


# --- integrity: corrupt the stored rows, the API must refuse the whole history -------
#
# The rows are damaged AFTER the histories were read (and cached) by the promotions'
# own lookups; a cached, verified history keeps being served (CONTRACT section 5), so
# these reads ask for a load (``Cache-Control: no-cache``), which verifies every row.
# What a plain lookup does after such damage is pinned in test_http_cache.py.

NO_CACHE = {"Cache-Control": "no-cache"}


# Items travel in their turn row (``turns.items``, one blob of item records: item_seq,
# item_id, item_type, role, call_id, content, content_digest, format_version), so
# damaging one item rewrites that cell with the item altered or removed.
_ITEM_FIELD = {"item_type": 2, "content": 5, "content_digest": 6, "format_version": 7}


def _first_turn(cql, tenant, conv):
    return cql.execute(
        "SELECT ref, items FROM turns WHERE tenant_id = %s AND partition_key = %s "
        "AND kind = 'checkpoint' LIMIT 1",
        (tenant, conv),
    ).one()


def _rewrite_first_turn_items(cql, tenant, conv, change):
    from services.store.rows import decode_turn_items, encode_turn_items

    row = _first_turn(cql, tenant, conv)
    items = [list(record) for record in decode_turn_items(row.items)]
    change(items)
    cql.execute(
        "UPDATE turns SET items = %s WHERE tenant_id = %s AND partition_key = %s "
        "AND kind = 'checkpoint' AND ref = %s",
        (encode_turn_items(items), tenant, conv, row.ref),
    )


def _corrupt(cql, tenant, conv, field, value):
    def change(items):
        items[0][_ITEM_FIELD[field]] = value

    _rewrite_first_turn_items(cql, tenant, conv, change)


CORRUPTIONS = {
    "CORRUPT_HISTORY": lambda cql, t, c: _corrupt(cql, t, c, "content", b'{"x":1}'),
    "CORRUPT_HISTORY/null-content": lambda cql, t, c: _corrupt(cql, t, c, "content", None),
    "CORRUPT_HISTORY/null-digest": lambda cql, t, c: _corrupt(cql, t, c, "content_digest", None),
    "UNKNOWN_ITEM_TYPE": lambda cql, t, c: _corrupt(cql, t, c, "item_type", "hologram"),
    "UNSUPPORTED_FORMAT": lambda cql, t, c: _corrupt(cql, t, c, "format_version", 99),
    "MISSING_HISTORY": lambda cql, t, c: _rewrite_first_turn_items(
        cql, t, c, lambda items: items.pop(0)
    ),
}


@pytest.mark.parametrize("reason", sorted(CORRUPTIONS))
def test_integrity_failure_is_500_with_its_reason_and_no_items(gw, cql, e2e_stack, reason):
    conv, turns = promoted_conversation(gw, turns=2)
    CORRUPTIONS[reason](cql, gw.tenant_id, conv)
    for url in (
        f"/v1/responses/{turns[-1].response_id}/history",
        f"/v1/conversations/{conv}/history",
    ):
        resp = httpx.get(
            e2e_stack.base_url + url,
            params={"tenant_id": gw.tenant_id, "fingerprint_hash": gw.fingerprint_hash},
            headers=NO_CACHE,
        )
        assert resp.status_code == 500, resp.text
        body = resp.json()
        assert (body["outcome"], body["reason"]) == ("failure", reason.split("/")[0])
        assert body["items"] is None and body["checkpoint"] is None


def test_expired_history_is_410(gw, cql, e2e_stack):
    conv, turns = promoted_conversation(gw, turns=1)
    cql.execute(
        "UPDATE turns SET logical_expires_at = %s WHERE tenant_id = %s AND "
        "partition_key = %s AND kind = 'checkpoint' AND ref = %s",
        (1000, gw.tenant_id, conv, turns[0].response_id),
    )
    resp = httpx.get(
        f"{e2e_stack.base_url}/v1/responses/{turns[0].response_id}/history",
        params={"tenant_id": gw.tenant_id, "fingerprint_hash": gw.fingerprint_hash},
        headers=NO_CACHE,
    )
    assert (resp.status_code, resp.json()["reason"]) == (410, "EXPIRED")
