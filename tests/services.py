"""Find the Kafka, Cassandra and schema registry that integration tests run against.

Order:
1. ``RATCHET_KAFKA_BOOTSTRAP`` / ``RATCHET_CASSANDRA_HOSTS`` / ``RATCHET_SCHEMA_REGISTRY_URL``
   set: use those endpoints as they are (nothing is started).
2. A Docker engine answers: ``infra/compose.yaml`` through testcontainers (same ports).
3. Otherwise the local launcher (``ratchet infra up``), started if it is not running.

Whatever the source, every server must pass the launcher's health check (a real round
trip) before a test uses it. A missing service FAILS the test when ``CI`` is true and
skips it with the reason otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path

from infra import launcher
from infra.servers import NAMES, Unhealthy, server
from ratchet.settings import Settings

ENDPOINT_VARS = ("RATCHET_KAFKA_BOOTSTRAP", "RATCHET_CASSANDRA_HOSTS", "RATCHET_SCHEMA_REGISTRY_URL")
COMPOSE_FILE = Path(__file__).resolve().parents[1] / "infra" / "compose.yaml"


class ServiceUnavailable(RuntimeError):
    """A service the tests need cannot be reached or started."""


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unhealthy(settings: Settings) -> dict[str, str]:
    """``{name: reason}`` for every server that fails its health check."""
    bad = {}
    for name in NAMES:
        try:
            server(settings, name).check(timeout_s=10)
        except Unhealthy as exc:
            bad[name] = str(exc)
    return bad


def docker_engine_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


def _wait_all_healthy(settings: Settings, timeout_s: float) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while bad := unhealthy(settings):
        if time.monotonic() > deadline:
            raise ServiceUnavailable(f"not healthy after {timeout_s:.0f}s: {bad}")
        time.sleep(2)


class Services:
    """Started services; ``close()`` stops only what this object started (compose)."""

    def __init__(self) -> None:
        self.settings = Settings.from_env()
        self.source = ""
        self._compose = None

    def start(self) -> Services:
        if any(os.environ.get(v) for v in ENDPOINT_VARS):
            self.source = "RATCHET_* endpoints"
            if bad := unhealthy(self.settings):
                raise ServiceUnavailable(f"services named by RATCHET_* are not healthy: {bad}")
        elif docker_engine_answers():
            from testcontainers.compose import DockerCompose

            self.source = f"docker compose ({COMPOSE_FILE})"
            self._compose = DockerCompose(str(COMPOSE_FILE.parent), COMPOSE_FILE.name)
            self._compose.start()
            _wait_all_healthy(self.settings, 240)
        else:
            self.source = f"local launcher (home {self.settings.home})"
            if unhealthy(self.settings):
                try:
                    launcher.up(self.settings)
                except launcher.InfraError as exc:
                    raise ServiceUnavailable(f"`ratchet infra up` failed:\n{exc}") from exc
        return self

    def close(self) -> None:
        if self._compose is not None:
            self._compose.stop()
