"""The store under ``RATCHET_DATACENTERS=several`` on a real two-datacenter cluster.

The cluster is started through ``ratchet infra cluster up`` (one node in dc1 on
127.0.0.2, one in dc2 on 127.0.0.3; docs/operations.md, "A local cluster of several
datacenters") by a session fixture that stops it at the end, also when a test failed,
unless it was already serving, and at once when its start failed or timed out. A
keyspace is migrated by ``ratchet migrate`` with ``NetworkTopologyStrategy {dc1: 1,
dc2: 1}``; on it the store contract's core promotion cases run through stores in dc1,
and turns promoted in dc1 are read at once in dc2 (and the reverse). When the cluster cannot start, the tests fail in CI and are skipped
elsewhere, like every service here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from dataclasses import replace

import pytest

from services.store.base import StoreOptions
from tests.contract import test_store_contract as contract
from tests.contract.store_support import conversation_turn, uid
from tests.services import in_ci

pytestmark = pytest.mark.integration

DC1, DC2 = "127.0.0.2", "127.0.0.3"
PORT = 19042
REPLICATION = "{'class': 'NetworkTopologyStrategy', 'dc1': 1, 'dc2': 1}"
START_TIMEOUT_S = 900  # two nodes one after the other, on a loaded box


def _ratchet(env: dict[str, str], *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ratchet.cli", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def _unavailable(msg: str) -> None:
    if in_ci():
        pytest.fail(f"two-datacenter cluster unavailable in CI: {msg}", pytrace=False)
    pytest.skip(f"two-datacenter cluster unavailable (set CI=true to make this a failure): "
                f"{msg}")


@pytest.fixture(scope="session")
def two_datacenters():
    """The base settings (``RATCHET_HOME`` holds the jars) with the cluster serving."""
    from ratchet.settings import Settings

    base = Settings.from_env()
    env = {**os.environ, **base.to_env()}
    try:
        serving = _ratchet(env, "infra", "cluster", "status", timeout=120).returncode == 0
    except subprocess.TimeoutExpired:
        _unavailable("`ratchet infra cluster status` did not answer in 120 s")
    if not serving:
        t0 = time.monotonic()
        try:
            up = _ratchet(env, "infra", "cluster", "up", "--datacenters", "2",
                          timeout=START_TIMEOUT_S)
            failed = None if up.returncode == 0 else (up.stderr or up.stdout).strip()[-2000:]
        except subprocess.TimeoutExpired:
            # Only `up` itself was killed: the nodes it launched run on, recorded in the
            # cluster's state, and are stopped like those of a failed start.
            failed = f"`ratchet infra cluster up` did not finish in {START_TIMEOUT_S} s"
        if failed is not None:
            _ratchet(env, "infra", "cluster", "down", timeout=300)
            _unavailable(failed)
        print(f"\ntwo-datacenter cluster started in {time.monotonic() - t0:.0f}s")
    try:
        yield base
    finally:
        if not serving:
            down = _ratchet(env, "infra", "cluster", "down", "--purge", timeout=300)
            assert down.returncode == 0, down.stderr


def _in(base, keyspace: str, dc: str, host: str):
    return replace(base, cassandra_hosts=(host,), cassandra_port=PORT, cassandra_local_dc=dc,
                   datacenters="several", replication=REPLICATION, keyspace=keyspace)


@pytest.fixture(scope="module")
def keyspace(two_datacenters):
    """A keyspace ``ratchet migrate`` created across both datacenters, dropped after."""
    name = f"two_dc_{uuid.uuid4().hex[:8]}"
    settings = _in(two_datacenters, name, "dc1", DC1)
    migrate = _ratchet({**os.environ, **settings.to_env()}, "migrate", timeout=600)
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr
    yield name
    from services.cassandra_cluster import open_cluster

    cluster = open_cluster(settings)
    try:
        cluster.connect().execute(f"DROP KEYSPACE IF EXISTS {name}", timeout=120)
    finally:
        cluster.shutdown()


def _session(settings):
    from services.cassandra_cluster import open_cluster

    cluster = open_cluster(settings)
    return cluster, cluster.connect(settings.keyspace)


@pytest.fixture(scope="module")
def settings(two_datacenters, keyspace):
    """dc1's settings: the stores of the contract cases below are built from them."""
    return _in(two_datacenters, keyspace, "dc1", DC1)


@pytest.fixture(scope="module")
def dc2_settings(two_datacenters, keyspace):
    return _in(two_datacenters, keyspace, "dc2", DC2)


@pytest.fixture(scope="module")
def store_session(settings):
    """A session coordinated in dc1 (its contact point and local datacenter)."""
    cluster, session = _session(settings)
    yield session
    cluster.shutdown()


@pytest.fixture(scope="module")
def dc2_session(dc2_settings):
    cluster, session = _session(dc2_settings)
    yield session
    cluster.shutdown()


# The contract's core promotion cases, on the migrated keyspace through dc1 at the
# levels of `several` (``OnCassandra.make_store``); the rest of the contract is left to
# tests/contract (one node), to keep this module's cost small.
CORE = {
    "test_first_turn_is_seq_1_and_readable",
    "test_turns_append_in_order_with_lineage",
    "test_duplicate_returns_the_original",
    "test_same_key_other_digest_is_key_reused",
    "test_stale_head_conflicts_and_future_head_is_ahead",
    "test_extends_with_a_stale_hint_after_another_worker_moved",
    "test_a_fact_recorded_before_the_promotion_refuses_it",
    "test_a_response_id_is_promoted_once",
    "test_a_response_id_is_bound_once_across_partitions",
    "test_chain_lineage_and_forks",
    "test_chain_response_promoted_once_and_duplicates",
    "test_a_damaged_checkpoint_row_is_corrupt_to_every_lookup",
    "test_concurrent_promoters_take_one_seq_each",
}


class TestStoreCoreAcrossTwoDatacenters(contract.TestCassandraStore):
    pass


for _name in dir(contract.TestCassandraStore):
    if _name.startswith("test_") and _name not in CORE:
        setattr(TestStoreCoreAcrossTwoDatacenters, _name, None)  # not collected


def _store(session, settings):
    from services.cassandra_cluster import store_levels
    from services.store.cassandra import CassandraCheckpointStore

    return CassandraCheckpointStore(session, StoreOptions(), timeout_s=30,
                                    **store_levels(settings))


def test_the_core_cases_are_the_contracts():
    """A case renamed in the contract would silently drop out of CORE."""
    assert set(dir(contract.TestCassandraStore)) >= CORE
    cls = TestStoreCoreAcrossTwoDatacenters
    collected = {n for n in dir(cls) if n.startswith("test_") and callable(getattr(cls, n))}
    assert collected == CORE


def test_each_session_is_coordinated_in_its_own_datacenter(store_session, dc2_session):
    local = "SELECT data_center, listen_address FROM system.local"
    assert store_session.execute(local).one().data_center == "dc1"
    assert dc2_session.execute(local).one().data_center == "dc2"
    replication = store_session.cluster.metadata.keyspaces[
        store_session.keyspace].replication_strategy
    assert type(replication).__name__ == "NetworkTopologyStrategy"
    assert replication.dc_replication_factors == {"dc1": 1, "dc2": 1}


def test_a_turn_promoted_in_one_datacenter_is_read_at_once_in_the_other(
        store_session, dc2_session, settings, dc2_settings):
    """Promoted through dc1, read right after through dc2 (a worker in one datacenter,
    an API in the other), then the next turn promoted in dc2 and seen by dc1's store as
    the head it must conflict with: 10 conversations."""
    from ratchet.domain.history import VerifiedHistory
    from ratchet.domain.plan import Conflict, Promoted

    in_dc1, in_dc2 = _store(store_session, settings), _store(dc2_session, dc2_settings)
    tenant = uid("tenant")
    for _ in range(10):
        conv = uid("conv")
        first = conversation_turn(tenant, conv, 0)
        promoted = in_dc1.promote(first)
        assert isinstance(promoted, Promoted) and promoted.seq == 1
        assert in_dc2.get_checkpoint(tenant, first.response_id) == promoted.checkpoint
        history = in_dc2.read_history(tenant, conversation_id=conv)
        assert isinstance(history, VerifiedHistory) and history.items == first.items
        second = conversation_turn(tenant, conv, 1)
        assert isinstance(in_dc2.promote(second, extends=first.response_id), Promoted)
        assert in_dc1.promote(conversation_turn(tenant, conv, 1)) == Conflict(2)
        both = in_dc1.read_history(tenant, response_id=second.response_id)
        assert both.items == first.items + second.items and both.head_seq == 2
