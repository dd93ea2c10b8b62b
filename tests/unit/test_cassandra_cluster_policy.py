"""Every Cassandra cluster ratchet's processes open names its load-balancing policy
(session 45): the driver's own default, so routing does not change, and the driver's
"no load_balancing_policy ... this will raise an error" warning, logged by the worker
and the API at every start, is gone.

``services/cassandra_cluster.py``: ``open_cluster`` gives the default execution profile
``TokenAwarePolicy(DCAwareRoundRobinPolicy())``, which cassandra-driver 3 picks itself
when none is named. The worker, the API, the benches, the demo and the chaos run open
their clusters with it; migrate, the smoke check and the local stack's readiness check
give their own profile (``RoundRobinPolicy``). No connection is made: a ``Cluster`` is
configured when built, and warns then.
"""

from __future__ import annotations

import ast
import logging
import warnings
from pathlib import Path

import pytest
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster
from cassandra.policies import (
    DCAwareRoundRobinPolicy,
    ExponentialReconnectionPolicy,
    TokenAwarePolicy,
)

from ratchet.settings import Settings
from services.cassandra_cluster import open_cluster

ROOT = Path(__file__).resolve().parents[2]


def _driver_default_profile():
    """The default profile of a ``Cluster`` left to the driver (its warning muted)."""
    logger = logging.getLogger("cassandra.cluster")
    logger.disabled = True
    try:
        return Cluster(list(Settings().cassandra_hosts)).profile_manager.default
    finally:
        logger.disabled = False


@pytest.mark.parametrize("options", [
    {},
    {"reconnection_policy": ExponentialReconnectionPolicy(0.5, 4.0)},  # the worker's
], ids=["api-bench-chaos", "worker"])
def test_opening_a_cluster_warns_of_nothing_and_routes_as_the_driver_did(caplog, options):
    """No warning (logged or ``warnings``), and the default profile is the one a
    ``Cluster`` left to the driver gets, field for field, its policy named."""
    driver = _driver_default_profile()
    caplog.set_level(logging.DEBUG, logger="cassandra")
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        cluster = open_cluster(Settings(), **options)
    try:
        logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert logged == []
        assert [str(w.message) for w in warned] == []
        ours = cluster.profile_manager.default
        assert cluster.profile_manager.profiles[EXEC_PROFILE_DEFAULT] is ours
        policy, before = ours.load_balancing_policy, driver.load_balancing_policy
        for lbp in (policy, before):
            assert type(lbp) is TokenAwarePolicy
            assert type(lbp._child_policy) is DCAwareRoundRobinPolicy
        assert policy is not before  # a policy holds its cluster's hosts: one each
        assert policy.shuffle_replicas == before.shuffle_replicas
        for name in ("local_dc", "used_hosts_per_remote_dc"):
            assert getattr(policy._child_policy, name) == getattr(before._child_policy, name)
        for name in ("request_timeout", "consistency_level", "serial_consistency_level",
                     "row_factory"):
            assert getattr(ours, name) == getattr(driver, name), name
        for name in ("retry_policy", "speculative_execution_policy"):
            assert type(getattr(ours, name)) is type(getattr(driver, name)), name
    finally:
        cluster.shutdown()


def _cassandra_clusters_built_without_a_profile() -> list[str]:
    """Every ``Cluster(...)`` of cassandra-driver built in the product's code without an
    ``execution_profiles`` argument (``open_cluster`` gives one: its own call passes
    ``**options`` holding it)."""
    found = []
    for path in sorted(ROOT.glob("**/*.py")):
        relative = path.relative_to(ROOT)
        if relative.parts[0] in {"tests", ".venv", "examples"} or "node_modules" in \
                relative.parts:
            continue
        tree = ast.parse(path.read_text(), str(relative))
        driver_names = {alias.asname or alias.name
                        for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                        and node.module == "cassandra.cluster"
                        for alias in node.names if alias.name == "Cluster"}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in driver_names):
                keywords = {k.arg for k in node.keywords}
                if "execution_profiles" not in keywords and None not in keywords:
                    found.append(f"{relative}:{node.lineno}")
    return found


def test_every_process_opens_its_cluster_with_a_named_policy():
    """The chaos run's cleanup and its damage writer built a bare ``Cluster`` (their
    warning hidden by a logger set to ERROR)."""
    assert _cassandra_clusters_built_without_a_profile() == []
