"""Store latency on the local Cassandra, next to a raw Cassandra baseline.

Measured in one run, in a keyspace of its own (created, then dropped):

- ``promote`` p50/p99 at concurrency 1 and 16 (target p99 <= 10 ms), each call a new
  turn of 2 items (~1 KiB each) on the promoter's own Conversation; baseline: a plain
  single-row ``INSERT ... IF NOT EXISTS`` at the same concurrency. The store knows the
  head from its previous promotion, as a worker does (or from the read it makes before
  promoting): the one-LWT fast path.
- ``claim_effect`` (claim before execute, ledger) at concurrency 1 and 16, beside the
  same raw LWT: a new claim (one conditional batch: the claim row and the request's
  cancellation condition) and, at concurrency 1, the claim of a completed effect (a
  retry reusing the output: the LWT is not applied and answers with the stored claim).
  Beside it, the claims API's writes for a new claim: the request's conditional facts
  marks before and after the claim, which learn whether the request stands promoted
  (``mark_claim``), and the same with the plain marks they replaced.
- ``promote, no hint`` at concurrency 1: a store without hints (``hint_capacity=0``),
  so every turn after the first reads the view at SERIAL first (two Paxos rounds): the
  cost of the path a stale hint falls back to.
- ``read_history`` of a 50-turn Conversation (100 items) p50/p99 (target p99 <= 5 ms),
  verification included, by Conversation id and by response id; baselines: a plain
  ``SELECT *`` of the same partition of ``turns`` (50 turn rows, 50 idempotency rows,
  the head marker), and the store's own history query (no idempotency rows) without
  decoding or verification.

Run ``python -m ratchet.bench.store`` (``RATCHET_*`` variables pick the cluster).
``run()`` returns the figures for a ``ratchet bench`` command.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace

from ratchet.domain.history import PromotionMode, VerifiedHistory
from ratchet.settings import Settings
from schemas.models import Certification, Item


@dataclass(frozen=True)
class Figure:
    """Latency percentiles of one measured operation, in milliseconds."""

    name: str
    concurrency: int
    samples: int
    p50_ms: float
    p99_ms: float


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def measure(name: str, concurrency: int, per_worker: int, op: Callable[[int, int], None]) -> Figure:
    """Run ``op(worker, i)`` ``per_worker`` times in each of ``concurrency`` threads."""
    samples: list[float] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker(w: int) -> None:
        local = []
        try:
            for i in range(per_worker):
                start = time.perf_counter()
                op(w, i)
                local.append((time.perf_counter() - start) * 1000)
        except BaseException as exc:  # reported after the run
            errors.append(exc)
        with lock:
            samples.extend(local)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return Figure(
        name,
        concurrency,
        len(samples),
        round(percentile(samples, 0.5), 2),
        round(percentile(samples, 0.99), 2),
    )


def _item(text: str) -> Item:
    # The content says what the record says (type, role), as a promoted item must.
    content = json.dumps({"type": "message", "role": "user", "text": text,
                          "pad": "x" * 1000}).encode()
    return Item(
        item_id=uuid.uuid4().hex,
        type="message",
        role="user",
        content=content,
        content_digest=hashlib.sha256(content).hexdigest(),
    )


def _turn(tenant: str, conversation: str, expected: int):
    from ratchet.domain.plan import PromotionRequest

    key = uuid.uuid4().hex
    return PromotionRequest(
        tenant_id=tenant,
        partition_key=conversation,
        mode=PromotionMode.CONVERSATION,
        response_id=f"resp_{key}",
        idempotency_key=key,
        request_digest=key,
        items=(_item("question"), _item("answer")),
        certification=Certification.LOGICAL_ONLY,
        expected_head_seq=expected,
    )


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _claim(tenant: str, request: str, occurrence: int):
    """A claim of the ``occurrence``-th call of one tool in request ``request``."""
    from ratchet.domain.claims import ClaimRequest, EffectPolicy, effect_id_for_claim

    key = f"idem_{request}"
    return ClaimRequest(tenant, key, effect_id_for_claim(key, 0, "send_email", occurrence),
                        attempt=1, subturn_index=0, call_id=f"call_{uuid.uuid4().hex[:8]}",
                        tool_name="send_email", arguments_digest="0" * 64,
                        token=uuid.uuid4().hex, lease_ms=30_000,
                        policy=EffectPolicy.AT_MOST_ONCE)


def _create_keyspace(cluster, settings: Settings):
    """The bench's keyspace at the schema this tree defines (every migration, applied
    by the project's own migrator) and the raw baseline's table."""
    from infra.migrate import apply_migrations

    apply_migrations(cluster, settings)
    session = cluster.connect(settings.keyspace)
    session.execute(
        "CREATE TABLE IF NOT EXISTS raw_baseline (k text, c text, v blob, PRIMARY KEY (k, c))",
        timeout=60,
    )
    return session


def run(settings: Settings | None = None, *, promotes: int = 400, reads: int = 400) -> list[Figure]:
    """Measure and return every figure (see the module docstring)."""
    from cassandra import ConsistencyLevel
    from cassandra.policies import FallthroughRetryPolicy

    from ratchet.domain.claims import ClaimState
    from ratchet.domain.plan import Promoted
    from services.cassandra_cluster import open_cluster
    from services.ledger.cassandra import CassandraLedger
    from services.store.base import StoreOptions
    from services.store.cassandra import CassandraCheckpointStore
    from services.store.rows import HISTORY_KINDS, HISTORY_SELECT

    settings = settings or Settings.from_env()
    keyspace = f"{settings.keyspace}_bench_{uuid.uuid4().hex[:6]}"
    cluster = open_cluster(settings)
    session = _create_keyspace(cluster, replace(settings, keyspace=keyspace))
    try:
        store = CassandraCheckpointStore(session)
        ledger = CassandraLedger(session)
        raw_insert = session.prepare(
            f"INSERT INTO {keyspace}.raw_baseline (k, c, v) VALUES (?, ?, ?) IF NOT EXISTS"
        )
        raw_insert.retry_policy = FallthroughRetryPolicy()
        raw_insert.serial_consistency_level = ConsistencyLevel.SERIAL
        raw_insert.consistency_level = ConsistencyLevel.LOCAL_QUORUM
        raw_select = session.prepare(
            f"SELECT * FROM {keyspace}.turns WHERE tenant_id = ? AND partition_key = ?"
        )
        raw_select.consistency_level = ConsistencyLevel.LOCAL_QUORUM
        # The query the store itself makes (no idempotency rows), without decoding
        # into records or verifying.
        raw_history = session.prepare(
            f"SELECT {HISTORY_SELECT} FROM {keyspace}.turns WHERE tenant_id = ? "
            f"AND partition_key = ? AND kind IN {HISTORY_KINDS}"
        )
        raw_history.consistency_level = ConsistencyLevel.LOCAL_QUORUM
        payload = _item("baseline").content * 2
        tenant = f"bench_{uuid.uuid4().hex[:6]}"
        figures: list[Figure] = []

        for concurrency in (1, 16):
            per_worker = max(1, promotes // concurrency)
            heads = [0] * concurrency
            run_id = uuid.uuid4().hex[:6]

            def promote(w: int, i: int, heads=heads, run_id=run_id) -> None:
                outcome = store.promote(_turn(tenant, f"conv_{run_id}_{w}", heads[w]))
                assert isinstance(outcome, Promoted), outcome
                heads[w] += 1

            def raw(w: int, i: int, run_id=run_id) -> None:
                session.execute(raw_insert, (f"k_{run_id}_{w}", f"c{i}", payload))

            def claim(w: int, i: int, run_id=run_id, state=ClaimState.CLAIMED) -> None:
                answer = ledger.claim_effect(_claim(tenant, f"{run_id}_{w}", i), _now_ms())
                assert answer.state is state, answer

            def api_claim(w: int, i: int, run_id=run_id, conditional=True) -> None:
                # The claims API's writes for a new claim: the facts marks before and
                # after it, which learn whether the request stands promoted
                # (``mark_claim``) or, before session 39, plain marks.
                request = _claim(tenant, f"api_{run_id}_{w}_{conditional}", i)
                where = (tenant, f"conv_api_{run_id}_{w}", request.idempotency_key)

                def mark() -> None:
                    if not conditional:
                        store.mark_request_facts(*where)
                    elif store.mark_claim(*where) is not None:
                        raise AssertionError(f"{where}: no promotion expected")

                mark()
                answer = ledger.claim_effect(request, _now_ms())
                if answer.state is not ClaimState.CLAIMED:
                    raise AssertionError(f"{where}: {answer}")
                mark()

            def api_claim_plain(w: int, i: int) -> None:
                api_claim(w, i, conditional=False)

            _warm_up(promote, raw, claim, api_claim, api_claim_plain)
            figures.append(measure("raw LWT INSERT IF NOT EXISTS", concurrency, per_worker, raw))
            figures.append(measure("store.promote (2 items)", concurrency, per_worker, promote))
            figures.append(measure("ledger.claim_effect (new claim)", concurrency, per_worker,
                                   claim))
            figures.append(measure("claims API writes, mark_claim", concurrency,
                                   per_worker, api_claim))
            figures.append(measure("claims API writes, plain mark", concurrency,
                                   per_worker, api_claim_plain))

        done_key = f"done_{uuid.uuid4().hex[:6]}"
        done = _claim(tenant, done_key, 0)
        ledger.claim_effect(done, _now_ms())
        output = _item("recorded output")
        ledger.complete_claim(tenant, done.idempotency_key, done.effect_id, done.token,
                              "succeeded", output, _now_ms())

        def reuse(w: int, i: int) -> None:
            retry = _claim(tenant, done_key, 0)
            assert ledger.claim_effect(retry, _now_ms()).state is ClaimState.COMPLETED

        _warm_up(reuse)
        figures.append(measure("ledger.claim_effect (completed: reuse)", 1, promotes, reuse))

        cold_store = CassandraCheckpointStore(session, StoreOptions(hint_capacity=0))
        cold_heads = [0]
        cold_conversation = f"conv_cold_{uuid.uuid4().hex[:6]}"

        def cold_promote(w: int, i: int) -> None:
            outcome = cold_store.promote(_turn(tenant, cold_conversation, cold_heads[0]))
            assert isinstance(outcome, Promoted), outcome
            cold_heads[0] += 1

        _warm_up(cold_promote)
        figures.append(measure("store.promote, no hint (2 items)", 1, promotes, cold_promote))

        conversation = f"conv_read_{uuid.uuid4().hex[:6]}"
        for seq in range(50):
            last = store.promote(_turn(tenant, conversation, seq))
        last_id = last.checkpoint.response_id

        def read(w: int, i: int) -> None:
            found = store.read_history(tenant, conversation_id=conversation)
            assert isinstance(found, VerifiedHistory), found

        def read_by_id(w: int, i: int) -> None:
            found = store.read_history(tenant, response_id=last_id)
            assert isinstance(found, VerifiedHistory), found

        def raw_read(w: int, i: int) -> None:
            list(session.execute(raw_select, (tenant, conversation)))

        def raw_history_read(w: int, i: int) -> None:
            list(session.execute(raw_history, (tenant, conversation)))

        _warm_up(read, read_by_id, raw_read, raw_history_read)
        figures.append(measure("raw SELECT partition (50 turns)", 1, reads, raw_read))
        figures.append(measure("raw SELECT history rows (50 turns)", 1, reads, raw_history_read))
        figures.append(measure("store.read_history (50 turns)", 1, reads, read))
        figures.append(measure("store.read_history by response id", 1, reads, read_by_id))
        return figures
    finally:
        _drop_quietly(session, keyspace)
        cluster.shutdown()


def _drop_quietly(session, keyspace: str) -> None:
    """Drop the bench keyspace without hiding the error that ended the run, if any."""
    try:
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
    except Exception as exc:  # the cluster may be the very thing that failed
        print(f"could not drop bench keyspace {keyspace}: {exc}")


def _warm_up(*ops: Callable[[int, int], None], rounds: int = 20) -> None:
    for op in ops:
        for i in range(rounds):
            op(0, 10_000 + i)


# p99 targets of issue 4, in milliseconds (baselines have none).
TARGETS_MS = {
    "store.promote (2 items)": 10.0,
    "store.read_history (50 turns)": 5.0,
    "store.read_history by response id": 5.0,
}


def format_table(figures: list[Figure]) -> str:
    """Figures side by side; the load average says how busy the machine was."""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    rows = [
        f"load average {load} on {os.cpu_count()} cores",
        f"{'operation':<36} {'conc':>4} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'p99 target':>11}",
    ]
    for f in figures:
        target = TARGETS_MS.get(f.name)
        verdict = "" if target is None else f"{target:.0f} {'ok' if f.p99_ms <= target else 'MISS'}"
        rows.append(
            f"{f.name:<36} {f.concurrency:>4} {f.samples:>5} {f.p50_ms:>8.2f} {f.p99_ms:>8.2f} "
            f"{verdict:>11}"
        )
    return "\n".join(rows)


def main() -> None:
    print(format_table(run()))


if __name__ == "__main__":
    main()
