"""Session 52's router receipt check (m-rreceipt), met from outside (rrevx, session 52).

What a gateway written from CONTRACT.md and docs/gateway-protocol.md alone would meet:
- a receipt built by the docs' recipe (section 6: the fingerprint's own
  ``router_key_format``, ``covered_tokens`` within the artifact) from the published
  event vector, through Avro, binds; the format is compared as the exact string the
  fingerprint hashes (another case or spelling is another fingerprint component);
- the upgrade path (docs/operations.md, session 52): a turn an older worker promoted
  with a receipt that does not bind is answered with that promotion again when its own
  response id is redelivered or retried (section 7's exception), and refused
  ``INVALID_BOUNDARY_PROOF`` under another response id (event checks come before
  ``DUPLICATE``);
- the read side through the HTTP stack, on every load: a stored receipt cell of any
  shape is a typed answer, never an untyped 500: ``NO_ARTIFACT`` for a JSON object that
  does not cover the artifact (a float, a bool, a huge or negative ``covered_tokens``,
  a field missing or of another type), ``CORRUPT_HISTORY`` for a cell that is not the
  canonical JSON object the processor wrote (docs/service.md, "Damaged rows").
These held on the merged code; the tests pin them.
"""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path
from unittest import mock

import fastavro
import pytest

from ratchet.domain import validation
from ratchet.domain.validation import Rejected, Valid, validate_turn
from ratchet.samples import HOUR_MS, NOW_MS, make_turn, new_id
from schemas import avsc
from schemas.canonical import canonical_json_text
from schemas.models import (
    CheckpointPromoted,
    PromotionRejected,
    RejectionReason,
    RouterReceipt,
    TurnCompleted,
)
from tests.unit.test_api_cache import OTHER_FP, turn_to_damage
from tests.unit.test_processor_rules import Harness

VECTORS = Path(__file__).resolve().parents[2] / "docs" / "vectors" / "events.json"


def _docs_turn(receipt_format: str | None = None) -> tuple[TurnCompleted, int]:
    """The published TurnCompleted vector with a router receipt added as section 6 says
    (the fingerprint's router_key_format unless ``receipt_format``; 12 full blocks of 16
    of the artifact's 200 tokens), written and read back with the registered schema."""
    case = next(c for c in json.loads(VECTORS.read_text())["cases"]
                if c["record"] == "TurnCompleted")
    schema = avsc.parsed("TurnCompleted")
    value = fastavro.schemaless_reader(io.BytesIO(bytes.fromhex(case["avro_body_hex"])),
                                       schema, None)
    fmt = value["fingerprint"]["router_key_format"] if receipt_format is None else receipt_format
    value["router_receipt"] = {"receipt_id": "rcpt_1", "router_key_format": fmt,
                               "covered_tokens": 192, "issuer": "router-0",
                               "expires_at": value["token_artifact"]["expires_at"]}
    body = io.BytesIO()
    fastavro.schemaless_writer(body, schema, value)
    read = fastavro.schemaless_reader(io.BytesIO(body.getvalue()), schema, None)
    produced = read["produced_at"]
    produced_ms = produced if isinstance(produced, int) else int(produced.timestamp() * 1000)
    return TurnCompleted.model_validate(read), produced_ms


def test_a_receipt_built_by_the_docs_recipe_binds():
    turn, now_ms = _docs_turn()
    assert turn.router_receipt is not None
    verdict = validate_turn(turn, now_ms)
    assert isinstance(verdict, Valid), verdict
    assert verdict.artifact_reusable


@pytest.mark.parametrize("spelling", ["Prefix-Blocks-V1", "prefix-blocks-v1 ", "prefix_blocks_v1"])
def test_the_router_key_format_is_the_fingerprints_exact_string(spelling):
    """The fingerprint hashes the exact string: another case, a trailing space or
    another separator names another key format (and would be another fingerprint)."""
    turn, now_ms = _docs_turn(spelling)
    verdict = validate_turn(turn, now_ms)
    assert isinstance(verdict, Rejected), verdict
    assert verdict.reason is RejectionReason.INVALID_BOUNDARY_PROOF
    assert "router_key_format" in verdict.detail


def test_a_pre_upgrade_promotion_with_an_unbinding_receipt_stands_for_its_own_id():
    bad = RouterReceipt(receipt_id="r", router_key_format="another-format",
                        covered_tokens=10**6, expires_at=NOW_MS + HOUR_MS, issuer="router")
    h = Harness()
    turn = make_turn(router_receipt=bad, conversation_id=new_id("conv"))
    with mock.patch.object(validation, "_check_receipt", lambda _event: None):
        assert isinstance(h.outcome(turn), CheckpointPromoted)  # an older worker's rules
    retry = turn.model_copy(update={"event_id": str(uuid.uuid4()), "attempt": 2})
    for again in (turn, retry):  # a redelivery, a retry under its own response id
        outcome = h.outcome(again)
        assert isinstance(outcome, CheckpointPromoted), outcome
        assert outcome.response_id == turn.response_id and outcome.attempt == 1
    elsewhere = turn.model_copy(update={"event_id": str(uuid.uuid4()), "attempt": 3,
                                        "response_id": new_id("resp")})
    outcome = h.outcome(elsewhere)
    assert isinstance(outcome, PromotionRejected), outcome
    assert outcome.reason is RejectionReason.INVALID_BOUNDARY_PROOF


def _cell(**changes) -> str:
    fields = {"receipt_id": "rc1", "router_key_format": "prefix-blocks-v1",
              "covered_tokens": 1, "expires_at": 4_102_444_800_000, "issuer": "router-0"}
    # (a null expires_at, which no worker writes, reads ARTIFACT_EXPIRED since session
    # 53's outside review: tests/unit/test_receipt_names_reviewed.py)
    fields.update(changes)
    return canonical_json_text({k: v for k, v in fields.items() if v is not _MISSING})


_MISSING = object()
_NOT_COVERING = {
    "float": _cell(covered_tokens=1.0),
    "bool": _cell(covered_tokens=True),
    "huge": _cell(covered_tokens=10**30),
    "negative": _cell(covered_tokens=-1),
    "no covered_tokens": _cell(covered_tokens=_MISSING),
    "issuer an object": _cell(issuer={"name": "router-0"}),
    "no router_key_format": _cell(router_key_format=_MISSING),
}
_NOT_ITS_JSON_OBJECT = {
    "int of 5000 digits": _cell(covered_tokens=1).replace('"covered_tokens":1',
                                                          '"covered_tokens":' + "9" * 5000),
    "array": "[1,2]",
    "null": "null",
    "string": '"rc1"',
    "not JSON": "rc1",
    "empty": "",
}
LOADS = ["cold", "fallback", "extension"]


def _read(load: str, cell: str):
    stack, tenant, conv, target = turn_to_damage(load)
    stack.rewrite_checkpoint(tenant, conv, target, router_receipt=cell)
    if load == "cold":
        return stack.fresh(tenant, target)
    if load == "fallback":  # the caller's fingerprint differs: NO_ARTIFACT comes first
        return stack.history(tenant, target, fp=OTHER_FP)
    return stack.history(tenant, target, partition_key=conv)


@pytest.mark.parametrize("load", LOADS)
def test_a_covering_receipt_cell_is_served(load):
    body = _read(load, _cell()).json()
    if load == "fallback":
        assert (body["outcome"], body["reason"]) == ("fallback", "FINGERPRINT_MISMATCH")
    else:
        assert body["outcome"] == "certified", body
        assert body["checkpoint"]["router_receipt"] == json.loads(_cell())


@pytest.mark.parametrize("load", LOADS)
@pytest.mark.parametrize("cell", list(_NOT_COVERING.values()), ids=list(_NOT_COVERING))
def test_a_receipt_cell_that_does_not_cover_falls_back_no_artifact(load, cell):
    resp = _read(load, cell)
    body = resp.json()
    assert (resp.status_code, body["outcome"], body["reason"]) == (200, "fallback", "NO_ARTIFACT")


@pytest.mark.parametrize("load", LOADS)
@pytest.mark.parametrize("cell", list(_NOT_ITS_JSON_OBJECT.values()), ids=list(_NOT_ITS_JSON_OBJECT))
def test_a_receipt_cell_that_is_not_its_json_object_is_corrupt_history(load, cell):
    resp = _read(load, cell)
    body = resp.json()
    assert (resp.status_code, body["outcome"], body["reason"]) == (
        500, "failure", "CORRUPT_HISTORY")
