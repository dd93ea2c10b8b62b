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


@main.command()
def migrate() -> None:
    """Apply the numbered CQL migrations in infra/migrations (idempotent)."""
    from infra import migrate as migrations

    sys.exit(migrations.cli_migrate(_settings()))


if __name__ == "__main__":
    main()
