"""Rehydration latency through HTTP, printed beside the store's direct read, one run.

Setup (a keyspace of its own, dropped at the end): one Conversation of 50 turns
(2 items of ~500 bytes each: 100 items), promoted directly through the Cassandra store.
Then, sequentially (concurrency 1, keep-alive connection):

- ``store.read_history`` in this process (the floor: Cassandra read + verification);
- the API's own work in process (rehydrate + render + JSON), no I/O;
- ``GET /v1/responses/{head}/history`` against a ``ratchet api`` child process;
- ``GET /v1/conversations/{id}/history`` against the same process.

Target: HTTP p99 <= 5 ms. The API runs as a real separate process on loopback TCP, so
the difference to the store line is JSON rendering, HTTP and the thread-pool hop.
Run ``python -m ratchet.bench.api``; ``run()`` returns the figures.
"""

from __future__ import annotations

import logging
import tempfile
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import httpx

from ratchet.bench.store import Figure, format_table, measure
from ratchet.domain.fingerprint import fingerprint_hash
from ratchet.domain.history import Certification, PromotionMode, TokenArtifact, VerifiedHistory
from ratchet.settings import Settings
from schemas.samples import make_fingerprint
from services.api.render import history_outcome_body
from services.gateway.events import to_item

TURNS = 50
ITEM_TEXT_BYTES = 500


def _conversation(store, tenant: str, conversation: str, fp_hash: str) -> str:
    from services.store.base import Promoted, PromotionRequest

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
        artifact = TokenArtifact(
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

    from infra.migrate import apply_migrations
    from services.demo.processes import free_port, start_api, wait_api_ready
    from services.store.base import StoreOptions
    from services.store.cassandra import CassandraCheckpointStore

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
        store = CassandraCheckpointStore(cluster.connect(bench.keyspace), StoreOptions())
        tenant, conversation = "bench-tenant", f"conv_{uuid.uuid4().hex[:8]}"
        fp_hash = fingerprint_hash(make_fingerprint())
        head = _conversation(store, tenant, conversation, fp_hash)
        history = store.read_history(tenant, response_id=head)
        assert isinstance(history, VerifiedHistory) and len(history.items) == 2 * TURNS

        api = start_api(bench, Path(tempfile.mkdtemp(prefix="ratchet-apibench-")))
        base_url = f"http://127.0.0.1:{bench.api_port}"
        wait_api_ready(api, base_url, require_notifier=False)
        params = {"tenant_id": tenant, "fingerprint_hash": fp_hash}
        with httpx.Client(base_url=base_url, timeout=10) as http:

            def direct(w: int, i: int) -> None:
                assert isinstance(store.read_history(tenant, response_id=head), VerifiedHistory)

            def render(w: int, i: int) -> None:
                body, _ = history_outcome_body(history, fp_hash, datetime.now(UTC))
                body.model_dump_json()

            def by_response(w: int, i: int) -> None:
                resp = http.get(f"/v1/responses/{head}/history", params=params)
                assert resp.status_code == 200 and len(resp.json()["items"]) == 2 * TURNS

            def by_conversation(w: int, i: int) -> None:
                resp = http.get(f"/v1/conversations/{conversation}/history", params=params)
                assert resp.status_code == 200 and resp.json()["outcome"] == "certified"

            for op in (direct, render, by_response, by_conversation):  # warm caches and pools
                for i in range(30):
                    op(0, i)
            figures = [
                measure(f"store.read_history ({2 * TURNS} items)", 1, reads, direct),
                measure("API rendering only (in process)", 1, reads, render),
                measure("HTTP GET responses/{id}/history", 1, reads, by_response),
                measure("HTTP GET conversations/{id}/history", 1, reads, by_conversation),
            ]
            _print_server_side(http.get("/metrics").text)
            return figures
    finally:
        if api is not None:
            api.stop()
        session = cluster.connect()
        session.execute(f"DROP KEYSPACE IF EXISTS {bench.keyspace}", timeout=120)
        cluster.shutdown()


def _print_server_side(metrics_text: str) -> None:
    """Means the API measured itself (warm-up included): store read vs whole request."""
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
        f"API server side, responses endpoint, mean: store read {lookup * 1000:.2f} ms, "
        f"whole request in the handler {request * 1000:.2f} ms"
    )


def main() -> None:
    started = time.monotonic()
    print(format_table(run()))
    print(f"(measured in {time.monotonic() - started:.0f} s; target: HTTP p99 <= 5 ms)")


if __name__ == "__main__":
    main()
