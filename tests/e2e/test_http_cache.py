"""The API's verified-history cache against real Cassandra rows (services/api/cache.py).

What is pinned: a cache hit answers exactly what a full read would, because every hit
is revalidated by the write timestamps of the verified rows. So a row rewritten after
it was verified AND served from the cache is caught by the very next lookup, and a row
that breaks the Conversation's one-turn-per-seq rule is caught although it is not in
the cached lineage. The API's own counters say which path each lookup took.
"""

from __future__ import annotations

import re

import httpx
import pytest

from services.demo.simulator import SimulatedGateway
from tests.e2e.helpers import promoted_conversation
from tests.e2e.test_http_failures import _corrupt


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
    full, _ = lookups.get(endpoint, **{"Cache-Control": "no-cache"})
    hit, moved = lookups.get(endpoint)
    assert moved == {"hit": 1}
    assert hit.status_code == full.status_code == 200
    assert hit.content == full.content


@pytest.mark.parametrize("endpoint", ["response", "conversation"])
def test_a_row_rewritten_after_a_hit_fails_the_next_lookup(gw, cql, e2e_stack, endpoint):
    conv, turns = promoted_conversation(gw, turns=2)
    lookups = Lookups(e2e_stack, gw, conv, turns[-1].response_id)
    lookups.get(endpoint)
    served, moved = lookups.get(endpoint)
    assert served.status_code == 200 and moved == {"hit": 1}

    _corrupt(cql, gw.tenant_id, conv, "content", b'{"x":1}')  # first turn, first item
    failed, moved = lookups.get(endpoint)
    assert moved == {"stale": 1}
    assert failed.status_code == 500, failed.text
    assert (failed.json()["reason"], failed.json()["items"]) == ("CORRUPT_HISTORY", None)
    again, moved = lookups.get(endpoint)  # a failure is never cached
    assert again.status_code == 500 and "hit" not in moved


def test_an_unchanged_rewrite_still_revalidates(gw, cql, e2e_stack):
    """Same bytes, newer write: the stamp differs, the full read confirms, and the
    history is cached again (the revalidation watches writes, not values)."""
    conv, turns = promoted_conversation(gw, turns=1)
    lookups = Lookups(e2e_stack, gw, conv, turns[-1].response_id)
    lookups.get("response")
    row = cql.execute(
        "SELECT ref, items FROM turns WHERE tenant_id = %s AND partition_key = %s "
        "AND kind = 'checkpoint'",
        (gw.tenant_id, conv),
    ).one()
    cql.execute(
        "UPDATE turns SET items = %s WHERE tenant_id = %s AND partition_key = %s "
        "AND kind = 'checkpoint' AND ref = %s",
        (row.items, gw.tenant_id, conv, row.ref),
    )
    resp, moved = lookups.get("response")
    assert resp.status_code == 200 and moved == {"stale": 1}
    resp, moved = lookups.get("response")
    assert resp.status_code == 200 and moved == {"hit": 1}


def test_a_second_turn_at_a_taken_seq_outside_the_lineage_is_caught(gw, cql, e2e_stack):
    conv, turns = promoted_conversation(gw, turns=2)
    lookups = Lookups(e2e_stack, gw, conv, turns[-1].response_id)
    lookups.get("conversation")
    _, moved = lookups.get("conversation")
    assert moved == {"hit": 1}
    # A decodable checkpoint row nobody promoted, at seq 1 (the lineage's rows are
    # untouched): verification refuses a Conversation with two turns at one seq.
    cql.execute(
        "INSERT INTO turns (tenant_id, partition_key, kind, ref, response_id, seq, mode, "
        "certification, promoted_at, first_item_seq, last_item_seq, items_digest) "
        "VALUES (%s, %s, 'checkpoint', 'resp_forged', 'resp_forged', 1, 'conversation', "
        "'logical_only', toTimestamp(now()), 1, 0, 'x')",
        (gw.tenant_id, conv),
    )
    for endpoint in ("conversation", "response"):
        resp, moved = lookups.get(endpoint)
        assert resp.status_code == 500, resp.text
        assert resp.json()["reason"] == "CORRUPT_HISTORY" and "hit" not in moved
