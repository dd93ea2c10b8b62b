"""Defects found by an outside red team of session 26's own fixes; each test failed
before its fix (on the in-memory backends; the migrate case on real Cassandra is in
tests/integration/test_startup_errors.py).

1. A chain's first response whose ``response_id`` is ~4.8 MiB of id characters is a
   legal-size event, rejected ``CORRUPT`` (the id is outside the API's pattern); its
   rejection repeated the id up to four times (three fields and the record's key): a
   20 MB record for a 16 MiB topic, refused by the broker, retried for ever, the
   partition stopped. A turn whose ids and request digest hold more than
   ``MAX_QUOTED_CHARS`` (1 MiB) together is now dead-lettered ``INVALID_EVENT`` (the
   record is kept).
2. The late-effect fix (an effect its promoted turn carries is used) also took another
   attempt's re-run of the same call, with the same output, as carried: a second
   execution of the tool was never compensated. A call the turn answers with a listed
   effect carries no other effect.
3. The Cassandra host check refused names that resolve: an absolute name (trailing
   dot) and one with underscores.
"""

from __future__ import annotations

import io
import json
import uuid

import fastavro
import pytest

from ratchet.domain.claims import ClaimRequest, EffectPolicy, effect_id_for_claim
from ratchet.samples import NOW_MS, TENANT, make_tool_effect, make_turn, new_id
from ratchet.settings import Settings
from schemas import avsc
from schemas.items import arguments_digest, function_call, function_call_output, message
from schemas.limits import MAX_EVENT_BYTES, MIB, TOPIC_MAX_MESSAGE_BYTES
from schemas.models import DeadLetterReason, OrphanReason, PromotionRejected, RejectionReason
from tests.unit.test_processor_rules import TOPICS, Harness, raw_record


def _avro_size(model, record: str) -> int:
    schema = fastavro.parse_schema(json.loads(avsc.schema_text(record)))
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, model.to_avro())
    return 5 + len(buf.getvalue())


def test_an_event_whose_ids_no_record_could_carry_is_parked_not_rejected():
    rid = "resp_" + "a" * int(4.8 * MIB)
    t = make_turn(conversation_id=None, chain_root_id=rid, response_id=rid,
                  previous_response_id=None, expected_head_seq=None)
    assert _avro_size(t, "TurnCompleted") <= MAX_EVENT_BYTES  # a legal-size event
    (out,) = Harness().processor.handle(raw_record(t)).outbound
    assert out.topic == TOPICS.dead_letters
    assert out.model.reason is DeadLetterReason.INVALID_EVENT
    assert "response_id of" in out.model.error
    assert len(out.key or b"") + _avro_size(out.model, "DeadLetter") <= 2 * TOPIC_MAX_MESSAGE_BYTES


def test_an_id_just_outside_the_pattern_is_still_rejected_corrupt():
    rid = "resp_" + "a" * 300  # beyond the 200 of the pattern, quotable
    t = make_turn(conversation_id=None, chain_root_id=rid, response_id=rid,
                  previous_response_id=None, expected_head_seq=None)
    rejected = Harness().outcome(t)
    assert isinstance(rejected, PromotionRejected)
    assert rejected.reason is RejectionReason.CORRUPT


def _orphans(handled):
    return [(o.model.effect_id, o.model.reason) for o in handled.outbound
            if o.topic == TOPICS.orphaned_effects]


def test_another_attempts_rerun_of_a_listed_call_is_superseded():
    h = Harness()
    key, conv = new_id("idem"), new_id("conv")
    out = function_call_output("call_a", '{"sent": true}', item_id="fco_a")
    r1 = new_id("resp")
    e1 = make_tool_effect("call_a", out, idempotency_key=key, response_id=r1,
                          conversation_id=conv, tool_name="send_mail", subturn_index=0)
    h.feed(e1)
    t1 = make_turn([function_call("call_a", "send_mail", {"to": "x"}, item_id="fc_a"), out,
                    message("sent", role="assistant", item_id=new_id("msg"))],
                   idempotency_key=key, response_id=r1, conversation_id=conv,
                   tool_effect_ids=[e1.effect_id], attempt=1)
    assert h.processor.handle(h.record(t1)).outbound[0].model.seq == 1
    # attempt 2, which never saw the promotion, ran call_a again one round later
    r2 = new_id("resp")
    e2 = make_tool_effect("call_a", out, idempotency_key=key, response_id=r2,
                          conversation_id=conv, tool_name="send_mail", subturn_index=1,
                          attempt=2)
    assert e2.effect_id != e1.effect_id
    late = h.processor.handle(h.record(e2))
    t2 = t1.model_copy(update={"event_id": new_id("evt"), "response_id": r2, "attempt": 2,
                               "tool_effect_ids": [e2.effect_id]})
    dup = h.processor.handle(h.record(t2))
    assert dup.outbound[0].model.reason is RejectionReason.DUPLICATE
    assert (e2.effect_id, OrphanReason.ATTEMPT_SUPERSEDED) in _orphans(late) + _orphans(dup)


def test_another_attempts_claimed_rerun_of_a_listed_call_is_superseded():
    h = Harness()
    key, conv = new_id("idem"), new_id("conv")

    def claim(subturn, attempt, output):
        effect_id = effect_id_for_claim(key, subturn, "send_email", 0)
        req = ClaimRequest(TENANT, key, effect_id, attempt, subturn, "ca", "send_email",
                           arguments_digest({"to": "ca"}), uuid.uuid4().hex, 30_000,
                           EffectPolicy.AT_MOST_ONCE)
        h.ledger.claim_effect(req, NOW_MS)
        h.ledger.complete_claim(TENANT, key, effect_id, req.token, "succeeded", output,
                                NOW_MS)
        h.store.mark_request_facts(TENANT, conv, key)
        return effect_id

    out1 = function_call_output("ca", '{"sent": true}', item_id="fco_a")
    c1 = claim(0, 1, out1)
    t1 = make_turn([function_call("ca", "send_email", {"to": "ca"}, item_id="fc_a"), out1,
                    message("sent", role="assistant", item_id=new_id("msg"))],
                   idempotency_key=key, conversation_id=conv, tool_effect_ids=[c1])
    assert h.outcome(t1).seq == 1
    c2 = claim(1, 2, function_call_output("ca", '{"sent": true}', item_id="fco_a2"))
    t2 = t1.model_copy(update={"event_id": new_id("evt"), "response_id": new_id("resp"),
                               "attempt": 2, "tool_effect_ids": [c2]})
    dup = h.processor.handle(h.record(t2))
    assert dup.outbound[0].model.reason is RejectionReason.DUPLICATE
    assert (c2, OrphanReason.ATTEMPT_SUPERSEDED) in _orphans(dup)


@pytest.mark.parametrize("host", ["cassandra-0.cassandra.svc.cluster.local.",
                                  "ratchet_cassandra_1"])
def test_cassandra_host_names_that_resolve_are_accepted(host):
    assert Settings.from_env({"RATCHET_CASSANDRA_HOSTS": host}).cassandra_hosts == (host,)
