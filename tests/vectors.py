"""Protocol test vectors (docs/vectors/*.json): inputs, and the bytes, digests and hashes
ratchet's Python implementation derives from them.

    python -m tests.vectors           # rewrite docs/vectors/ from the cases below
    python -m tests.vectors --check   # exit 1 if the files differ from what it would write

Only stable modules compute the outputs (schemas.canonical, schemas.items, schemas.avsc,
ratchet.domain.fingerprint). Partition keys are the exception: their expected values are
the CONTRACT's rule, written by hand in ``PARTITION_KEY_CASES`` (the implementations are
checked against them in tests/unit/test_protocol_vectors.py). Another implementation
reads the files; nobody edits them by hand.
"""

from __future__ import annotations

import io
import json
import sys
import zlib
from pathlib import Path
from typing import Any

import fastavro

from ratchet.domain.claims import effect_id_for_claim
from ratchet.domain.fingerprint import (
    build_fingerprint,
    canonical_fingerprint,
    digest_cache_salt,
    digest_chat_template,
    digest_instructions,
    digest_tools,
    fingerprint_hash,
    sanitize_tools,
)
from schemas import avsc
from schemas.canonical import canonical_digest, canonical_json, sha256_hex
from schemas.items import arguments_digest, effect_id_for
from schemas.models import (
    BoundaryProof,
    EffectiveConfig,
    Frozen,
    Item,
    StreamInfo,
    Subturn,
    TokenArtifact,
    ToolEffect,
    TurnCancelled,
    TurnCompleted,
    record_name,
)
from services.gateway.events import arguments_digest_of

VECTOR_DIR = Path(__file__).resolve().parents[1] / "docs" / "vectors"
PARTITIONS = 12  # the default RATCHET_PARTITIONS; "crc32" lets a reader use any count

# --- canonical JSON -------------------------------------------------------------------

CANONICAL_CASES = [
    ("key order", '{"b": 1, "a": 2, "c": {"z": true, "y": false}}'),
    ("whitespace dropped", '[ 1 ,\n\t2 , { "k" : "v" } ]'),
    ("explicit nulls kept", '{"role": null, "call_id": null, "id": "msg_1"}'),
    ("empty containers", '{"a": [], "b": {}, "c": ""}'),
    ("nested arrays keep their order", '[[3, 2, 1], {"b": [{"d": 1, "c": 2}]}]'),
    ("unicode is UTF-8, not escaped", '{"text": "caf\\u00e9 \\u4f1a\\u8bdd \\ud83d\\ude00"}'),
    ("escapes: quote, backslash, control characters",
     '{"s": "\\"q\\" \\\\ \\n\\r\\t\\b\\f \\u0001 \\u001f \\u007f / \\u2028"}'),
    ("keys sorted by code point (not UTF-16 units)",
     '{"\\uffff": 1, "\\ud83d\\ude00": 2, "a": 3, "Z": 4, "\\u00e9": 5}'),
    ("integers exact, any size", '[0, -0, 1, -1, 9007199254740993, -12345678901234567890]'),
    ("floats: Python repr", '[1.0, -0.0, 0.1, 1e2, 1.5e-7, 0.0001, 1e-05, 1e16, '
     '123456789.123, 1e15, 3.141592653589793]'),
    ("booleans", '{"t": true, "f": false}'),
]
# Inputs canonical JSON refuses (the encoder raises).
CANONICAL_ERRORS = [
    ("NaN", "NaN"),
    ("Infinity", '{"x": Infinity}'),
    ("-Infinity", "[-Infinity]"),
    ("lone surrogate (not encodable as UTF-8)", '"\\ud800"'),
    ("a number beyond a double's range (no float spelling)", '[1e400]'),
    ("an integer of 4 301 digits (above the 4 300-digit bound)", "[" + "7" * 4301 + "]"),
]


def canonical_vectors() -> dict[str, Any]:
    cases = []
    for name, text in CANONICAL_CASES:
        encoded = canonical_json(json.loads(text))
        cases.append({"name": name, "input_json": text, "canonical": encoded.decode("utf-8"),
                      "canonical_hex": encoded.hex(), "sha256": sha256_hex(encoded)})
    return {
        "about": "canonical JSON (docs/gateway-protocol.md, 'Canonical JSON'): parse "
                 "input_json, encode canonically; the result must equal canonical_hex "
                 "byte for byte. errors: inputs an encoder must refuse.",
        "cases": cases,
        "errors": [{"name": name, "input_json": text} for name, text in CANONICAL_ERRORS],
    }


# --- fingerprints -----------------------------------------------------------------------

TOOLS_WITH_SECRETS = [
    {"type": "function", "name": "get_weather", "description": "Current weather.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                     "api_token": {"type": "string"}},
                    "required": ["city"]},
     "api_key": "sk-not-digested"},
    {"type": "mcp", "server_label": "docs", "server_url": "https://mcp.example/sse",
     "headers": {"Authorization": "Bearer not-digested"}, "client_secret": "x"},
]
FINGERPRINT_INPUTS = {
    "complete": {
        "model_name": "openai/gpt-oss-20b",
        "model_weights_revision": "6cee5e81ee83917806bbde320786a8fb61efebee",
        "tokenizer_name": "openai/gpt-oss-20b",
        "tokenizer_revision": "6cee5e81ee83917806bbde320786a8fb61efebee",
        "renderer_name": "harmony", "renderer_version": "0.0.4",
        "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}",
        "chat_template_args": '{ "enable_thinking": true }',
        "reasoning_parser": "openai_gptoss", "reasoning_flags": {"effort": "medium"},
        "tool_parser": "openai", "instructions": "You are a helpful assistant.",
        "tools": TOOLS_WITH_SECRETS,
        "lora_name": "support-adapter", "lora_revision": "2" * 40,
        "multimodal_input_digests": [sha256_hex(b"image-1"), sha256_hex(b"image-2")],
        "cache_salt": "tenant-42-salt",
        "block_hash_format": "sha256-cbor-v1", "router_key_format": "prefix-blocks-v1",
        "block_size": 16,
    },
    "optional components null": {
        "model_name": "Qwen/Qwen3-8B", "model_weights_revision": "9c925d64d72725edaf899c6cb9c377fd0709d9c5",
        "tokenizer_name": "Qwen/Qwen3-8B", "tokenizer_revision": "9c925d64d72725edaf899c6cb9c377fd0709d9c5",
        "renderer_name": "chat-template", "renderer_version": "1",
        "chat_template": "{{ messages }}",
        "block_hash_format": "sha256-v1", "router_key_format": "prefix-blocks-v1",
        "block_size": 32,
    },
    "incomplete (no model_name): hashable, rejected INCOMPLETE_FINGERPRINT": {
        "model_name": None, "model_weights_revision": "a" * 40,
        "tokenizer_name": "t", "tokenizer_revision": "b" * 40,
        "renderer_name": "r", "renderer_version": "1", "chat_template_digest": "c" * 64,
        "block_hash_format": "sha256-v1", "router_key_format": "prefix-blocks-v1",
        "block_size": 16,
    },
}


def fingerprint_vectors() -> dict[str, Any]:
    cases = []
    for name, inputs in FINGERPRINT_INPUTS.items():
        fp = build_fingerprint(**inputs)
        encoded = canonical_fingerprint(fp)
        cases.append({"name": name, "fingerprint": fp.model_dump(mode="json"),
                      "canonical": encoded.decode("utf-8"),
                      "fingerprint_hash": fingerprint_hash(fp)})
    template = FINGERPRINT_INPUTS["complete"]["chat_template"]
    return {
        "about": "fingerprint_hash = sha256 hex of the canonical JSON of ALL 22 fields of "
                 "the Fingerprint record, by their Avro names (nulls and [] included).",
        "cases": cases,
        "component_recipes": {
            "instructions_digest": [
                {"instructions": text, "digest": digest_instructions(text)}
                for text in ("You are a helpful assistant.", "", "  trailing space kept  ")
            ],
            "chat_template_digest": [{"chat_template": template,
                                      "digest": digest_chat_template(template)}],
            "tools_digest": [{"tools": TOOLS_WITH_SECRETS,
                              "sanitized": sanitize_tools(TOOLS_WITH_SECRETS),
                              "digest": digest_tools(TOOLS_WITH_SECRETS)},
                             {"tools": [], "sanitized": [], "digest": digest_tools([])}],
            "cache_salt_digest": [{"cache_salt": salt, "digest": digest_cache_salt(salt)}
                                  for salt in ("tenant-42-salt", "")],
            "json_text_components": [
                {"input_json": text, "component": canonical_json(json.loads(text)).decode()}
                for text in ('{ "enable_thinking": true }', '{"effort": "medium"}', "{}")
            ],
        },
    }


# --- items --------------------------------------------------------------------------------

ITEM_OBJECTS = [
    {"type": "message", "id": "msg_user_1", "role": "user",
     "content": [{"type": "input_text", "text": "Weather in Zürich? ☀"}]},
    {"type": "reasoning", "id": "rs_1",
     "summary": [{"type": "summary_text", "text": "Need the weather tool."}]},
    {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
     "arguments": "{\"city\":\"Zürich\"}", "status": "completed"},
    {"type": "function_call_output", "id": "fco_1", "call_id": "call_1",
     "output": "{\"temp_c\":21.5,\"sky\":\"clear\"}"},
    {"type": "message", "id": "msg_asst_1", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "21.5 °C and clear.", "annotations": []}]},
]


# One item of every other catalogue type (contracts.md, section 7), in an order that keeps
# the pairing rules: how each builds its record (an ``mcp_call`` has no ``call_id``, an
# approval response answers by ``approval_request_id``, not ``call_id``). Not in
# events.json, whose bytes stay as published.
CATALOGUE_ITEM_OBJECTS = [
    {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAAABoZ3x0"},
    {"type": "web_search_call", "id": "ws_1", "status": "completed",
     "action": {"type": "search", "query": "weather Zürich"}},
    {"type": "file_search_call", "id": "fs_1", "queries": ["weather"],
     "status": "completed", "results": None},
    {"type": "code_interpreter_call", "id": "ci_1", "status": "completed",
     "code": "print(2 + 2)", "container_id": "cntr_1",
     "outputs": [{"type": "logs", "logs": "4\n"}]},
    {"type": "image_generation_call", "id": "ig_1", "status": "completed", "result": None},
    {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "wiki",
     "tools": [{"name": "ask", "input_schema": {"type": "object"}}]},
    {"type": "mcp_call", "id": "mcp_1", "server_label": "wiki", "name": "ask",
     "arguments": "{\"q\":\"Zürich\"}", "output": "A city.", "error": None},
    {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_ct_1", "name": "grep",
     "input": "Zürich"},
    {"type": "custom_tool_call_output", "id": "ctco_1", "call_id": "call_ct_1",
     "output": "3 matches"},
    {"type": "computer_call", "id": "cu_1", "call_id": "call_cu_1", "status": "completed",
     "action": {"type": "click", "button": "left", "x": 10, "y": 20},
     "pending_safety_checks": []},
    {"type": "computer_call_output", "id": "cuo_1", "call_id": "call_cu_1",
     "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64,iVBORw0K"}},
    {"type": "local_shell_call", "id": "lsh_1", "call_id": "call_ls_1", "status": "completed",
     "action": {"type": "exec", "command": ["ls"], "env": {}}},
    {"type": "local_shell_call_output", "id": "lsho_1", "call_id": "call_ls_1",
     "output": "README.md\n"},
    {"type": "shell_call", "id": "sh_1", "call_id": "call_sh_1", "status": "completed",
     "action": {"commands": ["ls"], "timeout_ms": 1000}},
    {"type": "shell_call_output", "id": "sho_1", "call_id": "call_sh_1",
     "output": [{"stdout": "README.md\n", "stderr": "",
                 "outcome": {"type": "exit", "exit_code": 0}}]},
    {"type": "apply_patch_call", "id": "ap_1", "call_id": "call_ap_1", "status": "completed",
     "operation": {"type": "update_file", "path": "a.txt", "diff": "@@\n-a\n+b\n"}},
    {"type": "apply_patch_call_output", "id": "apo_1", "call_id": "call_ap_1",
     "status": "completed", "output": "patched"},
    {"type": "mcp_approval_request", "id": "mcpr_1", "server_label": "wiki", "name": "ask",
     "arguments": "{}"},
    {"type": "mcp_approval_response", "id": "mcpa_1", "approval_request_id": "mcpr_1",
     "approve": True, "reason": None},
]


def item_record(obj: dict[str, Any]) -> Item:
    """The Item record of a Responses item object (as the gateway library builds it)."""
    content = canonical_json(obj)
    role, call_id = obj.get("role"), obj.get("call_id")
    return Item(item_id=obj["id"], type=obj["type"],
                role=role if isinstance(role, str) else None,
                call_id=call_id if isinstance(call_id, str) else None,
                content=content, content_digest=sha256_hex(content), format_version=1)


def item_vectors() -> dict[str, Any]:
    cases = []
    for obj in (*ITEM_OBJECTS, *CATALOGUE_ITEM_OBJECTS):
        record = item_record(obj)
        cases.append({"object": obj, "content": record.content.decode("utf-8"),
                      "content_hex": record.content.hex(),
                      "content_digest": record.content_digest,
                      "item": _json_record(record)})
    return {"about": "Item.content = canonical JSON of the Responses item object (with its "
                     "id and type); content_digest = sha256 hex of content; role and "
                     "call_id are the object's, null when it has none. One case of every "
                     "type of the item catalogue (docs/contracts.md, section 7).",
            "cases": cases}


# --- partition keys -------------------------------------------------------------------------

# (name, event header, the partition key by the CONTRACT's rule)
PARTITION_KEY_CASES = [
    ("conversation", {"conversation_id": "conv_1", "chain_root_id": None,
                      "response_id": "resp_3"}, "conv_1"),
    ("conversation wins over chain_root_id", {"conversation_id": "conv_1",
                                              "chain_root_id": "resp_1",
                                              "response_id": "resp_3"}, "conv_1"),
    ("chain root naming itself", {"conversation_id": None, "chain_root_id": "resp_1",
                                  "response_id": "resp_1"}, "resp_1"),
    ("chain root without chain_root_id", {"conversation_id": None, "chain_root_id": None,
                                          "response_id": "resp_1"}, "resp_1"),
    ("chain child", {"conversation_id": None, "chain_root_id": "resp_1",
                     "response_id": "resp_2"}, "resp_1"),
    ("non-ASCII id", {"conversation_id": "会话-é", "chain_root_id": None,
                      "response_id": "resp_9"}, "会话-é"),
]


def partition_key_vectors() -> dict[str, Any]:
    cases = []
    for name, header, key in PARTITION_KEY_CASES:
        raw = key.encode("utf-8")
        cases.append({"name": name, "event": header, "key": key, "key_hex": raw.hex(),
                      "crc32": zlib.crc32(raw), f"partition_of_{PARTITIONS}":
                      zlib.crc32(raw) % PARTITIONS})
    return {"about": "Kafka key = UTF-8 bytes of conversation_id, else chain_root_id, else "
                     "response_id (a chain's first response). partition = crc32(key) mod "
                     "the partition count (CRC-32/ISO-HDLC, as zlib; librdkafka's default "
                     "partitioner), the same for every producer of one deployment. The "
                     "non-ASCII case shows the key's encoding only: a turn whose ids do "
                     "not match the API's id pattern (docs/gateway-protocol.md) is "
                     "rejected CORRUPT.",
            "cases": cases}


# --- effect ids, argument and request digests ------------------------------------------------

EFFECT_CASES = [("idem_7f3a", 0, "call_1"), ("idem_7f3a", 1, "call_1"),
                ("idem_7f3a", 0, "call_2"), ("clé-€", 2, "call_ü")]
ARGUMENTS = ['{"city":"Zürich"}', '{ "units": "metric", "city": "Paris" }', "{}"]
CLAIM_CASES = [("idem_7f3a", 0, "get_weather", 0), ("idem_7f3a", 0, "get_weather", 1),
               ("idem_7f3a", 2, "shell", 0), ("clé-€", 1, "send_émail", 3)]
# Call items as a gateway holds them: which field is digested, and how a value that
# is not a JSON object text becomes one.
CALLS = [
    {"type": "function_call", "name": "get_weather", "arguments": '{"city":"Paris"}'},
    {"type": "function_call", "name": "get_weather", "arguments": "[1, 2]"},
    {"type": "function_call", "name": "get_weather", "arguments": "42"},
    {"type": "function_call", "name": "get_weather", "arguments": "not json"},
    {"type": "function_call", "name": "get_weather", "arguments": ""},
    {"type": "function_call", "name": "get_weather"},
    {"type": "custom_tool_call", "name": "grep", "input": "TODO"},
    {"type": "computer_call", "action": {"type": "click", "x": 10, "y": 20}},
    {"type": "local_shell_call", "action": {"type": "exec", "command": ["ls", "-l"]}},
    {"type": "shell_call", "action": '{"commands":["pwd"]}'},
    {"type": "apply_patch_call", "operation": {"type": "update_file", "path": "a.txt"}},
    {"type": "mcp_call", "name": "lookup", "arguments": '{"q":"ratchet"}'},
    # Parsing as every implementation must (docs/gateway-protocol.md section 4).
    {"type": "function_call", "name": "f", "arguments": "null"},
    {"type": "function_call", "name": "f", "arguments": "  "},
    {"type": "function_call", "name": "f", "arguments": " {\"a\": 1} "},
    {"type": "function_call", "name": "f", "arguments": "NaN"},
    {"type": "function_call", "name": "f", "arguments": '{"t": 1.0, "u": 1}'},
    {"type": "function_call", "name": "f", "arguments": '{"n": 123456789012345678901234567890}'},
    {"type": "function_call", "name": "f", "arguments": '{"x": 1e400}'},
    {"type": "function_call", "name": "f", "arguments": '{"a": 1, "a": 2}'},
    {"type": "function_call", "name": "f", "arguments": '{"s": "caf\\u00e9"}'},
]
REQUESTS = [
    {"model": "openai/gpt-oss-20b", "input": [{"role": "user", "content": "hi"}],
     "conversation": "conv_1", "store": True},
    {"model": "openai/gpt-oss-20b", "previous_response_id": "resp_1",
     "input": "and tomorrow?", "tools": [{"type": "function", "name": "get_weather"}],
     "temperature": 0.7, "max_output_tokens": 512, "instructions": None},
]


def effect_vectors() -> dict[str, Any]:
    return {
        "about": "effect_id = 'eff_' + first 32 hex chars of sha256(canonical JSON of "
                 "[idempotency_key, subturn_index, call_id]). arguments_digest = sha256 of "
                 "the canonical JSON of the parsed arguments object. The non-ASCII keys, "
                 "call ids and tool names show the encoding only: an idempotency_key or "
                 "tool_name outside the id patterns of docs/gateway-protocol.md (sections "
                 "1 and 8) is refused there.",
        "effect_ids": [{"idempotency_key": key, "subturn_index": index, "call_id": call,
                        "canonical": canonical_json([key, index, call]).decode(),
                        "effect_id": effect_id_for(key, index, call)}
                       for key, index, call in EFFECT_CASES],
        "arguments_digests": [{"arguments": text,
                               "arguments_digest": arguments_digest(json.loads(text))}
                              for text in ARGUMENTS],
        "about_claimed": "a claimed effect's effect_id = 'eff_' + first 32 hex chars of "
                         "sha256(canonical JSON of ['claim', idempotency_key, "
                         "subturn_index, tool_name, occurrence]).",
        "claimed_effect_ids": [
            {"idempotency_key": key, "subturn_index": index, "tool_name": tool,
             "occurrence": occurrence,
             "canonical": canonical_json(["claim", key, index, tool, occurrence]).decode(),
             "effect_id": effect_id_for_claim(key, index, tool, occurrence)}
            for key, index, tool, occurrence in CLAIM_CASES],
        "about_calls": "arguments_digest of a call item: the field its type names "
                       "(input, action, operation, else arguments), parsed if JSON text "
                       "(strict JSON: no NaN or Infinity; integers exact and apart from "
                       "floats, 1.0 stays 1.0); a non-object value (null too) becomes "
                       "{'__value__': v}; text that is not JSON (only whitespace too), "
                       "holds a key twice in one object, or whose value has no "
                       "canonical form (a number beyond a double, an integer of more "
                       "than 4300 digits), {'__raw__': text} with the text as it is; a "
                       "missing or empty one {}.",
        "call_arguments_digests": [{"call": call, "arguments_digest": arguments_digest_of(call)}
                                   for call in CALLS],
    }


def request_vectors() -> dict[str, Any]:
    return {"about": "request_digest = sha256 hex of the canonical JSON of the logical "
                     "request (the Responses create body without transport fields).",
            "cases": [{"request": request, "canonical": canonical_json(request).decode(),
                       "request_digest": canonical_digest(request)} for request in REQUESTS]}


# --- sample events (Avro body, schema id independent) ---------------------------------------

T0 = 1767225600000  # 2026-01-01T00:00:00Z
HOUR = 3_600_000


def sample_events() -> list[Frozen]:
    fp = build_fingerprint(**FINGERPRINT_INPUTS["complete"])
    fp_hash = fingerprint_hash(fp)
    header = {"tenant_id": "tenant_a", "conversation_id": "conv_1", "chain_root_id": None,
              "response_id": "resp_2"}
    items = [item_record(obj) for obj in ITEM_OBJECTS]
    effect_id = effect_id_for("idem_7f3a", 0, "call_1")
    token_hash = canonical_digest(["tokens", fp_hash, 200])
    turn = TurnCompleted(
        event_id="9b2f6c1e-0d4a-4f5e-8c3b-2a1d0e9f8c7b", produced_at=T0 + 2_000, **header,
        idempotency_key="idem_7f3a", request_digest=canonical_digest(REQUESTS[0]), attempt=1,
        previous_response_id=None, expected_head_seq=1, status="completed",
        incomplete_reason=None, input_items=tuple(items[:1]), output_items=tuple(items[1:]),
        effective_config=EffectiveConfig(instructions_digest=fp.instructions_digest,
                                         tools_digest=fp.tools_digest, tool_choice="auto",
                                         truncation="disabled", truncated=False),
        fingerprint=fp, fingerprint_hash=fp_hash,
        boundary_proof=BoundaryProof(
            prefix_hash=canonical_digest(["prefix", fp_hash, 120]), prefix_count=120,
            append_hash=canonical_digest(["append", fp_hash, 80]), append_count=80,
            combined_hash=token_hash, combined_count=200, boundary_kind="message_end",
            fingerprint_hash=fp_hash, expires_at=T0 + HOUR),
        token_artifact=TokenArtifact(artifact_id="art_1", token_hash=token_hash,
                                     token_count=200, safe_append_boundary=200,
                                     fingerprint_hash=fp_hash, expires_at=T0 + HOUR),
        router_receipt=None, subturns=(Subturn(index=0, effect_ids=(effect_id,)),),
        tool_effect_ids=(effect_id,), stream=StreamInfo(streamed=True, client_disconnected=False),
        expires_at=T0 + 30 * 24 * HOUR, gateway_id=None)
    effect = ToolEffect(
        event_id="1c7e9a4b-3f2d-4b6a-9e8c-7d5f3a1b2c4d", produced_at=T0 + 1_000, **header,
        effect_id=effect_id, idempotency_key="idem_7f3a", attempt=1, subturn_index=0,
        call_id="call_1", tool_name="get_weather",
        arguments_digest=arguments_digest(json.loads(ITEM_OBJECTS[2]["arguments"])),
        status="succeeded", output=items[3], executed_at=T0 + 1_000)
    cancelled = TurnCancelled(
        event_id="5e8d2c7a-6b1f-4e3d-a9c2-8f7b6e5d4c3a", produced_at=T0 + 3_000,
        tenant_id="tenant_a", conversation_id=None, chain_root_id="resp_1",
        response_id="resp_5", idempotency_key="idem_c4", cancelled_at=T0 + 3_000)
    return [turn, effect, cancelled]


def _json_record(record: Frozen) -> dict[str, Any]:
    """A record as JSON: bytes as their UTF-8 text, enums as symbols, timestamps as ms."""
    return json.loads(json.dumps(record.to_avro(), default=_plain))


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    raise TypeError(type(value))


def avro_body(record: Frozen) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, avsc.parsed(record_name(record)), record.to_avro())
    return out.getvalue()


def event_vectors() -> dict[str, Any]:
    cases = []
    for event in sample_events():
        name = record_name(event)
        body = avro_body(event)
        cases.append({
            "record": name,
            "subject": f"io.ratchet.{name}",
            "schema_sha256": sha256_hex(avsc.schema_text(name).encode("utf-8")),
            "key": event.partition_key, "key_hex": event.partition_key.encode().hex(),
            "value": _json_record(event),
            "avro_body_hex": body.hex(),
            "wire_value_hex_if_schema_id_is_42": (b"\x00" + (42).to_bytes(4, "big") + body).hex(),
        })
    return {"about": "One sample per gateway event. avro_body_hex is the Avro binary body "
                     "(no 5-byte header: schema ids depend on the registry), written with "
                     "the current schemas/<record>.avsc; schema_sha256 is sha256 of the "
                     "schema text ratchet registers. In 'value', bytes fields (Item.content) "
                     "are their UTF-8 text, timestamps epoch milliseconds, enums symbols. "
                     "Timestamps are fixed (the bytes depend on them) and lie in the past "
                     "(around 2026-01-01): they check an encoder, they are not events to "
                     "send. A sample sent as it is would be judged at its arrival: its "
                     "token artifact and boundary proof have expired, so it would be "
                     "promoted without a reusable artifact (reads fall back NO_ARTIFACT); "
                     "a live event carries the current times and future expiries.",
            "cases": cases}


# --- files ---------------------------------------------------------------------------------

BUILDERS = {
    "canonical-json.json": canonical_vectors,
    "fingerprints.json": fingerprint_vectors,
    "items.json": item_vectors,
    "partition-keys.json": partition_key_vectors,
    "effect-ids.json": effect_vectors,
    "request-digests.json": request_vectors,
    "events.json": event_vectors,
}


def render(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def build() -> dict[str, str]:
    """``{file name: text}`` of every vector file."""
    return {name: render(builder()) for name, builder in BUILDERS.items()}


def main(argv: list[str]) -> int:
    files = build()
    if "--check" in argv:
        stale = [n for n, text in files.items()
                 if not (VECTOR_DIR / n).exists() or (VECTOR_DIR / n).read_text("utf-8") != text]
        print("stale vectors: " + ", ".join(stale) if stale else "vectors up to date")
        return 1 if stale else 0
    VECTOR_DIR.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (VECTOR_DIR / name).write_text(text, encoding="utf-8")
    print(f"wrote {len(files)} files to {VECTOR_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
