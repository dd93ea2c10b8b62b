"""Counts of the promotion path's work that do not depend on the machine's load.

``python -m ratchet.bench.fastpath_counts [--conversations N] [--chains N] [--tools N]``
builds the worker's runtime (``streams.worker.build_runtime``: the Cassandra store and
ledger with the C++ driver on the loop, the registry codec), feeds it a fixed workload
of encoded ``TurnCompleted`` records (and the ``ToolEffect`` records tool turns use)
through ``PromotionProcessor.handle_async`` on one event loop, encodes every outcome as
the app does, and prints per promoted turn:

* Cassandra requests by statement, each marked conditional (``IF``) or not, and which
  driver sent it (``loop``: the C++ driver; ``sync``: cassandra-driver);
* the outcome records a worker would produce to Kafka;
* Python calls (cProfile ``ncalls`` / ``tottime``, the top by calls per turn).

The thread path runs inline (on the loop's thread) so that one profiler sees every call;
no timing is reported as a result (the tottime column is the profiler's, a hint only).
Run it in an isolated keyspace and topic prefix (``RATCHET_KEYSPACE``,
``RATCHET_TOPIC_PREFIX``). Turns' ids are random; their shapes and sizes are fixed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import json
import pstats
import re
import time
import uuid
from functools import cache
from typing import Any

from cassandra.query import BatchStatement, BoundStatement, PreparedStatement

from ratchet.samples import make_tool_loop_turn, make_turn
from ratchet.settings import Settings
from schemas.avro import encode_key
from streams.records import RawRecord

_SPACES = re.compile(r"\s+")


@cache
def _label(query: str) -> str:
    query = _SPACES.sub(" ", query.strip())
    conditional = " IF " in f" {query.upper()} "
    words = query.split(" ")
    table = next((words[i + 1] for i, w in enumerate(words[:-1])
                  if w.upper() in ("INTO", "FROM", "UPDATE")), "?")
    if words[0].upper() == "UPDATE":
        table = words[1]
    table = table.rsplit(".", 1)[-1]  # the table, not its keyspace: labels compare across runs
    return f"{words[0].upper()} {table}{' IF' if conditional else ''}"


class Counts:
    def __init__(self) -> None:
        self.requests: collections.Counter[str] = collections.Counter()
        self.by_kind: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter)
        self.kind = "?"  # the kind of event being handled
        self.total = 0

    def add(self, label: str) -> None:
        self.requests[label] += 1
        self.by_kind[self.kind][label] += 1
        self.total += 1

    def clear(self) -> None:
        self.requests.clear()
        self.by_kind.clear()
        self.total = 0


def _query_of(statement: Any) -> str:
    if isinstance(statement, PreparedStatement):
        return statement.query_string
    if isinstance(statement, BoundStatement):
        return statement.prepared_statement.query_string
    if isinstance(statement, str):
        return statement
    return getattr(statement, "query_string", repr(statement))


def _batch_label(parts: list[str]) -> str:
    conditional = any(p.endswith(" IF") for p in parts)
    inner = ", ".join(f"{n}x {p}" if n > 1 else p
                      for p, n in sorted(collections.Counter(parts).items()))
    return f"BATCH{' IF' if conditional else ''} [{inner}]"


def _sync_batch_parts(batch: BatchStatement, cluster: Any) -> list[str]:
    parts = []
    for is_prepared, statement, _values in batch._statements_and_parameters:
        if is_prepared:
            prepared = cluster._prepared_statements.get(statement)
            parts.append(_label(prepared.query_string) if prepared else "PREPARED ?")
        else:
            parts.append(_label(_query_of(statement)))
    return parts


class CountingSession:
    """cassandra-driver's session, every request counted (``execute`` and
    ``execute_async``)."""

    def __init__(self, real: Any, counts: Counts) -> None:
        self._real, self._counts = real, counts

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def _count(self, statement: Any) -> None:
        if isinstance(statement, BatchStatement):
            self._counts.add("sync " + _batch_label(_sync_batch_parts(statement,
                                                                      self._real.cluster)))
        else:
            self._counts.add("sync " + _label(_query_of(statement)))

    def execute(self, statement: Any, *args: Any, **kwargs: Any) -> Any:
        self._count(statement)
        return self._real.execute(statement, *args, **kwargs)

    def execute_async(self, statement: Any, *args: Any, **kwargs: Any) -> Any:
        self._count(statement)
        return self._real.execute_async(statement, *args, **kwargs)


def _count_loop_session(loop_session: Any, counts: Counts) -> None:
    execute, execute_batch = loop_session.execute, loop_session.execute_batch

    async def counted_execute(statement: Any, values: Any, **kwargs: Any) -> Any:
        counts.add("loop " + _label(statement.query_string))
        return await execute(statement, values, **kwargs)

    async def counted_batch(parts: Any, **kwargs: Any) -> Any:
        counts.add("loop " + _batch_label([_label(s.query_string) for s, _ in parts]))
        return await execute_batch(parts, **kwargs)

    loop_session.execute, loop_session.execute_batch = counted_execute, counted_batch


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


def workload(conversations: int, chains: int, tools: int, now_ms: int) -> list[Any]:
    """Events in the order a gateway sends them: every Conversation's turn r before any
    turn r+1 (3 per Conversation), chains of 3, tool turns (2 effects each, first
    turns of Conversations) after their effects."""
    events: list[Any] = []
    convs = [_id("conv") for _ in range(conversations)]
    for head in range(3):
        events += [make_turn(conversation_id=c, expected_head_seq=head, now_ms=now_ms,
                             response_id=_id("resp"), idempotency_key=_id("idem"))
                   for c in convs]
    for _ in range(chains):
        previous = root = None
        for _depth in range(3):
            rid = _id("resp")
            events.append(make_turn(conversation_id=None, chain_root_id=root or rid,
                                    expected_head_seq=None, previous_response_id=previous,
                                    response_id=rid, idempotency_key=_id("idem"),
                                    now_ms=now_ms))
            root, previous = root or rid, rid
    for _ in range(tools):
        # Ids of their own: the samples' counters start again in every process.
        turn, effects = make_tool_loop_turn(rounds=2, total_items=8, now_ms=now_ms,
                                            conversation_id=_id("conv"),
                                            response_id=_id("resp"),
                                            idempotency_key=_id("idem"))
        events += [*effects, turn]
    return events


def kind_of(event: Any) -> str:
    """The workload's kinds of event, for the per-kind table."""
    from schemas.models import ToolEffect

    if isinstance(event, ToolEffect):
        return "tool effect"
    if event.tool_effect_ids:
        return "tool turn (first of a Conversation)"
    if event.conversation_id is None:
        return "chain, first" if event.previous_response_id is None else "chain, later"
    return "conversation, first" if event.expected_head_seq == 0 else "conversation, later"


def _key_of(event: Any) -> bytes:
    return encode_key(event.conversation_id or event.chain_root_id)


async def _run(runtime: Any, records: list[tuple[str, RawRecord]],
               counts: Counts) -> collections.Counter[str]:
    kinds: collections.Counter[str] = collections.Counter()
    processor, codec = runtime.processor, runtime.codec

    async def inline(handle: Any) -> Any:
        return handle()

    for kind, record in records:
        counts.kind = kind
        kinds["events: " + kind] += 1
        handled = await processor.handle_async(record, inline)
        for outbound in handled.outbound:
            codec.encode(outbound.topic, outbound.model)
            kinds["produced " + type(outbound.model).__name__] += 1
        kinds[handled.kind] += 1
    return kinds


def measure(settings: Settings, conversations: int, chains: int, tools: int,
            top: int, profile_out: str | None = None) -> dict[str, Any]:
    from schemas.avro import EventSerde, register_schemas, registry_client
    from streams.worker import build_runtime

    client = registry_client(settings.schema_registry_url)
    register_schemas(client)
    serde = EventSerde(client)
    runtime, cluster = build_runtime(settings)
    counts = Counts()
    processor = runtime.processor
    for holder in (processor.store, processor.ledger):
        holder._session = CountingSession(holder._session, counts)
    if runtime.loop_session is not None:
        _count_loop_session(runtime.loop_session, counts)
    topic = runtime.topics.gateway_events

    def records(events: list[Any], base: int) -> list[tuple[str, RawRecord]]:
        return [(kind_of(e), RawRecord(topic, 0, base + i, _key_of(e), serde.encode(e, topic),
                                       int(time.time() * 1000))) for i, e in enumerate(events)]

    import uvloop  # the worker's loop (RATCHET_WORKER_EVENT_LOOP's default)

    runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    try:
        now = int(time.time() * 1000)
        # Warm-up: prepared statements, schemas, connections (not counted).
        runner.run(_run(runtime, records(workload(4, 2, 2, now), 0), counts))
        events = workload(conversations, chains, tools, now)
        batch = records(events, 1000)
        counts.clear()
        loop_before = processor.loop_promotions
        profile = cProfile.Profile()
        profile.enable()
        kinds = runner.run(_run(runtime, batch, counts))
        profile.disable()
    finally:
        if runtime.loop_session is not None:
            runner.run(runtime.loop_session.close())
        runner.close()
        cluster.shutdown()
    promoted = kinds["promoted"]
    stats = pstats.Stats(profile)
    if profile_out:
        stats.dump_stats(profile_out)
    rows = []
    for (file, line, name), (_cc, ncalls, tottime, _ct, _callers) in stats.stats.items():
        if "fastpath_counts" in file:
            continue  # the harness's own counting
        rows.append((ncalls, tottime, f"{file.split('site-packages/')[-1]}:{line}({name})"))
    rows.sort(reverse=True)
    total_calls = sum(r[0] for r in rows)
    return {
        "events": len(events), "kinds": dict(kinds), "promoted": promoted,
        "loop_promotions": processor.loop_promotions - loop_before,
        "requests_per_turn": round(counts.total / promoted, 3),
        "requests": {k: round(v / promoted, 3) for k, v in counts.requests.most_common()},
        "per_event": {kind: {k: round(v / kinds["events: " + kind], 3)
                             for k, v in sorted(c.items())}
                      for kind, c in sorted(counts.by_kind.items())},
        "calls_per_turn": round(total_calls / promoted, 1),
        "top": [(round(n / promoted, 2), round(t / promoted * 1e6, 1), where)
                for n, t, where in rows[:top]],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--chains", type=int, default=30)
    parser.add_argument("--tools", type=int, default=30)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--profile-out", help="write the cProfile stats to this file")
    args = parser.parse_args(argv)
    result = measure(Settings.from_env(), args.conversations, args.chains, args.tools,
                     args.top, args.profile_out)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"events {result['events']}  outcomes {result['kinds']}")
    print(f"promoted {result['promoted']} (on the loop {result['loop_promotions']})")
    print(f"Cassandra requests per promoted turn: {result['requests_per_turn']}")
    for label, n in result["requests"].items():
        print(f"  {n:7.3f}  {label}")
    print("Cassandra requests per event, by kind of event:")
    for kind, requests in result["per_event"].items():
        print(f"  {kind}: {sum(requests.values()):.3f}")
        for label, n in requests.items():
            print(f"    {n:7.3f}  {label}")
    print(f"Python calls per promoted turn: {result['calls_per_turn']}")
    print("  calls/turn  tottime us/turn  function")
    for n, t, where in result["top"]:
        print(f"  {n:10.2f}  {t:10.1f}  {where}")


if __name__ == "__main__":
    main()
