"""The local Kafka's cluster id must survive the storage tool's argument parser."""

from __future__ import annotations

import base64
import re
import uuid

from infra.servers import kafka


def test_cluster_ids_are_22_url_safe_characters_and_never_start_with_a_dash(monkeypatch):
    # Feed the generator UUIDs whose encoding starts with "-" (0xf8.. -> "-"), mixed
    # with ordinary ones: it must skip the first kind, never return it.
    dashed = uuid.UUID(bytes=b"\xf8" + bytes(15))
    assert base64.urlsafe_b64encode(dashed.bytes).decode().startswith("-")
    draws = iter([dashed, dashed, uuid.UUID(int=7), dashed, uuid.UUID(int=8)])
    monkeypatch.setattr(kafka.uuid, "uuid4", lambda: next(draws))

    first, second = kafka.new_cluster_id(), kafka.new_cluster_id()

    assert first == base64.urlsafe_b64encode(uuid.UUID(int=7).bytes).decode().rstrip("=")
    assert second == base64.urlsafe_b64encode(uuid.UUID(int=8).bytes).decode().rstrip("=")


def test_real_cluster_ids_have_the_kraft_shape():
    ids = {kafka.new_cluster_id() for _ in range(2000)}
    assert len(ids) == 2000
    assert all(re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{21}", i) for i in ids)
