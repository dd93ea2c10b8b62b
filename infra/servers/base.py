"""What the launcher needs to know about one server."""

from __future__ import annotations

import socket
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from ratchet.settings import Settings


class Unhealthy(RuntimeError):
    """A health check failed; the message says what was tried and what went wrong."""


@dataclass(frozen=True)
class Port:
    """A port a launched server listens on, and the setting that moves it."""

    number: int
    role: str  # e.g. "kafka's controller port (its client port + 1)"
    setting: str  # the environment variable (or option) an operator changes
    host: str = "127.0.0.1"  # the address it listens on


class Server(ABC):
    """A server launched as one ``java`` process.

    Lifecycle: ``fetch`` (download once), ``prepare`` (write config, format storage),
    ``command`` (the java command line), ``check`` (a real round trip, raises ``Unhealthy``).
    """

    name: str
    version: str
    #: generous: Cassandra on 2 busy cores can take 90 s
    start_timeout_s: float = 120.0
    #: the address the process listens on (a node of ``ratchet infra cluster``: an alias)
    host: str = "127.0.0.1"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.home = settings.home

    @property
    def dist_dir(self) -> Path:
        return self.home / "dist" / f"{self.name}-{self.version}"

    @property
    def data_dir(self) -> Path:
        return self.home / "data" / self.name

    @property
    def conf_dir(self) -> Path:
        return self.home / "conf" / self.name

    @property
    def log_path(self) -> Path:
        return self.home / "logs" / f"{self.name}.log"

    def is_fetched(self) -> bool:
        return (self.dist_dir / ".complete").exists()

    def cannot_launch(self) -> str | None:
        """Why the settings name a server this launcher cannot start (None: it can)."""
        return None

    @abstractmethod
    def fetch(self) -> None: ...

    @abstractmethod
    def prepare(self) -> None: ...

    @abstractmethod
    def command(self) -> list[str]: ...

    @abstractmethod
    def client_port(self) -> int:
        """The port clients use; a process listening there is taken as this server."""

    #: the setting that names ``client_port``
    port_setting: str

    def ports(self) -> list[Port]:
        """Every port the launched process listens on (``host``), the client port first."""
        return [Port(self.client_port(), f"{self.name}'s client port", self.port_setting,
                     self.host)]

    def timer_slack_ns(self) -> int:
        """Timer slack of the server's process in ns (0: the kernel's default)."""
        return 0

    @abstractmethod
    def check(self, timeout_s: float = 10.0) -> None:
        """A real round trip against the server; raises ``Unhealthy``."""

    @abstractmethod
    def endpoint(self) -> str: ...

    def port_open(self, port: int | None = None) -> bool:
        try:
            with socket.create_connection((self.host, port or self.client_port()), timeout=1):
                return True
        except OSError:
            return False


def host_port(address: str, default_port: int) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return (host, int(port)) if host else (address, default_port)
