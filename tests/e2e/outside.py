"""An outside gateway: drives ratchet the way a gateway in another language would.

Written from docs/gateway-protocol.md alone, on purpose WITHOUT ratchet's Python (no
``schemas``, ``ratchet`` or ``services`` import): events are plain dicts, digests are
computed here with ``hashlib``/``json``, values are Confluent-framed Avro encoded with
fastavro against the schema the registry holds under ``io.ratchet.<Record>``, keys are
the UTF-8 partition key. Results are read only where an outside gateway can see them:
the output topics (decoded with the writer schema fetched by id) and the HTTP API.

The canonical JSON and the digest recipes below are a second, independent
implementation of the protocol's rules: if ratchet's own drifted, these tests would
disagree with it (docs/vectors/ pins both to the same bytes).
"""

from __future__ import annotations

import hashlib
import io
import json
import struct
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import fastavro
import httpx
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

Json = dict[str, Any]

OUTPUT_TOPICS = ("checkpoints", "rejections", "orphaned-effects", "dead-letters")


# --- the protocol's recipes (docs/gateway-protocol.md) -----------------------------------


def canonical(value: Any) -> bytes:
    """Canonical JSON: sorted keys, `,` and `:`, explicit nulls, UTF-8, no NaN."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def uid(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def now_ms() -> int:
    return int(time.time() * 1000)


def item(obj: Mapping[str, Any]) -> Json:
    """An Item record from a Responses item object (which must carry ``id`` and ``type``)."""
    content = canonical(dict(obj))
    return raw_item(obj, content)


def raw_item(obj: Mapping[str, Any], content: bytes) -> Json:
    """An Item whose ``content`` is exactly ``content`` (digest computed over it)."""
    role, call_id = obj.get("role"), obj.get("call_id")
    return {
        "item_id": obj["id"],
        "type": obj["type"],
        "role": role if isinstance(role, str) else None,
        "call_id": call_id if isinstance(call_id, str) else None,
        "content": content,
        "content_digest": sha256_hex(content),
        "format_version": 1,
    }


def user(text: str) -> Json:
    return item({"id": uid("msg"), "type": "message", "role": "user",
                 "content": [{"type": "input_text", "text": text}]})


def assistant(text: str) -> Json:
    return item({"id": uid("msg"), "type": "message", "role": "assistant",
                 "content": [{"type": "output_text", "text": text}]})


def fingerprint() -> Json:
    """A complete Fingerprint: every field of the record, by its Avro name."""
    return {
        "fingerprint_version": 1,
        "model_name": "outside/model-8b",
        "model_weights_revision": "a" * 40,
        "tokenizer_name": "outside/model-8b",
        "tokenizer_revision": "b" * 40,
        "renderer_name": "chat-template",
        "renderer_version": "1.0.0",
        "chat_template_digest": sha256_hex(b"{{ messages }}"),
        "chat_template_args": "{}",
        "reasoning_parser": None,
        "reasoning_flags": "{}",
        "tool_parser": None,
        "instructions_digest": sha256_hex(b""),
        "tools_digest": sha256_hex(canonical([])),
        "lora_name": None,
        "lora_revision": None,
        "multimodal_input_digests": [],
        "cache_salt_digest": None,
        "block_hash_format": "sha256-v1",
        "router_key_format": "prefix-blocks-v1",
        "block_size": 16,
        "item_format_version": 1,
    }


FINGERPRINT = fingerprint()
FINGERPRINT_HASH = sha256_hex(canonical(FINGERPRINT))


def partition_key(event: Mapping[str, Any]) -> str:
    """conversation_id, else chain_root_id, else (a chain's first response) response_id."""
    return event.get("conversation_id") or event.get("chain_root_id") or event["response_id"]


def turn(
    tenant_id: str,
    response_id: str,
    input_items: list[Json],
    output_items: list[Json],
    *,
    conversation_id: str | None = None,
    expected_head_seq: int | None = None,
    chain_root_id: str | None = None,
    previous_response_id: str | None = None,
    idempotency_key: str | None = None,
    request: Mapping[str, Any] | None = None,
    status: str = "completed",
    certified: bool = True,
    expires_at: int | None = None,
) -> Json:
    """A TurnCompleted record (a dict in Avro field names).

    ``certified``: with a token artifact and a boundary proof consistent with it.
    """
    produced = now_ms()
    artifact = proof = None
    if certified:
        token_hash = sha256_hex(response_id.encode())
        artifact = {"artifact_id": uid("art"), "token_hash": token_hash, "token_count": 120,
                    "safe_append_boundary": 120, "fingerprint_hash": FINGERPRINT_HASH,
                    "expires_at": produced + 3_600_000}
        proof = {"prefix_hash": sha256_hex(b"prefix"), "prefix_count": 100,
                 "append_hash": sha256_hex(b"append"), "append_count": 20,
                 "combined_hash": token_hash, "combined_count": 120,
                 "boundary_kind": "message_end", "fingerprint_hash": FINGERPRINT_HASH,
                 "expires_at": produced + 3_600_000}
    request = request if request is not None else {"input": uid("request")}
    return {
        "event_id": str(uuid.uuid4()),
        "tenant_id": tenant_id,
        "conversation_id": conversation_id,
        "chain_root_id": chain_root_id,
        "response_id": response_id,
        "produced_at": produced,
        "idempotency_key": idempotency_key or uid("idem"),
        "request_digest": sha256_hex(canonical(dict(request))),
        "attempt": 1,
        "previous_response_id": previous_response_id,
        "expected_head_seq": expected_head_seq,
        "status": status,
        "incomplete_reason": "max_output_tokens" if status == "incomplete" else None,
        "input_items": input_items,
        "output_items": output_items,
        "effective_config": {"instructions_digest": FINGERPRINT["instructions_digest"],
                             "tools_digest": FINGERPRINT["tools_digest"],
                             "tool_choice": "auto", "truncation": "disabled",
                             "truncated": False},
        "fingerprint": FINGERPRINT,
        "fingerprint_hash": FINGERPRINT_HASH,
        "boundary_proof": proof,
        "token_artifact": artifact,
        "router_receipt": None,
        "subturns": [],
        "tool_effect_ids": [],
        "stream": {"streamed": False, "client_disconnected": False},
        "expires_at": expires_at,
    }


# --- the wire -----------------------------------------------------------------------


class Registry:
    """The two registry calls a producer and a consumer need (Confluent REST API)."""

    def __init__(self, url: str) -> None:
        self._http = httpx.Client(base_url=url.rstrip("/") + "/", timeout=10)
        self._by_subject: dict[str, tuple[int, Any]] = {}
        self._by_id: dict[int, Any] = {}

    def latest(self, record: str) -> tuple[int, Any]:
        """(schema id, parsed schema) registered under subject ``io.ratchet.<record>``."""
        if record not in self._by_subject:
            answer = self._http.get(f"subjects/io.ratchet.{record}/versions/latest")
            answer.raise_for_status()
            body = answer.json()
            parsed = fastavro.parse_schema(json.loads(body["schema"]))
            self._by_subject[record] = (body["id"], parsed)
            self._by_id[body["id"]] = parsed
        return self._by_subject[record]

    def by_id(self, schema_id: int) -> Any:
        if schema_id not in self._by_id:
            answer = self._http.get(f"schemas/ids/{schema_id}")
            answer.raise_for_status()
            self._by_id[schema_id] = fastavro.parse_schema(json.loads(answer.json()["schema"]))
        return self._by_id[schema_id]

    def encode(self, record: str, data: Mapping[str, Any]) -> bytes:
        """Confluent wire format: 0x00, 4-byte big-endian schema id, Avro binary body."""
        schema_id, schema = self.latest(record)
        body = io.BytesIO()
        fastavro.schemaless_writer(body, schema, dict(data))
        return struct.pack(">bI", 0, schema_id) + body.getvalue()

    def decode(self, value: bytes) -> tuple[str, Json]:
        """(record name, record) of a Confluent-framed value."""
        magic, schema_id = struct.unpack(">bI", value[:5])
        assert magic == 0, f"magic byte {magic}"
        schema = self.by_id(schema_id)
        record = fastavro.schemaless_reader(io.BytesIO(value[5:]), schema, schema)
        return schema["name"].rsplit(".", 1)[-1], record

    def close(self) -> None:
        self._http.close()


@dataclass
class Seen:
    topic: str  # without the prefix: checkpoints, rejections, ...
    record: str
    value: Json


class OutsideGateway:
    """Produces raw records to ``<prefix>gateway-events``; reads the four output topics."""

    # Large enough for the protocol's maximum record (docs/gateway-protocol.md, "Size").
    PRODUCER_MAX_BYTES = 16 * 1024 * 1024 + 64 * 1024

    def __init__(self, bootstrap: str, registry_url: str, prefix: str, api_url: str) -> None:
        self.prefix = prefix
        self.registry = Registry(registry_url)
        self.http = httpx.Client(base_url=api_url, timeout=30)
        self.events_topic = f"{prefix}gateway-events"
        self._producer = Producer({
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
            "message.max.bytes": self.PRODUCER_MAX_BYTES,
        })
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": uid("outside"),
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "fetch.max.bytes": 64 * 1024 * 1024,
            "max.partition.fetch.bytes": 32 * 1024 * 1024,
        })
        topics = self._consumer.list_topics(timeout=10).topics
        self._consumer.assign([
            TopicPartition(f"{prefix}{name}", p, -2)  # -2: from the beginning
            for name in OUTPUT_TOPICS for p in topics[f"{prefix}{name}"].partitions
        ])
        self._thread = threading.Thread(target=self._follow, daemon=True, name="outside")
        self._thread.start()

    # -- producing ----------------------------------------------------------------------

    def produce(self, key: str | None, value: bytes) -> tuple[int, int]:
        """Produce one record and wait for the broker; (partition, offset) or raise."""
        report: list[tuple[KafkaError | None, Any]] = []
        self._producer.produce(
            self.events_topic, value=value, key=None if key is None else key.encode("utf-8"),
            on_delivery=lambda err, msg: report.append((err, msg)))
        self._producer.flush(60)
        assert report, "no delivery report within 60 s"
        err, msg = report[0]
        if err is not None:
            raise DeliveryFailed(err)
        return msg.partition(), msg.offset()

    def send(self, record: str, event: Mapping[str, Any]) -> tuple[int, int]:
        return self.produce(partition_key(event), self.registry.encode(record, event))

    def send_turn(self, event: Mapping[str, Any]) -> tuple[int, int]:
        return self.send("TurnCompleted", event)

    # -- outputs ------------------------------------------------------------------------

    def _follow(self) -> None:
        while not self._stop.is_set():
            for msg in self._consumer.consume(200, timeout=0.2):
                if msg.error():
                    continue
                record, value = self.registry.decode(msg.value())
                topic = msg.topic().removeprefix(self.prefix)
                with self._lock:
                    self.seen.append(Seen(topic, record, value))

    def records(self, match: Callable[[Seen], bool]) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if match(s)]

    def outcomes(self, event: Mapping[str, Any]) -> list[Seen]:
        """CheckpointPromoted / PromotionRejected published for this TurnCompleted."""
        return self.records(lambda s: s.topic in ("checkpoints", "rejections")
                            and s.value["tenant_id"] == event["tenant_id"]
                            and s.value["response_id"] == event["response_id"]
                            and s.value["idempotency_key"] == event["idempotency_key"])

    def outcome(self, event: Mapping[str, Any], timeout_s: float = 60) -> Seen:
        """The first outcome of ``event`` (waits for it)."""
        deadline = time.monotonic() + timeout_s
        while not (found := self.outcomes(event)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no outcome for {event['response_id']} in {timeout_s}s")
            time.sleep(0.05)
        return found[0]

    def promoted(self, event: Mapping[str, Any], timeout_s: float = 60) -> Json:
        """Send ``event`` and return its CheckpointPromoted (fails on a rejection)."""
        self.send_turn(event)
        seen = self.outcome(event, timeout_s)
        assert seen.record == "CheckpointPromoted", seen.value
        return seen.value

    def rejected(self, event: Mapping[str, Any], timeout_s: float = 60) -> Json:
        """Send ``event`` and return its PromotionRejected (fails on a promotion)."""
        self.send_turn(event)
        seen = self.outcome(event, timeout_s)
        assert seen.record == "PromotionRejected", seen.value
        return seen.value

    # -- HTTP ---------------------------------------------------------------------------

    def response_history(self, tenant_id: str, response_id: str, **headers: str) -> httpx.Response:
        return self.http.get(f"/v1/responses/{response_id}/history",
                             params={"tenant_id": tenant_id, "fingerprint_hash": FINGERPRINT_HASH},
                             headers=headers)

    def conversation_history(self, tenant_id: str, conversation_id: str,
                             **headers: str) -> httpx.Response:
        return self.http.get(f"/v1/conversations/{conversation_id}/history",
                             params={"tenant_id": tenant_id, "fingerprint_hash": FINGERPRINT_HASH},
                             headers=headers)

    def status(self, tenant_id: str, response_id: str) -> Json:
        answer = self.http.get(f"/v1/responses/{response_id}/status",
                               params={"tenant_id": tenant_id})
        assert answer.status_code == 200, answer.text
        return answer.json()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._consumer.close()
        self._producer.flush(10)
        self.registry.close()
        self.http.close()


class DeliveryFailed(RuntimeError):
    def __init__(self, error: KafkaError) -> None:
        self.error = error
        super().__init__(str(error))


def epoch_ms(value: Any) -> int | None:
    """A decoded timestamp-millis (fastavro gives aware datetimes) as epoch ms."""
    if value is None or isinstance(value, int):
        return value
    assert isinstance(value, datetime)
    return int(value.astimezone(UTC).timestamp() * 1000)


def item_contents(body: Mapping[str, Any]) -> list[str]:
    return [entry["content"] for entry in body["items"]]
