"""Rehydration latency through HTTP beside its floors, in one run (issue #6).

Setup (a keyspace of its own, dropped at the end): one Conversation of 50 turns
(2 items of ~500 bytes each: 100 items), promoted directly through the Cassandra store,
and a ``ratchet api`` child process (real uvicorn, loopback TCP). Then, sequentially
(concurrency 1, keep-alive), one of each per round, interleaved:

- raw Cassandra SELECT of the history rows (the floor of any full read), and the raw
  stamp query a cache hit runs instead (services/api/cache.py);
- ``store.read_history`` in this process (Cassandra read + decoding + verification);
- the API's rendering in process (rehydrate + render + JSON), no I/O;
- both history endpoints COLD (``Cache-Control: no-cache``: the full read, verification
  and rendering of a cache miss) and WARM (a cache hit: one stamp query);
- the warm response lookup through httpx with JSON parsing (what a Python gateway sees).

Target: HTTP p99 <= 5 ms. Run ``python -m ratchet.bench.api``; ``run()`` returns
the figures.
"""

from __future__ import annotations

import http.client
import logging
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlencode

import httpx
from cassandra import ConsistencyLevel
from cassandra.cluster import EXEC_PROFILE_DEFAULT

from ratchet.bench.store import Figure, percentile
from ratchet.domain.fingerprint import fingerprint_hash
from ratchet.domain.history import PromotionMode, StoredTokenArtifact, VerifiedHistory
from ratchet.samples import make_fingerprint
from ratchet.settings import Settings
from schemas.models import Certification
from services.api.render import history_outcome_body
from services.gateway.events import to_item

TURNS = 50
ITEM_TEXT_BYTES = 500


def _conversation(store, tenant: str, conversation: str, fp_hash: str) -> str:
    from ratchet.domain.plan import Promoted, PromotionRequest

    text = "x" * ITEM_TEXT_BYTES
    response_id = ""
    for head in range(TURNS):
        response_id = f"resp_{uuid.uuid4().hex[:12]}"
        items = (
            to_item(
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": f"{head} {text}"}],
                },
                default_id=f"{response_id}:in:0",
            ),
            to_item(
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": f"{head} {text}"}],
                },
                default_id=f"{response_id}:out:0",
            ),
        )
        artifact = StoredTokenArtifact(
            f"art_{response_id}", "th", 100 * (head + 1), 100 * (head + 1), fp_hash, None
        )
        outcome = store.promote(
            PromotionRequest(
                tenant_id=tenant,
                partition_key=conversation,
                mode=PromotionMode.CONVERSATION,
                response_id=response_id,
                idempotency_key=f"idem_{response_id}",
                request_digest=fp_hash,
                items=items,
                certification=Certification.CERTIFIED,
                fingerprint_hash=fp_hash,
                expected_head_seq=head,
                token_artifact=artifact,
            )
        )
        assert isinstance(outcome, Promoted), outcome
    return response_id


def run(settings: Settings | None = None, *, reads: int = 500) -> list[Figure]:
    from cassandra.cluster import Cluster
    from cassandra.query import tuple_factory

    from infra.migrate import apply_migrations
    from services.demo.processes import free_port, start_api, wait_api_ready
    from services.store.base import StoreOptions
    from services.store.cassandra import CassandraCheckpointStore
    from services.store.stamps import STAMP_CQL

    logging.getLogger("cassandra").setLevel(logging.ERROR)
    settings = settings or Settings.from_env()
    bench = replace(
        settings,
        keyspace=f"{settings.keyspace}_apibench_{uuid.uuid4().hex[:6]}",
        api_host="127.0.0.1",
        api_port=free_port(),
    )
    cluster = Cluster(list(bench.cassandra_hosts), port=bench.cassandra_port)
    api = None
    try:
        apply_migrations(cluster, bench)
        session = cluster.connect(bench.keyspace)
        store = CassandraCheckpointStore(session, StoreOptions())
        tenant, conversation = "bench-tenant", f"conv_{uuid.uuid4().hex[:8]}"
        fp_hash = fingerprint_hash(make_fingerprint())
        head = _conversation(store, tenant, conversation, fp_hash)
        history = store.read_history(tenant, response_id=head)
        assert isinstance(history, VerifiedHistory) and len(history.items) == 2 * TURNS

        api = start_api(bench, Path(tempfile.mkdtemp(prefix="ratchet-apibench-")))
        base_url = f"http://127.0.0.1:{bench.api_port}"
        wait_api_ready(api, base_url, require_notifier=False)
        raw_rows = session.prepare(
            "SELECT * FROM turns WHERE tenant_id = ? AND partition_key = ? "
            "AND kind IN ('checkpoint', 'head')"
        )
        raw_stamp = session.prepare(STAMP_CQL)
        for statement in (raw_rows, raw_stamp):
            statement.consistency_level = ConsistencyLevel.LOCAL_QUORUM
        plain = session.execution_profile_clone_update(
            EXEC_PROFILE_DEFAULT, row_factory=tuple_factory
        )
        query = urlencode({"tenant_id": tenant, "fingerprint_hash": fp_hash})
        by_response = f"/v1/responses/{head}/history?{query}"
        by_conversation = f"/v1/conversations/{conversation}/history?{query}"
        # A light HTTP/1.1 keep-alive client (stdlib): the figures are the service's,
        # not a Python client's; httpx with JSON parsing is one extra line below.
        conn = http.client.HTTPConnection("127.0.0.1", bench.api_port, timeout=10)
        with httpx.Client(base_url=base_url, timeout=10) as client:

            def get(path: str, headers: dict[str, str]) -> None:
                conn.request("GET", path, headers=headers)
                resp = conn.getresponse()
                body = resp.read()
                assert resp.status == 200 and body.startswith(_CERTIFIED), body[:200]

            def raw_select(w: int, i: int) -> None:
                rows = session.execute(raw_rows, (tenant, conversation), execution_profile=plain)
                assert len(list(rows)) == TURNS + 1

            def raw_stamp_select(w: int, i: int) -> None:
                rows = session.execute(raw_stamp, (tenant, conversation), execution_profile=plain)
                assert len(list(rows)) == TURNS + 1

            def direct(w: int, i: int) -> None:
                assert isinstance(store.read_history(tenant, response_id=head), VerifiedHistory)

            def render(w: int, i: int) -> None:
                body, _ = history_outcome_body(history, fp_hash, datetime.now(UTC))
                body.model_dump_json()

            def response_cold(w: int, i: int) -> None:
                get(by_response, _NO_CACHE)

            def response_warm(w: int, i: int) -> None:
                get(by_response, {})

            def conversation_cold(w: int, i: int) -> None:
                get(by_conversation, _NO_CACHE)

            def conversation_warm(w: int, i: int) -> None:
                get(by_conversation, {})

            def httpx_warm(w: int, i: int) -> None:
                resp = client.get(by_response)
                assert resp.status_code == 200 and len(resp.json()["items"]) == 2 * TURNS

            ops = {
                "raw SELECT history rows (51 rows)": raw_select,
                "raw SELECT stamp (51 rows, writetimes)": raw_stamp_select,
                f"store.read_history ({2 * TURNS} items)": direct,
                "API rendering only (in process)": render,
                "HTTP responses/{id} cold (miss)": response_cold,
                "HTTP responses/{id} warm (hit)": response_warm,
                "HTTP conversations/{id} cold (miss)": conversation_cold,
                "HTTP conversations/{id} warm (hit)": conversation_warm,
                "HTTP responses/{id} warm, httpx+json": httpx_warm,
            }
            for op in ops.values():  # warm caches, pools and the JIT
                for i in range(30):
                    op(0, i)
            figures = _interleaved(ops, reads)
            _print_server_side(client.get("/metrics").text)
            conn.close()
            return figures
    finally:
        if api is not None:
            api.stop()
        session = cluster.connect()
        session.execute(f"DROP KEYSPACE IF EXISTS {bench.keyspace}", timeout=120)
        cluster.shutdown()


_CERTIFIED = b'{"outcome":"certified"'
_NO_CACHE = {"Cache-Control": "no-cache"}


def _interleaved(ops: dict[str, Callable[[int, int], None]], rounds: int) -> list[Figure]:
    """Each op once per round, in turn: a load spike from the other users of this
    machine hits every line alike instead of whichever block ran during it."""
    samples: dict[str, list[float]] = {name: [] for name in ops}
    for i in range(rounds):
        for name, op in ops.items():
            start = time.perf_counter()
            op(0, i)
            samples[name].append((time.perf_counter() - start) * 1000)
    return [
        Figure(
            name,
            1,
            len(values),
            round(percentile(values, 0.5), 2),
            round(percentile(values, 0.99), 2),
        )
        for name, values in samples.items()
    ]


def _print_server_side(metrics_text: str) -> None:
    """Means the API measured itself: lookup (stamp, or full read) vs whole request."""
    values: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if line.startswith(("ratchet_api_lookup_seconds_", "ratchet_api_request_seconds_")) and (
            'endpoint="response"' in line and ("_sum{" in line or "_count{" in line)
        ):
            name, value = line.rsplit(" ", 1)
            values[name.split("{")[0]] = float(value)
    lookup = values["ratchet_api_lookup_seconds_sum"] / values["ratchet_api_lookup_seconds_count"]
    request = (
        values["ratchet_api_request_seconds_sum"] / values["ratchet_api_request_seconds_count"]
    )
    print(
        "API server side, responses endpoint, mean over hits and misses (warm-up included): "
        f"lookup {lookup * 1000:.2f} ms, whole request in the handler {request * 1000:.2f} ms"
    )


TARGET_MS = 5.0


def format_table(figures: list[Figure], load_before: tuple[float, ...]) -> str:
    """The figures side by side, with the load average before and after the run."""
    before = ", ".join(f"{x:.1f}" for x in load_before)
    after = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    rows = [
        f"load average {before} before, {after} after, on {os.cpu_count()} cores",
        f"{'operation (sequential, interleaved)':<40} {'n':>5} {'p50 ms':>8} {'p99 ms':>8}"
        f" {'p99 target':>11}",
    ]
    for f in figures:
        verdict = ""
        if f.name.startswith("HTTP"):
            verdict = f"{TARGET_MS:.0f} {'ok' if f.p99_ms <= TARGET_MS else 'MISS'}"
        rows.append(f"{f.name:<40} {f.samples:>5} {f.p50_ms:>8.2f} {f.p99_ms:>8.2f} {verdict:>11}")
    return "\n".join(rows)


def main() -> None:
    started = time.monotonic()
    load_before = os.getloadavg()
    print(format_table(run(), load_before))
    print(f"(measured in {time.monotonic() - started:.0f} s; target: HTTP p99 <= 5 ms)")


if __name__ == "__main__":
    main()
