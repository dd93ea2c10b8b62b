"""``ratchet demo``: the whole system end to end, in one command.

1. start what is missing: Kafka, Cassandra and the registry (``infra.launcher.up``,
   which leaves running servers alone), migrations, schemas, topics;
2. start a worker (it joins any running ones in the consumer group) and, unless one
   already answers on RATCHET_API_PORT, an API, as child processes;
3. run the scripted conversations of ``scenarios`` through the gateway library;
4. print a table of outcomes and where to look next;
5. stop the worker and the API it started (``--keep`` leaves them), never the servers.

Exit code 0 when every scenario behaved as expected.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from ratchet.settings import Settings
from services.demo.processes import (
    ChildProcess,
    ProcessFailed,
    start_api,
    start_worker,
    wait_api_ready,
    wait_worker_ready,
)
from services.demo.scenarios import SCENARIOS, Row
from services.demo.simulator import SimulatedGateway
from services.demo.stack import prepare


def say(msg: str) -> None:
    print(msg, flush=True)


def cli_demo(settings: Settings, keep: bool = False) -> int:
    from infra.launcher import InfraError
    from infra.migrate import MigrationError

    started: list[ChildProcess] = []
    log_dir = settings.home / "logs" / "demo"
    try:
        base_url = _bring_up(settings, log_dir, started)
        rows = _run_scenarios(settings, base_url)
    # The launcher's refusals (a port, the home) and migrate's (a newer version's
    # keyspace, an edited migration) say what to do: a line, not their traceback.
    except (ProcessFailed, InfraError, MigrationError) as exc:
        say(f"\nFAILED to start: {exc}")
        return 2
    finally:
        if not keep:
            for child in reversed(started):
                say(f"stopping the {child.name} this demo started (pid {child.pid})")
                child.stop()
    _print_table(rows)
    _print_next_steps(settings, base_url, log_dir, kept=keep and bool(started))
    return 0 if all(row.ok for row in rows) else 1


def _bring_up(settings: Settings, log_dir: Path, started: list[ChildProcess]) -> str:
    from infra import launcher

    say("== 1/3 servers: Kafka, Cassandra, schema registry (started if missing)")
    launcher.up(settings, out=lambda msg: say(f"   {msg}"))
    say("== 2/3 migrations, Avro schemas, topics")
    prepare(settings)
    say("== 3/3 worker and rehydration API")
    base_url = f"http://127.0.0.1:{settings.api_port}"
    # Always start a worker: a health file does not say which topics a running worker
    # reads, and one more member of the consumer group only shares the partitions.
    others = _live_workers(settings)
    worker = start_worker(settings, log_dir)
    started.append(worker)
    wait_worker_ready(worker, settings)
    joined = f", joins {others} running worker(s) in the group" if others else ""
    say(f"   worker: started (pid {worker.pid}{joined}, log {worker.log_path})")
    if _api_answers(base_url):
        say(f"   api: already answering at {base_url} (reused)")
    else:
        api = start_api(settings, log_dir)
        started.append(api)
        wait_api_ready(api, base_url)
        say(f"   api: started (pid {api.pid}, log {api.log_path})")
    return base_url


def _live_workers(settings: Settings) -> int:
    from streams.health import read_health

    return len(read_health(settings.home)["workers"])


def _api_answers(base_url: str) -> bool:
    try:
        return httpx.get(f"{base_url}/healthz", timeout=2).json().get("notifier") is True
    except (httpx.HTTPError, ValueError):
        return False


def _run_scenarios(settings: Settings, base_url: str) -> list[Row]:
    from schemas.avro import EventSerde, registry_client
    from services.gateway.client import RehydrationClient
    from services.gateway.producer import GatewayProducer

    say(f"\n== scenarios ({len(SCENARIOS)}), each through the gateway library")
    serde = EventSerde(registry_client(settings.schema_registry_url))
    producer = GatewayProducer(settings, serde)
    rows: list[Row] = []
    with RehydrationClient(base_url, timeout_s=15) as client:
        for index, (name, scenario) in enumerate(SCENARIOS, 1):
            t0 = time.monotonic()
            gateway = SimulatedGateway(producer, client)
            try:
                row = scenario(gateway, settings)
            except Exception as exc:  # a broken scenario is a failed row, not a crash
                row = Row(name, "(no exception)", f"{type(exc).__name__}: {exc}", False)
            rows.append(row)
            mark = "ok " if row.ok else "FAIL"
            say(
                f"   [{index}/{len(SCENARIOS)}] {mark} {row.scenario:<34} "
                f"{time.monotonic() - t0:5.1f} s  tenant {gateway.tenant_id}"
            )
    return rows


def _print_table(rows: list[Row]) -> None:
    width = max(len(r.scenario) for r in rows)
    say("\n== outcomes")
    say(f"   {'scenario':<{width}}  ok   observed")
    for row in rows:
        say(f"   {row.scenario:<{width}}  {'yes' if row.ok else 'NO '}  {row.observed}")
        if not row.ok:
            say(f"   {'':<{width}}       expected: {row.expected}")
    say(f"\n   {sum(r.ok for r in rows)}/{len(rows)} scenarios as expected")


def _print_next_steps(settings: Settings, base_url: str, log_dir: Path, kept: bool) -> None:
    topics = ", ".join(
        settings.topic(n)
        for n in ("gateway-events", "checkpoints", "rejections", "orphaned-effects", "dead-letters")
    )
    api_note = "" if kept else " (run `ratchet api` to serve it again)"
    say(f"""
== where to look next
   API{api_note}:  {base_url}/docs (OpenAPI UI), {base_url}/openapi.json
     GET /v1/responses/{{id}}/history?tenant_id=&fingerprint_hash=&wait_ms=
     GET /v1/conversations/{{id}}/history?tenant_id=&fingerprint_hash=
     GET /v1/responses/{{id}}/status?tenant_id=
   metrics:  {base_url}/metrics (ratchet_api_*: lookup latency, outcomes by reason, waits)
   topics:   {topics}
   storage:  keyspace {settings.keyspace} (tables turns, response_claims, request_facts, response_status)
   logs:     {log_dir} (JSON lines, with tenant/conversation/response ids)
   servers:  `ratchet infra status`; they stay up - stop them with `ratchet infra down`""")
