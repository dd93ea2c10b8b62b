"""A local Cassandra cluster of several datacenters (``ratchet infra cluster``).

One node per datacenter: node ``i`` (1, 2, ...) is datacenter ``dc<i>`` on the loopback
alias ``127.0.0.<i+1>`` (on Linux all of 127/8 is loopback), ``GossipingPropertyFileSnitch``,
a ``cluster_name`` of its own, heap 1 GiB (new gen 128 MiB), node 1 the seed. The nodes
are the launcher's ``Cassandra`` (same jars from ``<home>/dist``, same ``java`` command
line), started and stopped by the launcher's own functions; only where they live
differs: ``<home>/cluster/`` holds their ``state.json``, ``conf/``, ``data/`` and
``logs/``, apart from the single node of ``ratchet infra up``. CI runs the two-datacenter
test on it (``tests/integration/test_two_datacenters.py``; docs/operations.md, "A local
cluster of several datacenters").

Public API: ``up(settings, datacenters=2, port=..., storage_port=...)``,
``down(settings, purge=False)``, ``status(settings)``, ``nodes(...)``, ``hosts(n)``.
"""

from __future__ import annotations

import re
import shutil
import socket
import sys
from dataclasses import replace
from pathlib import Path

from infra import launcher
from infra.procs import StateFile, StateFileError, is_alive
from infra.servers.cassandra import Cassandra
from ratchet.settings import MAX_PORT, Settings

PORT = 19042  # CQL native port of every node (each on its own address)
STORAGE_PORT = 19000  # inter-node (gossip) port of every node
MIN_DATACENTERS, MAX_DATACENTERS = 2, 3  # each node takes 1 GiB of heap
_NODE_NAME = re.compile(r"cassandra-dc([1-9][0-9]*)")


class ClusterError(launcher.InfraError):
    """The cluster cannot be started as asked; one line says why, nothing was started."""


def cluster_home(settings: Settings) -> Path:
    return settings.home / "cluster"


def hosts(datacenters: int) -> tuple[str, ...]:
    """The nodes' addresses: ``127.0.0.2`` for dc1, ``127.0.0.3`` for dc2, ..."""
    return tuple(f"127.0.0.{i + 1}" for i in range(1, datacenters + 1))


class ClusterNode(Cassandra):
    """Node ``index`` of the cluster: datacenter ``dc<index>`` on ``127.0.0.<index+1>``."""

    heap = ("-Xms1g", "-Xmx1g", "-Xmn128m")
    cluster_name = "ratchet-cluster"
    snitch = "org.apache.cassandra.locator.GossipingPropertyFileSnitch"
    port_setting = "--port"
    storage_port_setting = "--storage-port"
    # A joining node streams and settles before it serves CQL; the box is shared.
    start_timeout_s = 300.0

    def __init__(self, settings: Settings, index: int, port: int = PORT,
                 storage_port: int = STORAGE_PORT) -> None:
        self.index = index
        self.datacenter = f"dc{index}"
        self.name = f"cassandra-{self.datacenter}"
        self.host = hosts(index)[-1]
        self.dist_home = settings.home
        super().__init__(replace(settings, home=cluster_home(settings),
                                 cassandra_hosts=(self.host,), cassandra_port=port,
                                 cassandra_storage_port=storage_port, cassandra_local_dc=""))

    @property
    def dist_dir(self) -> Path:
        """The jars ``ratchet infra up`` fetched into ``<home>/dist``: never fetched twice."""
        return self.dist_home / "dist" / f"cassandra-{self.version}"

    def seeds(self) -> str:
        return f"{hosts(1)[0]}:{self.storage_port()}"

    def cannot_launch(self) -> str | None:
        return address_problem(self.host)

    def prepare(self) -> None:
        super().prepare()
        (self.conf_dir / "cassandra-rackdc.properties").write_text(
            f"dc={self.datacenter}\nrack=rack1\n")

    def endpoint(self) -> str:
        return (f"{self.name}  {self.host}:{self.client_port()}  "
                f"(datacenter {self.datacenter})")


def address_problem(host: str) -> str | None:
    """Why this machine cannot listen on ``host`` (None: it can)."""
    with socket.socket() as sock:
        try:
            sock.bind((host, 0))
        except OSError as exc:
            return (f"{host} is not an address of this machine ({exc.strerror or exc}): the "
                    f"cluster's nodes listen on the loopback aliases "
                    f"{hosts(1)[0]}, {hosts(2)[1]}, ... (all of 127/8 on Linux; elsewhere "
                    f"add them, e.g. `ifconfig lo0 alias {host}`)")
    return None


def nodes(settings: Settings, datacenters: int, port: int = PORT,
          storage_port: int = STORAGE_PORT) -> list[ClusterNode]:
    """The cluster's nodes, the seed (dc1) first; ``ClusterError`` for a count or a
    port out of range."""
    if not MIN_DATACENTERS <= datacenters <= MAX_DATACENTERS:
        raise ClusterError(f"--datacenters {datacenters}: {MIN_DATACENTERS} to "
                           f"{MAX_DATACENTERS} (one node of 1 GiB heap each)")
    for option, value in (("--port", port), ("--storage-port", storage_port)):
        if not 1 <= value <= MAX_PORT:
            raise ClusterError(f"{option} {value}: not a port (1-{MAX_PORT})")
    if port == storage_port:
        raise ClusterError(f"--port and --storage-port are both {port}")
    return [ClusterNode(settings, i, port, storage_port) for i in range(1, datacenters + 1)]


def _recorded(settings: Settings) -> list[ClusterNode]:
    """The nodes the cluster's state file records, as they were started (their ports)."""
    found = []
    for name, entry in sorted(StateFile(cluster_home(settings)).read().items()):
        match = _NODE_NAME.fullmatch(name)
        if match is None:
            raise StateFileError(f"{cluster_home(settings) / 'state.json'} records {name!r}, "
                                 f"no node of the cluster")
        found.append(ClusterNode(settings, int(match[1]), entry.port or PORT))
    return found


def up(settings: Settings, datacenters: int = 2, port: int = PORT,
       storage_port: int = STORAGE_PORT, out: launcher.Say = launcher._print) -> None:  # noqa: SLF001
    """Start the nodes one after another, the seed first (a node joins through it), each
    waited for until it serves CQL and names its datacenter. Idempotent, like ``infra up``.
    ``ClusterError`` (one line) before anything starts when an address is unusable."""
    members = nodes(settings, datacenters, port, storage_port)
    for node in members:
        problem = node.cannot_launch()
        if problem:
            raise ClusterError(f"{problem}; nothing was started")
    home = cluster_home(settings)
    state = StateFile(home)
    say = launcher._Clock(out)  # noqa: SLF001
    with launcher._up_lock(settings, home):  # noqa: SLF001
        launcher.check_ports([n for n in members if state.get(n.name) is None
                              and not n.port_open()])
        for node in members:
            launcher._ensure_started(node, state, say)  # noqa: SLF001
    say(f"cluster of {datacenters} datacenters ready:")
    for node in members:
        out("  " + node.endpoint())


def down(settings: Settings, purge: bool = False,
         out: launcher.Say = launcher._print) -> dict[str, str]:  # noqa: SLF001
    """Stop exactly the nodes ``up`` recorded, one after another, the seed last
    (``launcher.stop``: SIGTERM, SIGKILL after its grace, pid and start time checked);
    ``purge`` also deletes their data, logs and conf (the jars stay)."""
    state = StateFile(cluster_home(settings))
    how = {node.name: launcher.stop(node, state, out) for node in _recorded(settings)[::-1]}
    if not how:
        out("no node of the cluster was started by ratchet: nothing to stop")
    if purge and all(h not in ("refused", "still running", "interrupted") for h in how.values()):
        for sub in ("data", "logs", "conf"):
            shutil.rmtree(cluster_home(settings) / sub, ignore_errors=True)
        out(f"purged data, logs and conf under {cluster_home(settings)}")
    return how


def status(settings: Settings, datacenters: int = 2) -> list[launcher.ServerStatus]:
    """Each node's health: the recorded ones, else the ``datacenters`` expected."""
    members = _recorded(settings) or nodes(settings, datacenters)
    state = StateFile(cluster_home(settings))
    return [launcher.status_of(node, state) for node in members]


# ------------------------------------------------------------------------------- cli


def _failed(command: str, exc: BaseException) -> int:
    print(f"ratchet infra cluster {command} failed: {exc}", file=sys.stderr, flush=True)
    return 1


def cli_up(settings: Settings, datacenters: int, port: int, storage_port: int) -> int:
    try:
        up(settings, datacenters, port, storage_port)
    except (launcher.InfraError, StateFileError, OSError) as exc:
        return _failed("up", exc)
    return 0


def cli_down(settings: Settings, purge: bool) -> int:
    try:
        how = down(settings, purge)
        left = [n.name for n in _recorded(settings)
                if (e := StateFile(cluster_home(settings)).get(n.name)) and is_alive(e)]
    except (StateFileError, OSError) as exc:
        return _failed("down", exc)
    if left or "refused" in how.values():
        print(f"ratchet infra cluster down: still running: {', '.join(left) or 'refused'}",
              file=sys.stderr)
        return 1
    return 0


def cli_status(settings: Settings, datacenters: int) -> int:
    try:
        report = status(settings, datacenters)
    except (launcher.InfraError, StateFileError, OSError) as exc:
        return _failed("status", exc)
    for s in report:
        print(s.line())
    return 0 if all(s.healthy for s in report) else 1
