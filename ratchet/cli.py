"""The ``ratchet`` command line. Thin: every subcommand delegates to its adapter."""

from __future__ import annotations

# First, before the imports below (~0.2 s, click most of it): a SIGTERM or Ctrl-C from
# here on is kept for the command to take (``_OWN_SIGTERM``) or act as Python's default
# (session 49); only when this process is the CLI, not a host that imports it.
from ratchet.stops import defer_stops

defer_stops(__name__)

import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from typing import NoReturn  # noqa: E402

import click  # noqa: E402

from ratchet.settings import Settings, SettingsError  # noqa: E402
from ratchet.stops import (  # noqa: E402
    LeaseLeft,
    MigrateProgress,
    Terminated,
    default_stops,
    raise_on_sigterm,
)

# The commands that take SIGTERM themselves (``raise_on_sigterm``, first thing in their
# ``try``, where a Ctrl-C kept is raised too); the others keep Python's defaults.
_OWN_SIGTERM = frozenset({"migrate", "smoke", "api", "worker"})


def _settings() -> Settings:
    try:
        return Settings.from_env()
    except SettingsError as exc:
        raise click.UsageError(str(exc)) from exc


def _known_datacenter(command: str, settings: Settings, code: int = 1) -> None:
    """Exit ``code`` with the worker's and the API's one line when
    ``RATCHET_CASSANDRA_LOCAL_DC`` names a datacenter the cluster lacks (nothing to do,
    and no import, when it is unset). Migrate, smoke, demo, chaos and the benches said
    the driver's ``NoHostAvailable``, a traceback, or nothing (session 53)."""
    if not settings.cassandra_local_dc:
        return
    from services.cassandra_cluster import UnknownLocalDatacenter, check_local_datacenter

    try:
        check_local_datacenter(settings)
    except UnknownLocalDatacenter as exc:
        print(f"ratchet {command}: cannot start: {exc}", file=sys.stderr, flush=True)
        sys.exit(code)


@click.group()
@click.version_option(package_name="ratchet")
def main() -> None:
    """ratchet: persist LLM conversation checkpoints that are never wrong."""
    if click.get_current_context().invoked_subcommand not in _OWN_SIGTERM:
        default_stops()


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
@click.argument("servers", nargs=-1, type=click.Choice(["kafka", "cassandra", "registry"]))
def infra_down(purge: bool, servers: tuple[str, ...]) -> None:
    """Stop exactly the processes `infra up` started (only SERVERS, when named)."""
    from infra import launcher

    sys.exit(launcher.cli_down(_settings(), purge=purge, names=servers))


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


@infra.group("cluster")
def infra_cluster() -> None:
    """A local Cassandra cluster of several datacenters (one node each on 127.0.0.2, .3, ...)."""


@infra_cluster.command("up")
@click.option("--datacenters", type=int, default=2, show_default=True,
              help="Datacenters dc1..dcN, one node each on 127.0.0.2..127.0.0.N+1 (2 or 3).")
@click.option("--port", type=int, default=19042, show_default=True,
              help="The CQL port of every node (each listens on its own address).")
@click.option("--storage-port", type=int, default=19000, show_default=True,
              help="The inter-node (gossip) port of every node.")
def infra_cluster_up(datacenters: int, port: int, storage_port: int) -> None:
    """Start the nodes (the jars of `infra up`), the seed dc1 first; return when each serves."""
    from infra import cluster

    sys.exit(cluster.cli_up(_settings(), datacenters, port, storage_port))


@infra_cluster.command("down")
@click.option("--purge", is_flag=True, help="Also delete the nodes' data, logs and conf.")
def infra_cluster_down(purge: bool) -> None:
    """Stop exactly the nodes `infra cluster up` started."""
    from infra import cluster

    sys.exit(cluster.cli_down(_settings(), purge))


@infra_cluster.command("status")
@click.option("--datacenters", type=int, default=2, show_default=True,
              help="The nodes to look at when none is recorded as started.")
def infra_cluster_status(datacenters: int) -> None:
    """Report each node's health (exit 0 only when every one is healthy)."""
    from infra import cluster

    sys.exit(cluster.cli_status(_settings(), datacenters))


@main.command()
@click.option("--status", is_flag=True,
              help="Only say which migrations the keyspace has and lacks; change nothing "
                   "(exit 0 only when it is up to date).")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Wait at most SECONDS for another migrator's lease (0: not at all), then "
                   "exit 1 having applied nothing. Default: as long as it holds the lease "
                   "(a running migrator renews it; a killed one's expires by its TTL).")
def migrate(status: bool, wait_s: float | None) -> None:
    """Apply the numbered CQL migrations in infra/migrations (idempotent)."""
    if status and wait_s is not None:
        raise click.UsageError("--wait is for a run that takes the lease; --status takes none")
    settings = _settings()  # a bad value stops here, before any import or connection
    progress = MigrateProgress()
    try:
        raise_on_sigterm()
        # --status: 3, "could not answer" (1 would read as "not up to date").
        _known_datacenter("migrate", settings, code=3 if status else 1)
        from infra import migrate as migrations

        code = migrations.cli_migrate(settings, status=status, wait_s=wait_s, progress=progress)
    except (KeyboardInterrupt, Terminated, LeaseLeft) as stop:
        _exit_interrupted(_interrupted_migrate(status, stop, progress, settings))
    sys.exit(code)


def _lease_left_before(stop: BaseException) -> LeaseLeft | None:
    """The ``LeaseLeft`` that is ``stop`` or that a later stop replaced (Ctrl-C pressed
    on while the session and the cluster closed after the release was stopped), else
    None: what it says still holds, and the line said nothing of the lease (session
    48's review)."""
    seen: BaseException | None = stop
    while seen is not None and not isinstance(seen, LeaseLeft):
        seen = seen.__context__
    return seen


# A stop's line names it and ends with its code: 128 + the signal, a shell's code for a
# process the signal stopped. Not 0 even once every migration is recorded (the line says
# so): the caller asked it to stop, and `ratchet migrate && next` must not go on.
_STOPS = {KeyboardInterrupt: ("interrupted (Ctrl-C)", 130),
          Terminated: ("terminated (SIGTERM)", 143)}

# What holds when the stop came in each phase of ``MigrateProgress``: it said "what it
# applied stays applied, a migration it was applying is not recorded" in all, before
# the lease and after the last migration was recorded too (session 48's review; 49).
# While applying, what holds is read from its facts (``_migrate_holds``; session 50).
_MIGRATE_PHASES = {
    "connecting": "no migration was applied (stopped before taking the lease); `ratchet "
                  "migrate --status` says what is left, `ratchet migrate` applies it",
    "waiting": "no migration was applied (stopped while waiting for another migrator's "
               "lease, which it left alone); `ratchet migrate --status` shows that lease",
    "applied": "every migration is applied and recorded, the schema up to date",
    "released": "every migration is applied and recorded, the schema up to date; its "
                "lease was released",
}


def _migrate_holds(progress: MigrateProgress) -> str:
    """What holds after a stop in ``progress``'s phase. While applying, from its facts:
    it said "what it applied stays applied, a migration it was applying is not recorded"
    whether one was under way or not (after a checksum mismatch, nothing had started;
    session 49's review, left; session 50)."""
    if progress.phase != "applying":
        return _MIGRATE_PHASES[progress.phase]
    said = (f"{', '.join(progress.recorded)} applied and recorded by this run (they stay)"
            if progress.recorded else "no migration was recorded by this run")
    if progress.under_way is None:
        said += ", none was under way"
    elif progress.recording:
        said += (f"; {progress.under_way} was applied and being recorded: if its record "
                 "was not written it is re-run whole")
    else:
        said += (f"; {progress.under_way} was under way and is not recorded: it is re-run "
                 "whole")
    finish = ("`ratchet migrate` finishes" if progress.failure is None else
              "`ratchet migrate` finishes once the failure above is dealt with")
    return f"{said}; `ratchet migrate --status` says what is left, {finish}"


def _interrupted_migrate(status: bool, stop: BaseException, progress: MigrateProgress,
                         settings: Settings) -> int:
    """Ctrl-C during ``migrate`` (connecting, waiting for another migrator's lease,
    applying) was click's ``Aborted!`` and exit 1, which reads as a failure of the
    schema (session 47); SIGTERM was Python's default death. One line saying what holds
    in the phase it was stopped in (``progress``) instead, and the stop's code
    (``_STOPS``). The lease, if taken, was released on the way out
    (``apply_migrations``' ``finally``; a release that does not reach Cassandra leaves
    it to expire by its TTL); a stop during the release itself (a ``LeaseLeft``, even
    one a later stop replaced) says the lease may stay held. A failure of the run not
    said yet (a stop in its release or its session's close skipped the handler that
    says it) comes first (session 48's review; 49). A second stop while the lines are
    written was a traceback under them: both signals are ignored from here to the exit
    (session 48)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    left = _lease_left_before(stop)
    if isinstance(stop, LeaseLeft):
        stop = stop.__cause__
    how, code = _STOPS.get(type(stop), _STOPS[KeyboardInterrupt])
    if progress.failure is not None and not progress.failure_said:
        from infra.migrate import failure_line

        failure = progress.failure
        said = (failure_line(failure, settings)
                or f"ratchet migrate failed: {type(failure).__name__}: {failure}")
        print(said, file=sys.stderr, flush=True)
    said = "changed nothing" if status else _migrate_holds(progress)
    if left is not None:
        said += (f"; stopped while releasing its lease {left.lease}, which may stay held "
                 f"until its TTL ends (at most {_lease_ttl_s()} s): a `ratchet migrate` "
                 "started sooner waits for it, `ratchet migrate --status` shows it")
    print(f"ratchet migrate: {how}: stopped; {said}", file=sys.stderr, flush=True)
    return code


def _lease_ttl_s() -> int:
    from infra.migrate import LEASE_TTL_S

    return LEASE_TTL_S


@main.command()
@click.option("--keep", is_flag=True,
              help="Leave the run's topic, registry subject and keyspace (named at the end).")
def smoke(keep: bool) -> None:
    """Round trip: Avro via the registry -> Kafka -> consume -> Cassandra LWT -> read back,
    then remove what it made (names of its own, never reused)."""
    settings = _settings()  # a bad value stops here, before any import or connection
    try:
        raise_on_sigterm()
        _known_datacenter("smoke", settings)
        from infra import smoke as smoke_test

        code = smoke_test.cli_smoke(settings, keep=keep)
    except (KeyboardInterrupt, Terminated) as stop:
        # What it made was removed (or named) on the way out. Ctrl-C was click's
        # "Aborted!" (exit 1), SIGTERM (a CI job cancelled) Python's death, neither
        # removing anything (session 48's review). Further stops are ignored from here.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        how, code = _STOPS[type(stop)]
        print(f"ratchet smoke: {how}: stopped", file=sys.stderr, flush=True)
        _exit_interrupted(code)
    sys.exit(code)


@main.command()
def worker() -> None:
    """Run the promotion processor (joins the consumer group; SIGTERM drains and exits)."""
    settings = _settings()  # a bad value stops here, before any import or connection
    try:
        raise_on_sigterm()  # until Faust's own handlers: a stop while connecting
        from streams import worker as promotion_worker

        code = promotion_worker.cli_worker(settings)
    except (KeyboardInterrupt, Terminated) as stop:  # once Faust runs it drains: exit 0
        _exit_interrupted(_interrupted_start("worker", "nothing was processed", stop))
    sys.exit(code)


@main.command()
def api() -> None:
    """Serve the rehydration HTTP API (RATCHET_API_HOST:RATCHET_API_PORT)."""
    settings = _settings()  # a bad value stops here, before any import or connection
    try:
        raise_on_sigterm()  # until uvicorn's own handlers: a stop while connecting
        from services.api import server

        code = server.cli_api(settings)
    except (KeyboardInterrupt, Terminated) as stop:  # once it serves, it drains: exit 0
        _exit_interrupted(_interrupted_start("api", "nothing was served", stop))
    sys.exit(code)


def _exit_interrupted(code: int) -> NoReturn:
    """End an interrupted command after its one line, skipping the exit hooks: its own
    ``finally`` blocks ran and closed its clients. A Ctrl-C landing in the Cassandra
    driver's start leaves its event loop's thread made but not started, and the
    driver's exit hook joined it and printed ``RuntimeError: cannot join thread before
    it is started`` under the line (1 of 25 Ctrl-Cs of a connecting migrate; an outside
    review, session 47)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _interrupted_start(command: str, so: str, stop: BaseException) -> int:
    """Ctrl-C before a server command serves (importing, connecting: Cassandra slow or
    away) was click's "Aborted!" and exit 1, while Ctrl-C once it serves is exit 0
    (session 47); SIGTERM there was Python's default death, exit 143 and no line
    (session 48). What the command had opened is closed by then; one line, exit 0, as
    once it serves: a supervisor that stops a server asked for the stop it got."""
    how = ("terminated while starting (SIGTERM)" if isinstance(stop, Terminated)
           else "interrupted while starting (Ctrl-C)")
    print(f"ratchet {command}: {how}: stopped, {so}", file=sys.stderr, flush=True)
    return 0


@main.command()
@click.option("--keep", is_flag=True, help="Leave the worker and API it started running.")
def demo(keep: bool) -> None:
    """Run scripted conversations end to end and print a table of outcomes."""
    settings = _settings()  # a bad value stops here, before any import or connection
    _known_datacenter("demo", settings)
    from services import demo as demo_run

    sys.exit(demo_run.cli_demo(settings, keep=keep))


@main.command()
@click.option("--seed", default=1, show_default=True, help="Workload and fault order seed.")
@click.option("--turns", default=2000, show_default=True, type=click.IntRange(min=1),
              help="Turn events to send (at least).")
@click.option("--rate", default=20.0, show_default=True,
              type=click.FloatRange(min=0, min_open=True, max=1e6),
              help="Turns per second, all producers.")
@click.option("--producers", default=2, show_default=True, type=click.IntRange(min=1),
              help="Producer processes.")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(min=1),
              help="Workers sharing the group.")
@click.option("--faults", type=click.Choice(["ci", "long", "none"]), default="ci",
              show_default=True, help="ci: each fault once (3 worker kills); long: the same "
              "plan again and again while turns are sent; none: no faults.")
@click.option("--fault-gap", default=8.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds between faults.")
@click.option("--drain-timeout", default=300.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds to wait, after sending and faults, for every turn to be decided.")
@click.option("--out", type=click.Path(), default="chaos-out", show_default=True,
              help="Directory for the report, plot and logs (one subdirectory per run).")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]),
              default="WARNING", show_default=True,
              help="The workers' and API's log level, RATCHET_LOG_LEVEL (their logs are under --out).")
def chaos(seed: int, turns: int, rate: float, producers: int, workers: int, faults: str,
          fault_gap: float, drain_timeout: float, out: str, log_level: str) -> None:
    """Seeded workload + faults on the servers of RATCHET_HOME, checked by an oracle.

    Restarts, pauses and kills the servers and processes it uses: point it at servers
    nobody else needs. Exits 1 on any violation, 2 when a fault could not be injected,
    3 when the run could not start (one line says why).
    """
    from pathlib import Path

    from ratchet.chaos.runner import ChaosConfig, ChaosSetupFailed, run

    cfg = ChaosConfig(seed=seed, turns=turns, rate=rate, producers=producers, workers=workers,
                      faults=faults, fault_gap_s=fault_gap, drain_timeout_s=drain_timeout,
                      out=Path(out), log_level=log_level)
    settings = _settings()
    _known_datacenter("chaos", settings, code=3)  # 3: the run could not start
    try:
        report = run(settings, cfg)
    except ChaosSetupFailed as exc:
        print(f"ratchet chaos: cannot start: {exc}", file=sys.stderr, flush=True)
        sys.exit(3)
    sys.exit(1 if not report["passed"] else 2 if report["faults_failed"] else 0)


BENCH_SUITES = {
    # suite -> (module, what it compares)
    "validation": ("ratchet.bench.validation", "validate_turn on a 20-item, 3-round tool-loop turn"),
    "store": ("ratchet.bench.store", "promote / read_history beside raw Cassandra LWT and SELECT"),
    "api": ("ratchet.bench.api", "HTTP history lookups (hit, extension, miss, wait_ms) beside raw SELECTs"),
    "processor": ("ratchet.bench.processor", "end-to-end promoted turns/s beside raw Kafka"),
    "gateway": ("ratchet.bench.gateway", "the gateway library's send_turn beside raw Kafka produce"),
    "memory": ("ratchet.bench.memory", "a worker's RSS on a backlog of large turns"),
}

# The suites that open no Cassandra session (``validation``: none; ``gateway``: Kafka).
_NO_CASSANDRA = frozenset({"validation", "gateway"})


# --help is not click's here: after a suite's name it is the suite's own (argparse).
@main.command(context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def bench(ctx: click.Context, args: tuple[str, ...]) -> None:
    """Measure lookup, validation and persistence, each beside its raw baseline.

    ARGS: suites to run (default: all, in one run), then options for a single suite,
    e.g. `ratchet bench processor --turns 500` (`ratchet bench processor --help`). Needs
    the servers (`ratchet infra up`) for every suite but `validation`.
    """
    import importlib

    from ratchet.bench.measure import RunFailed

    if args and args[0] in ("--help", "-h"):
        click.echo(ctx.get_help())
        click.echo("\nSuites:")
        for name, (_, what) in BENCH_SUITES.items():
            click.echo(f"  {name:<11} {what}")
        return
    settings = _settings()  # a bad setting is a usage error here too (exit 2), not a traceback
    suites = []
    for arg in args:
        if arg not in BENCH_SUITES:
            break
        suites.append(arg)
    options = list(args[len(suites):])
    if options and not options[0].startswith("-"):
        # No suite takes a positional argument: a word here is a misspelt suite (it was
        # called an option, or "bench store takes no options").
        raise click.UsageError(
            f"unknown suite {options[0]!r} (one of {', '.join(BENCH_SUITES)})")
    if options and len(suites) != 1:
        raise click.UsageError(
            f"options {options} need exactly one suite first (one of {sorted(BENCH_SUITES)})")
    if options:
        # Parsed before any header: a usage error (or the suite's help) comes first and
        # alone. It printed `== bench <suite>` above argparse's error (session 46's
        # review, noted; session 48).
        (name,) = suites
        module, what = BENCH_SUITES[name]
        suite = importlib.import_module(module)
        if hasattr(suite, "parse_args"):
            suite.parse_args(options)  # argparse: exit 2 on a usage error, 0 after --help
        elif options in (["--help"], ["-h"]):
            click.echo(f"usage: ratchet bench {name}\n\n{what}; it takes no options.")
            return
        else:
            raise click.UsageError(f"bench {name} takes no options (usage: ratchet bench "
                                   f"{name})")
    if set(suites or BENCH_SUITES) - _NO_CASSANDRA:
        _known_datacenter("bench", settings)
    failed = 0
    for name in suites or tuple(BENCH_SUITES):
        module, what = BENCH_SUITES[name]
        click.echo(f"\n== bench {name}: {what}")
        entry = importlib.import_module(module).main
        takes_argv = "argv" in entry.__code__.co_varnames
        try:
            result = entry(options) if takes_argv else entry()
        except RunFailed as exc:
            # The run's verdict, not a bug: one line (it was a traceback, session 50).
            cause = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
            print(f"ratchet bench {name}: FAILED: {exc}{cause}", file=sys.stderr, flush=True)
            sys.exit(1)
        except Exception as exc:
            line = _unreachable(exc, settings)
            if line is None:
                raise  # a bug: its traceback
            print(f"ratchet bench {name}: cannot run: {line}", file=sys.stderr, flush=True)
            sys.exit(1)
        failed += bool(result)
    sys.exit(1 if failed else 0)


def _unreachable(exc: BaseException, settings: Settings) -> str | None:
    """The operator's line when ``exc``, or an error it was raised while handling (a
    bench's clean-up failing after its server could not be reached), says a server
    cannot be reached; None otherwise. A bench without its servers ended in a driver's
    traceback, or two (an operator's review, session 46)."""
    from ratchet.startup import explain

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        line = explain(exc, settings)
        if line is not None:
            return line
        exc = exc.__cause__ or exc.__context__
    return None


if __name__ == "__main__":
    main()
