"""The ``ratchet`` command line. Thin: every subcommand delegates to its adapter."""

from __future__ import annotations

import sys

import click

from ratchet.settings import Settings, SettingsError


def _settings() -> Settings:
    try:
        return Settings.from_env()
    except SettingsError as exc:
        raise click.UsageError(str(exc)) from exc


@click.group()
@click.version_option(package_name="ratchet")
def main() -> None:
    """ratchet: persist LLM conversation checkpoints that are never wrong."""


@main.group()
def infra() -> None:
    """Run real Kafka, Cassandra and a schema registry as local processes."""


@infra.command("up")
def infra_up() -> None:
    """Download (once) and start every server; return when each one really works."""
    from infra import launcher

    sys.exit(launcher.cli_up(_settings()))


@infra.command("down")
@click.option("--purge", is_flag=True, help="Also delete the servers' data and logs.")
def infra_down(purge: bool) -> None:
    """Stop exactly the processes `infra up` started."""
    from infra import launcher

    sys.exit(launcher.cli_down(_settings(), purge=purge))


@infra.command("status")
def infra_status() -> None:
    """Report each server's health."""
    from infra import launcher

    sys.exit(launcher.cli_status(_settings()))


@infra.command("restart")
@click.argument("server", type=click.Choice(["kafka", "cassandra", "registry"]))
def infra_restart(server: str) -> None:
    """Stop one server and start it again (fault injection, stuck server)."""
    from infra import launcher

    sys.exit(launcher.cli_restart(_settings(), server))


@main.command()
def migrate() -> None:
    """Apply the numbered CQL migrations in infra/migrations (idempotent)."""
    from infra import migrate as migrations

    sys.exit(migrations.cli_migrate(_settings()))


@main.command()
def smoke() -> None:
    """Round trip: Avro via the registry -> Kafka -> consume -> Cassandra LWT -> read back."""
    from infra import smoke as smoke_test

    sys.exit(smoke_test.cli_smoke(_settings()))


@main.command()
def worker() -> None:
    """Run the promotion processor (joins the consumer group; SIGTERM drains and exits)."""
    from streams import worker as promotion_worker

    sys.exit(promotion_worker.cli_worker(_settings()))


@main.command()
def api() -> None:
    """Serve the rehydration HTTP API (RATCHET_API_HOST:RATCHET_API_PORT)."""
    from services.api import server

    sys.exit(server.cli_api(_settings()))


@main.command()
@click.option("--keep", is_flag=True, help="Leave the worker and API it started running.")
def demo(keep: bool) -> None:
    """Run scripted conversations end to end and print a table of outcomes."""
    from services import demo as demo_run

    sys.exit(demo_run.cli_demo(_settings(), keep=keep))


BENCH_SUITES = {
    # suite -> (module, what it compares)
    "validation": ("ratchet.bench.validation", "validate_turn on a 20-item, 3-round tool-loop turn"),
    "store": ("ratchet.bench.store", "promote / read_history beside raw Cassandra LWT and SELECT"),
    "api": ("ratchet.bench.api", "HTTP history lookup beside the direct store read"),
    "processor": ("ratchet.bench.processor", "end-to-end promoted turns/s beside raw Kafka"),
}


@main.command()
@click.argument("suites", nargs=-1, type=click.Choice(sorted(BENCH_SUITES)))
def bench(suites: tuple[str, ...]) -> None:
    """Measure lookup, validation and persistence, each beside its raw baseline.

    With no SUITES, runs them all in one run. Needs the servers (`ratchet infra up`) for
    every suite but `validation`.
    """
    import importlib

    failed = 0
    for name in suites or tuple(BENCH_SUITES):
        module, what = BENCH_SUITES[name]
        click.echo(f"\n== bench {name}: {what}")
        entry = importlib.import_module(module).main
        result = entry([]) if "argv" in entry.__code__.co_varnames else entry()
        failed += bool(result)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
