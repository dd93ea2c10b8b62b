"""The API's verified-history cache against real Cassandra rows (services/api/cache.py).

What is pinned: a history verified when its rows were LOADED is served from memory,
byte-identical to a full read, without reading it again (a Conversation lookup reads
its head). Rows damaged after that are caught by what loads them: a
``Cache-Control: no-cache`` read, or an extension reading a new turn (its row and its
lineage-digest link); a plain hit keeps serving the verified bytes. The API's own
counters say which path each lookup took.
"""

from __future__ import annotations

import re
import time

import httpx
import pytest

from services.demo.simulator import SimulatedGateway, assistant, uid, user
from services.gateway.events import TurnIdentity
from tests.e2e.helpers import WAIT_MS, promoted_conversation
from tests.e2e.test_http_failures import _corrupt

NO_CACHE = {"Cache-Control": "no-cache"}


@pytest.fixture
def gw(e2e_stack) -> SimulatedGateway:
    return SimulatedGateway(e2e_stack.producer, e2e_stack.client)


def _cache_counts(base_url: str) -> dict[tuple[str, str], float]:
    text = httpx.get(f"{base_url}/metrics").text
    pattern = re.compile(
        r'^ratchet_api_history_cache_total\{endpoint="(\w+)",result="(\w+)"\} (\S+)$', re.M
    )
    return {(e, r): float(v) for e, r, v in pattern.findall(text)}


class Lookups:
    def __init__(self, stack, gw: SimulatedGateway, conv: str, response_id: str) -> None:
        self.base_url = stack.base_url
        self.params = {"tenant_id": gw.tenant_id, "fingerprint_hash": gw.fingerprint_hash}
        self.urls = {
            "response": f"/v1/responses/{response_id}/history",
            "conversation": f"/v1/conversations/{conv}/history",
        }

    def get(self, endpoint: str, **headers: str) -> tuple[httpx.Response, dict[str, float]]:
        """One lookup and how the cache counters moved during it."""
        before = _cache_counts(self.base_url)
        resp = httpx.get(self.base_url + self.urls[endpoint], params=self.params, headers=headers)
        after = _cache_counts(self.base_url)
        moved = {r: after[(e, r)] - before.get((e, r), 0) for (e, r) in after if e == endpoint}
        return resp, {r: n for r, n in moved.items() if n}


@pytest.mark.parametrize("endpoint", ["response", "conversation"])
def test_a_hit_answers_like_a_full_read(gw, e2e_stack, endpoint):
    conv, turns = promoted_conversation(gw, turns=2)
    lookups = Lookups(e2e_stack, gw, conv, turns[-1].response_id)
    full, _ = lookups.get(endpoint, **NO_CACHE)
    hit, moved = lookups.get(endpoint)
    assert moved == {"hit": 1}
    assert hit.status_code == full.status_code == 200
    assert hit.content == full.content


@pytest.mark.parametrize("endpoint", ["response", "conversation"])
def test_a_row_rewritten_after_caching_is_caught_by_a_load_not_by_a_hit(
    gw, cql, e2e_stack, endpoint
):
    conv, turns = promoted_conversation(gw, turns=2)
    lookups = Lookups(e2e_stack, gw, conv, turns[-1].response_id)
    lookups.get(endpoint)
    served, moved = lookups.get(endpoint)
    assert served.status_code == 200 and moved == {"hit": 1}

    _corrupt(cql, gw.tenant_id, conv, "content", b'{"x":1}')  # first turn, first item
    again, moved = lookups.get(endpoint)
    assert moved == {"hit": 1} and again.content == served.content
    failed, moved = lookups.get(endpoint, **NO_CACHE)
    assert moved == {"bypass": 1}
    assert failed.status_code == 500, failed.text
    assert (failed.json()["reason"], failed.json()["items"]) == ("CORRUPT_HISTORY", None)


def _next_turn(gw, conv: str, head: int):
    turn = gw.turn(
        TurnIdentity.conversation(gw.tenant_id, conv, uid("resp"), head),
        [user(f"question {head}")],
        [assistant(f"answer {head}")],
    )
    gw.publish(turn)
    return turn


def _wait_promoted(e2e_stack, gw, response_id: str) -> None:
    deadline = time.monotonic() + WAIT_MS / 1000
    while e2e_stack.client.status(gw.tenant_id, response_id).state != "promoted":
        assert time.monotonic() < deadline, "the turn was not promoted"
        time.sleep(0.05)


def test_a_new_turn_extends_the_cached_history_like_a_full_read(gw, e2e_stack):
    conv, turns = promoted_conversation(gw, turns=2)
    lookups = Lookups(e2e_stack, gw, conv, turns[-1].response_id)
    lookups.get("conversation")
    third = _next_turn(gw, conv, 2)
    _wait_promoted(e2e_stack, gw, third.response_id)
    extended, moved = lookups.get("conversation")
    # The pre-warmer may have extended it already (a hit); otherwise this lookup did.
    assert moved in ({"hit": 1}, {"extended": 1}), moved
    body = extended.json()
    assert (body["response_id"], body["head_seq"], len(body["items"])) == (
        third.response_id, 3, 6)
    full, _ = lookups.get("conversation", **NO_CACHE)
    assert extended.content == full.content


def test_a_partition_hint_finds_the_response_and_a_wrong_one_is_not_trusted(gw, e2e_stack):
    """Each hint on a new turn: right, another Conversation of the tenant, unknown. The
    answer is the full read's whichever it names (docs/service.md, "Partition hint")."""
    conv, turns = promoted_conversation(gw, turns=2)
    other_conv, _ = promoted_conversation(gw, turns=1)
    lookups = Lookups(e2e_stack, gw, conv, turns[-1].response_id)
    lookups.get("response")
    for head, hint in enumerate((conv, other_conv, uid("conv")), start=2):
        turn = _next_turn(gw, conv, head)
        _wait_promoted(e2e_stack, gw, turn.response_id)
        lookups.urls["response"] = f"/v1/responses/{turn.response_id}/history"
        lookups.params["partition_key"] = hint
        resp, moved = lookups.get("response")
        # The pre-warmer may have extended it already (a hit); otherwise this lookup did.
        assert moved in ({"hit": 1}, {"extended": 1}), (hint, moved)
        full, _ = lookups.get("response", **NO_CACHE)
        assert resp.status_code == full.status_code == 200
        assert resp.content == full.content


@pytest.mark.parametrize("damage", ["item", "lineage"])
def test_an_extension_catches_a_damaged_new_row(gw, cql, e2e_stack, damage):
    """With the pre-warmer racing the damage, the new row is loaded either before it
    (then a no-cache read catches it) or after (then the extension does, or, for a
    lineage digest, which the head cells hold too, the full read the extension defers
    to under a head its row no longer backs: session 30): whichever loads the damaged
    row answers CORRUPT_HISTORY, and a lookup never serves it."""
    conv, turns = promoted_conversation(gw, turns=2)
    lookups = Lookups(e2e_stack, gw, conv, turns[-1].response_id)
    lookups.get("conversation")
    third = _next_turn(gw, conv, 2)
    _wait_promoted(e2e_stack, gw, third.response_id)
    if damage == "item":
        _rewrite_turn_items(cql, gw.tenant_id, conv, third.response_id)
    else:
        cql.execute(
            "UPDATE turns SET lineage_digest = %s WHERE tenant_id = %s AND partition_key = %s "
            "AND kind = 'checkpoint' AND ref = %s",
            ("0" * 64, gw.tenant_id, conv, third.response_id),
        )
    resp, moved = lookups.get("conversation")
    if moved == {"hit": 1}:  # warmed before the damage: the verified history is served
        assert resp.status_code == 200
    else:
        assert moved in ({"extended": 1}, {"miss": 1}), moved
        assert resp.status_code == 500 and resp.json()["reason"] == "CORRUPT_HISTORY"
    fresh, _ = lookups.get("conversation", **NO_CACHE)
    assert fresh.status_code == 500 and fresh.json()["reason"] == "CORRUPT_HISTORY"


def _rewrite_turn_items(cql, tenant: str, conv: str, ref: str) -> None:
    from services.store.rows import decode_turn_items, encode_turn_items

    row = cql.execute(
        "SELECT items FROM turns WHERE tenant_id = %s AND partition_key = %s "
        "AND kind = 'checkpoint' AND ref = %s",
        (tenant, conv, ref),
    ).one()
    items = [list(record) for record in decode_turn_items(row.items)]
    items[0][5] = b'{"x":1}'  # content no longer matches its digest
    cql.execute(
        "UPDATE turns SET items = %s WHERE tenant_id = %s AND partition_key = %s "
        "AND kind = 'checkpoint' AND ref = %s",
        (encode_turn_items(items), tenant, conv, ref),
    )


def test_a_promotion_prewarms_the_next_lookup(gw, e2e_stack):
    conv, turns = promoted_conversation(gw, turns=2)
    third = _next_turn(gw, conv, 2)
    _wait_promoted(e2e_stack, gw, third.response_id)
    lookups = Lookups(e2e_stack, gw, conv, third.response_id)
    deadline = time.monotonic() + 5
    while _prewarmed(e2e_stack.base_url) == 0:  # the record reaches the API soon after
        assert time.monotonic() < deadline, "no promotion record was used to warm"
        time.sleep(0.05)
    resp, moved = lookups.get("response")
    assert resp.status_code == 200 and moved == {"hit": 1}


def _prewarmed(base_url: str) -> float:
    text = httpx.get(f"{base_url}/metrics").text
    found = re.search(r'^ratchet_api_history_prewarm_total\{result="warmed"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_another_tenant_never_gets_a_cached_history(gw, e2e_stack):
    conv, turns = promoted_conversation(gw, turns=1)
    for url in (f"/v1/responses/{turns[0].response_id}/history",
                f"/v1/conversations/{conv}/history"):
        resp = httpx.get(e2e_stack.base_url + url,
                         params={"tenant_id": "another-tenant",
                                 "fingerprint_hash": gw.fingerprint_hash})
        assert resp.status_code == 404 and resp.json()["reason"] == "NOT_FOUND"
