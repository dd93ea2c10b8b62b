"""The published protocol vectors (docs/vectors/) are what the Python implementation computes.

Each vector is recomputed here from its inputs with ratchet's own code and compared with
the file, so an implementation change that would break other-language gateways fails
here, and the files cannot drift from the generator (``python -m tests.vectors``).
"""

from __future__ import annotations

import hashlib
import io
import json
import zlib
from pathlib import Path
from typing import Any

import fastavro
import pytest

from ratchet.domain.catalogue import KNOWN_ITEM_TYPES, shape_problem
from ratchet.domain.claims import effect_id_for_claim
from ratchet.domain.fingerprint import (
    canonical_fingerprint,
    digest_cache_salt,
    digest_chat_template,
    digest_instructions,
    digest_tools,
    fingerprint_hash,
    sanitize_tools,
)
from ratchet.domain.validation import Unpaired, Valid, check_pairing, validate_turn
from schemas import avsc
from schemas.canonical import canonical_digest, canonical_json, parse_json
from schemas.items import arguments_digest, effect_id_for
from schemas.models import MODELS_BY_RECORD, Certification, Fingerprint, Item, TurnCancelled
from services.gateway.events import arguments_digest_of, request_digest, to_item
from tests import vectors

VECTOR_DIR = Path(__file__).resolve().parents[2] / "docs" / "vectors"


def load(name: str) -> dict[str, Any]:
    return json.loads((VECTOR_DIR / name).read_text(encoding="utf-8"))


def cases(name: str, key: str = "cases") -> list[dict[str, Any]]:
    return load(name)[key]


def ids(entries: list[dict[str, Any]], field: str = "name") -> list[str]:
    return [str(entry.get(field, i)) for i, entry in enumerate(entries)]


def test_files_are_what_the_generator_writes():
    stale = [name for name, text in vectors.build().items()
             if (VECTOR_DIR / name).read_text(encoding="utf-8") != text]
    assert not stale, f"run `python -m tests.vectors` and review the diff of {stale}"


# --- canonical JSON ----------------------------------------------------------------------

CANONICAL = cases("canonical-json.json")


@pytest.mark.parametrize("case", CANONICAL, ids=ids(CANONICAL))
def test_canonical_json(case):
    encoded = canonical_json(json.loads(case["input_json"]))
    assert encoded.hex() == case["canonical_hex"]
    assert encoded.decode("utf-8") == case["canonical"]
    assert hashlib.sha256(encoded).hexdigest() == case["sha256"]
    assert json.loads(encoded) == json.loads(case["input_json"])  # same value


ERRORS = cases("canonical-json.json", "errors")


@pytest.mark.parametrize("case", ERRORS, ids=ids(ERRORS))
def test_canonical_json_refuses(case):
    with pytest.raises(ValueError):
        canonical_json(json.loads(case["input_json"]))


def test_parse_json_refuses_exactly_the_numbers_a_double_cannot_hold():
    # pydantic's parser reads them as infinity, which has no canonical JSON: refused when
    # parsed (item content CORRUPT, a claim's output 422), never a digest that raises.
    for text in (b"1e400", b"[-1e400]", b'{"a":{"b":[1,1E+309]}}', b'{"a": 1e400}',
                 b"1" + b"0" * 400 + b".5", b"2" + b"0" * 308 + b".5",
                 b"1.797693134862315808e308"):  # the boundary: 2**1024 - 2**970
        with pytest.raises(ValueError, match="range of a double"):
            parse_json(text)
    assert parse_json(b"[1.7976931348623157e308, 1e-400]") == [1.7976931348623157e308, 0.0]
    # just below the boundary rounds to the largest double
    assert parse_json(b"1.797693134862315807e308") == 1.7976931348623157e308
    assert parse_json(b"1" + b"0" * 400) == 10**400  # an integer is exact at any size
    assert canonical_json(parse_json(b'{"b":1e308,"a":-0.0}')) == b'{"a":-0.0,"b":1e+308}'


# --- fingerprints ---------------------------------------------------------------------------

FINGERPRINTS = cases("fingerprints.json")


@pytest.mark.parametrize("case", FINGERPRINTS, ids=ids(FINGERPRINTS))
def test_fingerprint_hash(case):
    fp = Fingerprint(**case["fingerprint"])
    assert set(case["fingerprint"]) == set(Fingerprint.model_fields)  # ALL fields
    assert canonical_fingerprint(fp) == case["canonical"].encode("utf-8")
    assert fingerprint_hash(fp) == case["fingerprint_hash"]
    assert hashlib.sha256(case["canonical"].encode()).hexdigest() == case["fingerprint_hash"]


def test_fingerprint_component_recipes():
    recipes = load("fingerprints.json")["component_recipes"]
    for r in recipes["instructions_digest"]:
        assert digest_instructions(r["instructions"]) == r["digest"]
    for r in recipes["chat_template_digest"]:
        assert digest_chat_template(r["chat_template"]) == r["digest"]
    for r in recipes["tools_digest"]:
        assert sanitize_tools(r["tools"]) == r["sanitized"]
        assert digest_tools(r["tools"]) == r["digest"] == canonical_digest(r["sanitized"])
    for r in recipes["cache_salt_digest"]:
        assert digest_cache_salt(r["cache_salt"]) == r["digest"]
    for r in recipes["json_text_components"]:
        assert canonical_json(json.loads(r["input_json"])).decode() == r["component"]


# --- items ----------------------------------------------------------------------------------

ITEMS = cases("items.json")


@pytest.mark.parametrize("case", ITEMS, ids=ids(ITEMS, "content_digest"))
def test_item_content_and_digest(case):
    content = canonical_json(case["object"])
    assert content.hex() == case["content_hex"]
    assert content.decode("utf-8") == case["content"]
    assert hashlib.sha256(content).hexdigest() == case["content_digest"]
    # The gateway library builds exactly this Item from the object.
    built = to_item(case["object"], default_id="unused")
    assert built == Item(**{**case["item"], "content": case["content"].encode("utf-8")})
    assert built.digest_ok()


def test_items_vectors_cover_the_whole_catalogue_as_valid_items():
    """A gateway in another language builds the record of every item type it stores
    (which ``role`` / ``call_id`` an ``mcp_call`` or an approval response carries, say)
    from items.json: one case per catalogue type, each of a valid shape, the catalogue's
    cases one history that keeps the pairing rules (contracts.md, section 7)."""
    covered = {case["object"]["type"] for case in ITEMS}
    assert sorted(KNOWN_ITEM_TYPES - covered) == []
    records = [Item(**{**case["item"], "content": case["content"].encode("utf-8")})
               for case in ITEMS]
    assert [shape_problem(record) for record in records] == [None] * len(records)
    catalogue = [r for r in records if r.item_id not in {"msg_user_1", "rs_1", "fc_1",
                                                          "fco_1", "msg_asst_1"}]
    assert not isinstance(check_pairing(catalogue), Unpaired)


# --- partition keys -------------------------------------------------------------------------

KEYS = cases("partition-keys.json")

@pytest.mark.parametrize("case", KEYS, ids=ids(KEYS))
def test_partition_key_of_a_gateway_event(case):
    event = TurnCancelled(event_id="e", produced_at=0, tenant_id="t", idempotency_key="k",
                          cancelled_at=0, **case["event"])
    assert event.partition_key == case["key"]
    raw = bytes.fromhex(case["key_hex"])
    assert raw == case["key"].encode("utf-8")
    assert zlib.crc32(raw) == case["crc32"] and case["crc32"] % 12 == case["partition_of_12"]


# --- effect ids, arguments and request digests ---------------------------------------------

EFFECTS = load("effect-ids.json")


@pytest.mark.parametrize("case", EFFECTS["effect_ids"], ids=ids(EFFECTS["effect_ids"], "effect_id"))
def test_effect_id(case):
    triple = [case["idempotency_key"], case["subturn_index"], case["call_id"]]
    assert canonical_json(triple).decode() == case["canonical"]
    assert effect_id_for(*triple) == case["effect_id"]
    assert case["effect_id"] == "eff_" + hashlib.sha256(case["canonical"].encode()).hexdigest()[:32]


@pytest.mark.parametrize("case", EFFECTS["arguments_digests"])
def test_arguments_digest(case):
    assert arguments_digest(json.loads(case["arguments"])) == case["arguments_digest"]


@pytest.mark.parametrize("case", EFFECTS["claimed_effect_ids"],
                         ids=ids(EFFECTS["claimed_effect_ids"], "effect_id"))
def test_claimed_effect_id(case):
    parts = ["claim", case["idempotency_key"], case["subturn_index"], case["tool_name"],
             case["occurrence"]]
    assert canonical_json(parts).decode() == case["canonical"]
    assert effect_id_for_claim(*parts[1:]) == case["effect_id"]
    assert case["effect_id"] == "eff_" + hashlib.sha256(case["canonical"].encode()).hexdigest()[:32]


@pytest.mark.parametrize("case", EFFECTS["call_arguments_digests"])
def test_call_arguments_digest(case):
    assert arguments_digest_of(case["call"]) == case["arguments_digest"]


REQUESTS = cases("request-digests.json")


@pytest.mark.parametrize("case", REQUESTS, ids=ids(REQUESTS, "request_digest"))
def test_request_digest(case):
    assert canonical_json(case["request"]).decode() == case["canonical"]
    assert request_digest(case["request"]) == case["request_digest"]


# --- sample events in Avro --------------------------------------------------------------------

EVENTS = cases("events.json")


def _with_bytes(value: Any) -> Any:
    """The vector's JSON record with Item.content back as bytes."""
    if isinstance(value, dict):
        out = {k: _with_bytes(v) for k, v in value.items()}
        if {"item_id", "content", "content_digest"} <= out.keys():
            out["content"] = out["content"].encode("utf-8")
        return out
    if isinstance(value, list):
        return [_with_bytes(v) for v in value]
    return value


@pytest.mark.parametrize("case", EVENTS, ids=ids(EVENTS, "record"))
def test_sample_event_avro_body(case):
    record = case["record"]
    schema = avsc.parsed(record)
    assert hashlib.sha256(avsc.schema_text(record).encode()).hexdigest() == case["schema_sha256"]
    event = MODELS_BY_RECORD[record].from_avro(_with_bytes(case["value"]))
    body = io.BytesIO()
    fastavro.schemaless_writer(body, schema, event.to_avro())
    assert body.getvalue().hex() == case["avro_body_hex"]
    decoded = fastavro.schemaless_reader(io.BytesIO(bytes.fromhex(case["avro_body_hex"])),
                                         schema, schema)
    assert MODELS_BY_RECORD[record].from_avro(decoded) == event
    assert event.partition_key == case["key"] and case["key"].encode().hex() == case["key_hex"]
    assert case["wire_value_hex_if_schema_id_is_42"] == "000000002a" + case["avro_body_hex"]


def test_sample_turn_is_a_valid_certified_turn():
    """The sample TurnCompleted is not just bytes: ratchet would promote it, certified."""
    case = next(c for c in EVENTS if c["record"] == "TurnCompleted")
    turn = MODELS_BY_RECORD["TurnCompleted"].from_avro(_with_bytes(case["value"]))
    verdict = validate_turn(turn, now_ms=turn.produced_at)
    assert isinstance(verdict, Valid) and verdict.certification is Certification.CERTIFIED
