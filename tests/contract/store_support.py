"""Builders and a Cassandra keyspace helper shared by the store's contract and
integration tests."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ratchet.domain.history import PromotionMode, StoredTokenArtifact
from ratchet.domain.plan import PromotionRequest
from schemas.canonical import canonical_json_text as canonical_json
from schemas.models import Certification, Item, sha256_hex

_MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "infra" / "migrations"
# The store's tables: turns (004), response_claims (007), the turns' lineage digests (009),
# the request facts marks (011), the accepted attempt and its effects (012) and the
# requests of chains' first responses (013).
MIGRATIONS = tuple(
    _MIGRATIONS_DIR / name
    for name in ("004_turn_rows.cql", "007_response_claims.cql", "009_lineage_digest.cql",
                 "011_request_facts_mark.cql", "012_accepted_attempt.cql",
                 "013_request_claims.cql")
)
T0 = datetime(2030, 1, 1, tzinfo=UTC)


class FakeClock:
    """A clock tests move by hand."""

    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def uid(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def item(
    text: str = "hi", *, type_: str = "message", role: str | None = "user", size: int = 0
) -> Item:
    body = {"text": text} if not size else {"text": text, "pad": "x" * size}
    # The content says what the record's type and role columns say (absent role = None),
    # as every promoted item's does: a read checks it (ratchet/domain/history.py).
    body |= {"type": type_} if role is None else {"type": type_, "role": role}
    content = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return Item(
        item_id=uid("item"),
        type=type_,
        role=role,
        content=content,
        content_digest=sha256_hex(content),
    )


def artifact(fingerprint: str = "fp1", expires_at: datetime | None = None) -> StoredTokenArtifact:
    return StoredTokenArtifact(
        artifact_id=uid("art"),
        token_hash="th",
        token_count=42,
        safe_append_boundary=40,
        fingerprint_hash=fingerprint,
        expires_at=expires_at or T0 + timedelta(hours=1),
    )


def stored_receipt(**changes) -> str:
    """A stored router receipt that covers the artifact of ``binding_proof`` (42
    tokens) as the processor keeps it: every field, canonical JSON (reads check it
    again: ``rehydration.receipt_covers``)."""
    return canonical_json({"receipt_id": "rc1", "router_key_format": "prefix-blocks-v1",
                           "covered_tokens": 40, "expires_at": 4_102_444_800_000,
                           "issuer": "router-0", **changes})


def binding_proof(fingerprint: str = "fp1", token_count: int = 42,
                  token_hash: str = "th") -> str:
    """A stored boundary proof that binds ``artifact()`` to the turn (what the API
    checks before offering the artifact for reuse: ``rehydration.proof_binds``)."""
    return canonical_json({
        "boundary_kind": "append", "prefix_hash": "ph", "prefix_count": token_count - 2,
        "append_hash": "ah", "append_count": 2, "combined_hash": token_hash,
        "combined_count": token_count, "fingerprint_hash": fingerprint,
        "expires_at": 4_102_444_800_000,
    })


def conversation_turn(
    tenant: str,
    conversation: str,
    expected_head_seq: int,
    *,
    n_items: int = 2,
    key: str | None = None,
    digest: str | None = None,
    response_id: str | None = None,
    items: tuple[Item, ...] | None = None,
    certified: bool = True,
) -> PromotionRequest:
    key = key or uid("key")
    return PromotionRequest(
        tenant_id=tenant,
        partition_key=conversation,
        mode=PromotionMode.CONVERSATION,
        response_id=response_id or uid("resp"),
        idempotency_key=key,
        request_digest=digest or sha256_hex(key.encode()),
        items=items if items is not None else tuple(item(f"t{i}") for i in range(n_items)),
        certification=Certification.CERTIFIED if certified else Certification.LOGICAL_ONLY,
        fingerprint_hash="fp1",
        expected_head_seq=expected_head_seq,
        token_artifact=artifact() if certified else None,
        router_receipt=stored_receipt(),
        boundary_proof=binding_proof(),
    )


def chain_turn(
    tenant: str,
    root: str,
    response_id: str,
    previous: str | None,
    *,
    n_items: int = 2,
    key: str | None = None,
) -> PromotionRequest:
    key = key or uid("key")
    return PromotionRequest(
        tenant_id=tenant,
        partition_key=root,
        mode=PromotionMode.CHAIN,
        response_id=response_id,
        idempotency_key=key,
        request_digest=sha256_hex(key.encode()),
        items=tuple(item(f"{response_id}-{i}") for i in range(n_items)),
        certification=Certification.CERTIFIED,
        fingerprint_hash="fp1",
        previous_response_id=previous,
        token_artifact=artifact(),
    )


class OnCassandra:
    """A contract's Cassandra half: stores on the contract keyspace (``store_session``,
    ``tests/contract/conftest.py``), ``self.session`` for the tests' damage."""

    @pytest.fixture(autouse=True)
    def _session(self, store_session, settings):
        self.session = store_session
        self.settings = settings

    def make_store(self, options):
        """At the levels the worker and the API use (``store_levels``): QUORUM with
        ``RATCHET_DATACENTERS=several``, so the contract holds across datacenters."""
        from services.cassandra_cluster import store_levels  # noqa: PLC0415 - driver
        from services.store.cassandra import CassandraCheckpointStore  # noqa: PLC0415

        return CassandraCheckpointStore(self.session, options, timeout_s=30,
                                        **store_levels(self.settings))


def create_store_keyspace(cluster, keyspace: str, replication: str):
    """Create ``keyspace``, apply the store's migrations into it, return a session on it."""
    admin = cluster.connect()
    admin.execute(
        f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {replication}", timeout=60
    )
    session = cluster.connect(keyspace)
    for statement in migration_statements():
        session.execute(statement, timeout=60)
    admin.shutdown()
    return session


def migrated_keyspace(cluster, settings, prefix: str):
    """A session on a new keyspace (``prefix`` + random) with every migration applied,
    the tables at the schema this tree defines; the keyspace is dropped after. For a
    fixture: ``yield from migrated_keyspace(...)``."""
    from dataclasses import replace

    from infra.migrate import apply_migrations

    keyspace = f"{prefix}_{uuid.uuid4().hex[:8]}"
    apply_migrations(cluster, replace(settings, keyspace=keyspace))
    session = cluster.connect(keyspace)
    yield session
    session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)


def migration_statements() -> list[str]:
    """The store's migrations, split exactly the way `ratchet migrate` splits them."""
    from infra.migrate import split_statements

    return [s for path in MIGRATIONS for s in split_statements(path.read_text())]
