"""``ratchet infra cluster`` (``infra/cluster.py``) without starting a node: the nodes it
would launch (addresses, datacenters, seed, ports, heap, where their files live), its
refusals before anything starts, and ``down`` with nothing recorded. The real start and
stop are ``tests/integration/test_two_datacenters.py``'s."""

from __future__ import annotations

import json
import socket
from dataclasses import replace

import pytest
from click.testing import CliRunner

from infra import cluster, launcher
from infra.procs import StateFile
from ratchet.settings import Settings
from streams.testing import free_port


@pytest.fixture
def settings(tmp_path):
    return replace(Settings(), home=tmp_path)


@pytest.fixture
def nothing_launched(monkeypatch):
    """Any fetch, prepare or launch fails the test: ``up`` must refuse first."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("up launched or prepared something")

    monkeypatch.setattr(cluster.ClusterNode, "fetch", refuse)
    monkeypatch.setattr(cluster.ClusterNode, "prepare", refuse)
    monkeypatch.setattr(launcher, "_launch", refuse)


def test_two_datacenters_are_two_nodes_on_their_own_aliases_with_node_one_the_seed(settings):
    dc1, dc2 = cluster.nodes(settings, 2)
    assert [(n.name, n.host, n.datacenter) for n in (dc1, dc2)] == [
        ("cassandra-dc1", "127.0.0.2", "dc1"), ("cassandra-dc2", "127.0.0.3", "dc2")]
    for node in (dc1, dc2):
        yaml = node._yaml()
        assert (yaml["listen_address"], yaml["rpc_address"]) == (node.host, node.host)
        assert yaml["endpoint_snitch"].endswith("GossipingPropertyFileSnitch")
        assert yaml["cluster_name"] != "ratchet"  # never joins the single node's cluster
        assert yaml["seed_provider"][0]["parameters"] == [{"seeds": "127.0.0.2:19000"}]
        assert (yaml["native_transport_port"], yaml["storage_port"]) == (19042, 19000)
        assert [(p.host, p.number) for p in node.ports()] == [(node.host, 19042),
                                                              (node.host, 19000)]


def test_the_nodes_use_the_fetched_jars_and_keep_their_files_under_cluster(settings, tmp_path):
    node = cluster.nodes(settings, 2)[1]
    single = launcher.server(settings, "cassandra")
    assert node.dist_dir == single.dist_dir == tmp_path / "dist" / "cassandra-5.0.6"
    for path in (node.data_dir, node.conf_dir, node.log_path):
        assert path.is_relative_to(tmp_path / "cluster")
    assert "cassandra-dc2" in str(node.data_dir) and node.log_path.name == "cassandra-dc2.log"
    command = node.command()
    assert "-Xmx1g" in command and "-Xmn128m" in command and "-Xmn256m" not in command
    node.prepare()
    rackdc = (node.conf_dir / "cassandra-rackdc.properties").read_text()
    assert "dc=dc2\n" in rackdc
    assert json.loads((node.conf_dir / "cassandra.yaml").read_text())["listen_address"] == (
        "127.0.0.3")


def test_the_single_node_is_unchanged(settings):
    single = launcher.server(settings, "cassandra")._yaml()
    assert (single["listen_address"], single["cluster_name"]) == ("127.0.0.1", "ratchet")
    assert single["endpoint_snitch"] == "SimpleSnitch"
    assert single["seed_provider"][0]["parameters"] == [{"seeds": "127.0.0.1:7000"}]
    assert "-Xmn256m" in launcher.server(settings, "cassandra").command()


@pytest.mark.parametrize("datacenters", [0, 1, 4])
def test_a_count_of_datacenters_it_does_not_run_is_refused(settings, datacenters):
    with pytest.raises(cluster.ClusterError, match=f"--datacenters {datacenters}: 2 to 3"):
        cluster.nodes(settings, datacenters)


@pytest.mark.parametrize(("port", "storage", "said"), [
    (0, 19000, "--port 0: not a port"), (19042, 65536, "--storage-port 65536: not a port"),
    (19042, 19042, "--port and --storage-port are both 19042")])
def test_ports_it_cannot_use_are_refused(settings, port, storage, said):
    with pytest.raises(cluster.ClusterError, match=said):
        cluster.nodes(settings, 2, port, storage)


def test_an_address_that_is_not_this_machines_is_one_line_and_nothing_starts(
        settings, monkeypatch, nothing_launched):
    # 198.51.100.0/24 is TEST-NET-2, documentation only (this machine's eth0 is in
    # TEST-NET-1): checked, since the test means nothing if it is this machine's.
    monkeypatch.setattr(cluster, "hosts", lambda n: tuple(f"198.51.100.{i + 1}"
                                                          for i in range(1, n + 1)))
    assert cluster.address_problem("198.51.100.2") is not None
    with pytest.raises(cluster.ClusterError) as err:
        cluster.up(settings, out=lambda _line: None)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("198.51.100.2 is not an address of this machine")
    assert message.endswith("nothing was started")
    assert not (settings.home / "cluster" / "state.json").exists()


def test_the_cli_says_an_unusable_address_in_one_line(tmp_path, monkeypatch, nothing_launched):
    from ratchet.cli import main

    monkeypatch.setattr(cluster, "address_problem", lambda host: f"{host} is unusable here")
    monkeypatch.setenv("RATCHET_HOME", str(tmp_path))
    result = CliRunner().invoke(main, ["infra", "cluster", "up", "--datacenters", "2"])
    assert result.exit_code == 1
    assert result.stderr.strip() == ("ratchet infra cluster up failed: 127.0.0.2 is unusable "
                                     "here; nothing was started")


def test_a_taken_port_on_a_nodes_alias_is_refused_naming_the_address(
        settings, nothing_launched):
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.3", port))  # bound, not listening: no server answers there
        with pytest.raises(launcher.PortUnusable) as err:
            cluster.up(settings, 2, port=port, storage_port=free_port(),
                           out=lambda _line: None)
    message = str(err.value)
    assert f"127.0.0.3:{port} is in use" in message and "--port" in message
    assert "127.0.0.2" not in message  # the same number on another address is free


def test_the_same_port_on_two_addresses_is_not_a_clash(settings):
    launcher.check_ports(cluster.nodes(settings, 2, free_port(), free_port()))


def test_down_with_nothing_recorded_stops_nothing(settings):
    said: list[str] = []
    assert cluster.down(settings, out=said.append) == {}
    assert said == ["no node of the cluster was started by ratchet: nothing to stop"]


def test_each_nodes_status_names_its_address(settings):
    """Every node serves the same port on its own alias: ``cluster status`` said
    "nothing listens on port 19042" for each, not which address (session 53's outside
    review). The single node's line is unchanged (tests/unit/test_launcher_home.py)."""
    port = free_port()
    lines = [launcher.status_of(node, StateFile(cluster.cluster_home(settings))).line()
             for node in cluster.nodes(settings, 2, port=port, storage_port=free_port())]
    assert [f"nothing listens on 127.0.0.{i}:{port}" in line for i, line in
            zip((2, 3), lines, strict=True)] == [True, True], lines
