"""The scripted conversations of ``ratchet demo``. Each returns one row of the table.

Every scenario drives the real stack only through the gateway library (producer +
rehydration client), like a gateway would; ids are fresh per run, so the demo can be
run again and again against the same Kafka and Cassandra.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Consumer, Producer, TopicPartition

from ratchet.samples import make_fingerprint
from ratchet.settings import Settings
from schemas.models import Subturn
from services.demo.simulator import (
    SimulatedGateway,
    assistant,
    call,
    custom_call,
    custom_output_of,
    mcp_call,
    mcp_list_tools,
    output_of,
    reasoning,
    uid,
    user,
    web_search,
)
from services.gateway.client import Certified, Failure, Fallback, Outcome
from services.gateway.events import TurnIdentity, turn_cancelled

WAIT_MS = 10_000


@dataclass(frozen=True)
class Row:
    scenario: str
    expected: str
    observed: str
    ok: bool


def describe(outcome: Outcome) -> str:
    if isinstance(outcome, Certified):
        return f"certified seq={outcome.head_seq} items={len(outcome.items)}"
    if isinstance(outcome, Fallback):
        return f"fallback {outcome.reason} items={len(outcome.items)}"
    detail = f" ({outcome.detail})" if outcome.detail else ""
    return f"{outcome.http_status} {outcome.reason}{detail}"


def _conv_turn(gw: SimulatedGateway, conv: str, head: int, text: str, **kwargs):
    identity = TurnIdentity.conversation(gw.tenant_id, conv, uid("resp"), head)
    return identity, gw.turn(identity, [user(text)], [assistant(f"re: {text}")], **kwargs)


def normal_turns(gw: SimulatedGateway, settings: Settings) -> Row:
    conv, outcomes = uid("conv"), []
    for head, text in enumerate(["Hi!", "Plan a trip to Lyon.", "Make it 3 days."]):
        _, turn = _conv_turn(gw, conv, head, text)
        gw.publish(turn)
        outcomes.append(gw.rehydrate(turn.response_id, wait_ms=WAIT_MS))
    last = outcomes[-1]
    ok = (
        all(isinstance(o, Certified) for o in outcomes)
        and last.head_seq == 3
        and len(last.items) == 6
    )
    return Row(
        "3 normal turns",
        "certified x3, seq=3 items=6",
        f"{sum(isinstance(o, Certified) for o in outcomes)} certified; {describe(last)}",
        ok,
    )


def tool_loop_with_retry(gw: SimulatedGateway, settings: Settings) -> Row:
    """Attempt 1 runs a tool then dies; attempt 2 reuses the recorded result and
    completes; the completion is then delivered twice; the next turn proves the head
    moved exactly once."""
    conv, key = uid("conv"), uid("idem")
    identity = TurnIdentity.conversation(gw.tenant_id, conv, uid("resp"), 0)
    fc = call("get_weather", '{"city":"Lyon"}')
    result = output_of(fc, '{"temperature_c":21}')
    first = gw.effect(identity, key, 0, fc, result, attempt=1)
    gw.publish(None, [first])  # ... and the gateway crashes before completing
    retry = gw.effect(identity, key, 0, fc, result, attempt=2)
    turn = gw.turn(
        identity,
        [user("Weather in Lyon?")],
        [reasoning("need the weather"), fc, result, assistant("21 C in Lyon.")],
        idempotency_key=key,
        attempt=2,
        tool_effect_ids=[retry.effect_id],
    )
    gw.publish(turn, [retry])
    outcome = gw.rehydrate(turn.response_id, wait_ms=WAIT_MS)
    gw.publish(turn)  # redelivered completion: must be a DUPLICATE, not a second turn
    _, after = _conv_turn(gw, conv, 1, "thanks")
    gw.publish(after)
    next_outcome = gw.rehydrate(after.response_id, wait_ms=WAIT_MS)
    ok = (
        isinstance(outcome, Certified)
        and len(outcome.items) == 5
        and first.effect_id == retry.effect_id
        and isinstance(next_outcome, Certified)
        and next_outcome.head_seq == 2
    )
    return Row(
        "tool loop, retried + redelivered",
        "certified items=5; next turn seq=2",
        f"{describe(outcome)}; next {describe(next_outcome)}",
        ok,
    )


def tool_loop_retried_mid_loop(gw: SimulatedGateway, settings: Settings) -> Row:
    """Claim before execute (``services/gateway/claims.py``): attempt 1 books a table
    under a claim (executed, outcome recorded) and dies before the model's next round;
    the retry's model regenerates the call (new call id), its claim answers COMPLETED
    with the recorded output, so the booking is not made again; the retried turn is
    promoted and the conversation rehydrates with the one booking."""
    conv, key = uid("conv"), uid("idem")
    bookings: list[str] = []  # one entry per execution of the side-effecting tool

    def book_table() -> str:
        bookings.append(f"B-{len(bookings) + 1}")
        return json.dumps({"booking": bookings[-1]})

    args = '{"restaurant":"Paul Bocuse","guests":2}'
    first_call = call("book_table", args)
    first = TurnIdentity.conversation(gw.tenant_id, conv, uid("resp"), 0)
    with gw.claims(first, key, attempt=1) as claims, \
            claims.effect(first_call, subturn_index=0) as effect:
        effect.run(book_table)
    gw.producer.flush()  # the recorded ToolEffect is out; now the gateway "crashes"

    retry = TurnIdentity.conversation(gw.tenant_id, conv, uid("resp"), 0)
    regenerated = call("book_table", args)  # same request, the model's new call id
    with gw.claims(retry, key, attempt=2) as claims, \
            claims.effect(regenerated, subturn_index=0) as reused:
        output = reused.run(book_table)
    booking = json.loads(json.loads(output.content)["output"])["booking"]
    turn = gw.turn(
        retry,
        [user("Book a table for two at Paul Bocuse.")],
        [regenerated, output, assistant(f"Booked: {booking}.")],
        idempotency_key=key,
        attempt=2,
        subturns=[Subturn(index=0, effect_ids=(reused.effect_id,))],
        tool_effect_ids=[reused.effect_id],
    )
    gw.publish(turn)
    outcome = gw.rehydrate(turn.response_id, wait_ms=WAIT_MS)
    history = gw.conversation(conv)
    ok = (
        len(bookings) == 1
        and reused.state == "COMPLETED"
        and not reused.executed
        and reused.effect_id == effect.effect_id
        and output.call_id == regenerated["call_id"] != first_call["call_id"]
        and isinstance(outcome, Certified)
        and outcome.head_seq == 1
        and len(outcome.items) == 4
        and isinstance(history, Certified)
        and [i.content for i in history.items] == [i.content for i in outcome.items]
    )
    return Row(
        "tool loop retried mid-loop, claims",
        "retry's claim COMPLETED, tool ran 1x; certified seq=1 items=4",
        f"retry's claim {reused.state}, tool ran {len(bookings)}x ({booking}); "
        f"{describe(outcome)}; conversation {describe(history)}",
        ok,
    )


def builtin_mcp_and_custom_tools(gw: SimulatedGateway, settings: Settings) -> Row:
    """One turn with a provider web search, an MCP tool and a custom tool the gateway ran
    (both recorded as tool effects); the history comes back byte for byte."""
    conv, key = uid("conv"), uid("idem")
    identity = TurnIdentity.conversation(gw.tenant_id, conv, uid("resp"), 0)
    search = web_search("Lyon museums open on Monday")
    listed = mcp_list_tools("tickets", ["book"])
    booked = mcp_call("tickets", "book", '{"museum":"MBA","day":"Mon"}', "booking 42")
    sql = custom_call("calendar_sql", "INSERT INTO events VALUES ('MBA', 'Mon')")
    stored = custom_output_of(sql, "1 row")
    effects = [gw.effect(identity, key, 0, booked), gw.effect(identity, key, 1, sql, stored)]
    output = [search, listed, booked, sql, stored, assistant("Booked the MBA for Monday.")]
    turn = gw.turn(identity, [user("Book a museum in Lyon on Monday.")], output,
                   idempotency_key=key, tool_effect_ids=[e.effect_id for e in effects])
    gw.publish(turn, effects)
    outcome = gw.rehydrate(turn.response_id, wait_ms=WAIT_MS)
    sent = [i.content.decode() for i in turn.items]
    returned = [i.content for i in outcome.items] if isinstance(outcome, Certified) else []
    types = ", ".join(i.type for i in turn.output_items[:5])
    return Row(
        "web search + MCP + custom tool",
        "certified items=7, byte-exact",
        f"{describe(outcome)}; {'byte-exact' if returned == sent else 'DIFFERENT'} ({types})",
        isinstance(outcome, Certified) and returned == sent,
    )


def race(gw: SimulatedGateway, settings: Settings) -> Row:
    """Two gateways continue the same head at once: exactly one wins."""
    conv = uid("conv")
    _, base = _conv_turn(gw, conv, 0, "start")
    gw.publish(base)
    gw.rehydrate(base.response_id, wait_ms=WAIT_MS)
    _, left = _conv_turn(gw, conv, 1, "left")
    _, right = _conv_turn(gw, conv, 1, "right")
    gw.publish(None, (), left, right)
    outcomes = [gw.rehydrate(t.response_id, wait_ms=WAIT_MS) for t in (left, right)]
    loser = next((o for o in outcomes if isinstance(o, Failure)), None)
    status = gw.client.status(gw.tenant_id, right.response_id)
    ok = (
        sum(isinstance(o, Certified) for o in outcomes) == 1
        and loser is not None
        and loser.reason == "NOT_PROMOTED"
    )
    return Row(
        "race on one head",
        "1 certified, 1 409 NOT_PROMOTED (CONFLICT)",
        f"{describe(outcomes[0])} | {describe(outcomes[1])}; loser status "
        f"{status.state} {status.reason or ''}".strip(),
        ok,
    )


def fork(gw: SimulatedGateway, settings: Settings) -> Row:
    """previous_response_id chains may fork: both children are promoted."""
    root = TurnIdentity.chain(gw.tenant_id, uid("resp"))
    root_turn = gw.turn(root, [user("Name a colour")], [assistant("Blue.")])
    gw.publish(root_turn)
    gw.rehydrate(root_turn.response_id, wait_ms=WAIT_MS)
    children = []
    for text in ("Another?", "Why blue?"):
        child = TurnIdentity.chain(
            gw.tenant_id, uid("resp"), root_turn.response_id, chain_root_id=root.chain_root_id
        )
        children.append(gw.turn(child, [user(text)], [assistant("...")]))
    gw.publish(None, (), *children)
    outcomes = [gw.rehydrate(c.response_id, wait_ms=WAIT_MS) for c in children]
    ok = all(isinstance(o, Certified) and len(o.items) == 4 and o.head_seq == 2 for o in outcomes)
    return Row(
        "fork of a response chain",
        "both children certified seq=2 items=4",
        " | ".join(describe(o) for o in outcomes),
        ok,
    )


def cancel(gw: SimulatedGateway, settings: Settings) -> Row:
    conv = uid("conv")
    identity, turn = _conv_turn(gw, conv, 0, "Write a long poem")
    gw.publish(None, (), turn_cancelled(identity, idempotency_key=turn.idempotency_key), turn)
    outcome = gw.rehydrate(turn.response_id, wait_ms=WAIT_MS)
    status = gw.client.status(gw.tenant_id, turn.response_id)
    ok = (
        isinstance(outcome, Failure)
        and outcome.reason == "NOT_PROMOTED"
        and (status.reason == "CANCELLED")
    )
    return Row(
        "cancelled before completion",
        "409 NOT_PROMOTED, status rejected CANCELLED",
        f"{describe(outcome)}; status {status.state} {status.reason}",
        ok,
    )


def corrupt_turn(gw: SimulatedGateway, settings: Settings) -> Row:
    """An item whose content does not match its digest: rejected, never stored."""
    conv = uid("conv")
    _, turn = _conv_turn(gw, conv, 0, "hello")
    bad_item = turn.output_items[0].model_copy(update={"content": b'{"tampered":true}'})
    bad = turn.model_copy(update={"output_items": (bad_item,)})
    gw.publish(bad)
    outcome = gw.rehydrate(bad.response_id, wait_ms=WAIT_MS)
    status = gw.client.status(gw.tenant_id, bad.response_id)
    ok = isinstance(outcome, Failure) and status.reason == "CORRUPT"
    return Row(
        "turn with a corrupt item",
        "409 NOT_PROMOTED, status rejected CORRUPT",
        f"{describe(outcome)}; status {status.state} {status.reason}",
        ok,
    )


def undecodable_record(gw: SimulatedGateway, settings: Settings) -> Row:
    """Garbage bytes on the events topic: dead-lettered; the key's next turn still flows."""
    conv = uid("conv")
    since_ms = int(time.time() * 1000) - 1000
    raw = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    raw.produce(settings.topic("gateway-events"), key=conv.encode(), value=b"\x00garbage")
    raw.flush(10)
    _, turn = _conv_turn(gw, conv, 0, "still there?")
    gw.publish(turn)
    outcome = gw.rehydrate(turn.response_id, wait_ms=WAIT_MS)
    found = _dead_letter_seen(settings, conv, since_ms)
    ok = found and isinstance(outcome, Certified)
    return Row(
        "undecodable record",
        "dead-lettered; next turn certified",
        f"dead letter {'found' if found else 'NOT found'}; {describe(outcome)}",
        ok,
    )


def _dead_letter_seen(settings: Settings, key: str, since_ms: int) -> bool:
    topic = settings.topic("dead-letters")
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": uid("demo"),
            "enable.auto.commit": False,
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        wanted = [TopicPartition(topic, p, since_ms) for p in meta.partitions]
        consumer.assign(consumer.offsets_for_times(wanted, timeout=10))
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error() and msg.key() == key.encode():
                return True
        return False
    finally:
        consumer.close()


def fingerprint_change(gw: SimulatedGateway, settings: Settings) -> Row:
    """The model is redeployed mid-conversation: no token reuse, full history kept."""
    conv = uid("conv")
    _, turn = _conv_turn(gw, conv, 0, "Summarise this.")
    gw.publish(turn)
    gw.rehydrate(turn.response_id, wait_ms=WAIT_MS)
    gw.fingerprint = make_fingerprint(model_weights_revision="f" * 40)
    fallback = gw.rehydrate(turn.response_id)
    _, nxt = _conv_turn(gw, conv, 1, "Shorter.")
    gw.publish(nxt)
    outcome = gw.rehydrate(nxt.response_id, wait_ms=WAIT_MS)
    ok = (
        isinstance(fallback, Fallback)
        and fallback.reason == "FINGERPRINT_MISMATCH"
        and len(fallback.items) == 2
        and isinstance(outcome, Certified)
    )
    return Row(
        "fingerprint change",
        "fallback FINGERPRINT_MISMATCH items=2; then certified",
        f"{describe(fallback)}; then {describe(outcome)}",
        ok,
    )


SCENARIOS: list[tuple[str, Callable[[SimulatedGateway, Settings], Row]]] = [
    ("normal turns", normal_turns),
    ("tool loop with a retry", tool_loop_with_retry),
    ("tool loop retried mid-loop", tool_loop_retried_mid_loop),
    ("built-in, MCP and custom tools", builtin_mcp_and_custom_tools),
    ("race", race),
    ("fork", fork),
    ("cancel", cancel),
    ("corrupt turn", corrupt_turn),
    ("undecodable record", undecodable_record),
    ("fingerprint change", fingerprint_change),
]
