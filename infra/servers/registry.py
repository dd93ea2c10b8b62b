"""Apicurio Registry 3.0.9 serving the Confluent-compatible API (in-memory storage)."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from infra.fetch import fetch_zip
from infra.jdk import java17
from infra.servers.base import Server, Unhealthy

VERSION = "3.0.9"
ARTIFACT = f"io.apicurio:apicurio-registry-app:{VERSION}:zip:all"
HEAP = ["-Xms128m", "-Xmx512m"]
HEALTH_SUBJECT = "_ratchet.healthcheck-value"
HEALTH_SCHEMA = {"type": "record", "name": "Healthcheck", "namespace": "ratchet.infra",
                 "fields": [{"name": "ok", "type": "boolean"}]}

# Settings that make Apicurio behave like Confluent's registry for confluent-kafka clients.
# Each one is proved by tests/integration/test_foundation.py.
APICURIO_PROPERTIES = {
    # Deleting subjects/versions (DELETE /subjects/...) is refused unless enabled.
    "apicurio.rest.deletion.group.enabled": "true",
    "apicurio.rest.deletion.artifact.enabled": "true",
    "apicurio.rest.deletion.artifact-version.enabled": "true",
    # Re-registering a schema that differs only in whitespace returns the existing id.
    "apicurio.ccompat.use-canonical-hash": "true",
    # Embedded H2 database (the app's default storage kind).
    "apicurio.storage.kind": "sql",
    "apicurio.storage.sql.kind": "h2",
}


class Registry(Server):
    name = "registry"
    version = VERSION
    start_timeout_s = 90.0
    port_setting = "RATCHET_SCHEMA_REGISTRY_URL"

    def _base(self) -> str:
        """The URL this registry serves: the first of RATCHET_SCHEMA_REGISTRY_URL's
        (the whole comma-separated list was taken as one URL)."""
        return self.settings.schema_registry_url.split(",")[0].strip()

    def client_port(self) -> int:
        """The port the clients use: a URL without one is 80 (443), as for them; it
        was 8081, so ``up`` started a registry no client reached and waited 90 s
        (an operator's review, session 43)."""
        url = urlsplit(self._base())
        return url.port or (443 if url.scheme == "https" else 80)

    def cannot_launch(self) -> str | None:
        """The launched registry serves plain HTTP: with an ``https://`` URL it served
        HTTP on 443 while ``up`` waited 90 s for a TLS round trip that could not pass
        (an outside review, session 43)."""
        scheme = urlsplit(self._base()).scheme
        if scheme != "http":
            return (f"RATCHET_SCHEMA_REGISTRY_URL is {scheme}://, and the registry `ratchet "
                    "infra up` starts serves plain HTTP: use an http:// URL, or run the "
                    "https registry yourself")
        return None

    def endpoint(self) -> str:
        return f"registry   {self.settings.schema_registry_url}  (Apicurio {VERSION}, Confluent API)"

    def fetch(self) -> None:
        fetch_zip(self.dist_dir, ARTIFACT)

    def prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)

    def command(self) -> list[str]:
        props = {
            "quarkus.http.port": str(self.client_port()),
            "quarkus.http.host": "127.0.0.1",
            # the management interface (health, metrics) would otherwise bind 0.0.0.0:9000
            "quarkus.management.enabled": "false",
            # H2 in a file instead of in memory: schema ids survive a registry restart
            # (as with Confluent's registry), so `infra restart registry` loses nothing.
            "apicurio.datasource.url": f"jdbc:h2:file:{self.data_dir / 'h2' / 'registry'}",
            **APICURIO_PROPERTIES,
        }
        runner = self.dist_dir / "app" / f"apicurio-registry-app-{VERSION}-runner.jar"
        return [
            java17(), *HEAP, "-XX:+UseSerialGC", "-XX:+ExitOnOutOfMemoryError", "-XX:TieredStopAtLevel=1",
            f"-Djava.io.tmpdir={self.data_dir}",
            *(f"-D{k}={v}" for k, v in props.items()),
            "-jar", str(runner),
        ]

    def check(self, timeout_s: float = 10.0) -> None:
        """Register a schema and read it back by id through the Confluent-compatible API."""
        import httpx

        base = self._base()
        headers = {"Content-Type": "application/vnd.schemaregistry.v1+json"}
        try:
            with httpx.Client(timeout=timeout_s) as http:
                r = http.post(f"{base}/subjects/{HEALTH_SUBJECT}/versions", headers=headers,
                              content=json.dumps({"schema": json.dumps(HEALTH_SCHEMA)}))
                r.raise_for_status()
                schema_id = r.json()["id"]
                r = http.get(f"{base}/schemas/ids/{schema_id}")
                r.raise_for_status()
                if json.loads(r.json()["schema"]) != HEALTH_SCHEMA:
                    raise Unhealthy(f"schema id {schema_id} read back differs: {r.text}")
        except Unhealthy:
            raise
        except Exception as exc:
            raise Unhealthy(f"schema registry round trip failed: {exc}") from exc
