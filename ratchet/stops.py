"""A command stopped by a signal, as exceptions: what the CLI's stop lines tell apart.

Here, not in the adapters, so that the CLI can name them before it imports anything
slow (a stop can land during the import) and the adapters can raise them."""

from __future__ import annotations

import os
import signal
import sys


class Terminated(BaseException):
    """SIGTERM, raised in the main thread as Ctrl-C raises ``KeyboardInterrupt``: how
    Kubernetes stops a Job's pod (its deadline, a deleted pod). With Python's default
    handler ``ratchet migrate`` died at once, exit 143 and no ``finally``, its lease held
    for its TTL (120 s), the Job's next attempt waiting that long (session 47's review,
    left; session 48). A ``BaseException``: nothing that handles failures takes it for
    one."""


# The stops (SIGTERM, Ctrl-C) that came before the command chose what to do with them
# (``defer_stops``), in the order they came.
_deferred: list[int] = []

# Each stop kept, with the handler it is kept over: Python's own (a SIGINT ignored, as in
# a background job, stays ignored; a host's own handler stays).
_DEFAULTS = ((signal.SIGTERM, signal.SIG_DFL), (signal.SIGINT, signal.default_int_handler))


def defer_stops(cli_module: str) -> None:
    """Keep a SIGTERM or Ctrl-C for later: the first thing ``ratchet.cli`` does, before
    its imports (click alone takes ~0.1 s), so that the stop lands where the command
    decides (``raise_on_sigterm`` raises it, ``default_stops`` has it act as Python's
    default). Until then SIGTERM was Python's default death, no line, for ``ratchet api``
    / ``worker`` too (session 48's second review, left; session 49), and Ctrl-C a
    ``KeyboardInterrupt`` traceback out of an import (session 49's review). Raising here
    instead would come out of an import or click's parsing, outside any command's
    handling. Only over Python's default: a host that set its own handler keeps it.

    Only in the CLI's own process (``cli_module``: the importer's ``__name__``): a
    process that imports ``ratchet.cli`` and never runs a command (pytest collecting a
    test of the CLI, a tool) kept every SIGTERM for a command that never came, and
    SIGTERM no longer stopped it (session 49's review)."""
    if not _is_the_program(cli_module):
        return
    for signum, default in _DEFAULTS:
        if signal.getsignal(signum) is default:
            signal.signal(signum, _keep)


def _is_the_program(cli_module: str) -> bool:
    """``python -m ratchet.cli`` (the CLI is ``__main__``) or the ``ratchet`` console
    script (a file named ``ratchet`` that imports the CLI to run ``main``: the image's
    entrypoint, pip's and uv's scripts)."""
    if cli_module == "__main__":
        return True
    program = getattr(sys.modules.get("__main__"), "__file__", None) or ""
    return os.path.basename(program) == "ratchet"


def _keep(signum: int, _frame: object) -> None:
    _deferred.append(signum)


def _end_deferral() -> int | None:
    """Python's defaults back where stops were kept; the first stop kept, if any."""
    for signum, default in _DEFAULTS:
        if signal.getsignal(signum) is _keep:
            signal.signal(signum, default)
    first = _deferred[0] if _deferred else None
    _deferred.clear()
    return first


def raise_on_sigterm() -> None:
    """From now on SIGTERM raises ``Terminated`` in the main thread (and Ctrl-C
    ``KeyboardInterrupt``, as by default); the first stop deferred (``defer_stops``) is
    raised now, as either."""
    signal.signal(signal.SIGTERM, _raise_terminated)
    first = _end_deferral()
    if first == signal.SIGTERM:
        raise Terminated
    if first == signal.SIGINT:
        raise KeyboardInterrupt


def default_stops() -> None:
    """Python's defaults again (commands with no handling of their own); the first stop
    deferred acts as it would have: SIGTERM the default death now, Ctrl-C a
    ``KeyboardInterrupt`` (click's ``Aborted!``, as a Ctrl-C in the command's run)."""
    first = _end_deferral()
    if first == signal.SIGTERM:  # kept, so its default is back: the death
        os.kill(os.getpid(), signal.SIGTERM)
    elif first == signal.SIGINT:
        raise KeyboardInterrupt


def _raise_terminated(_signum: int, _frame: object) -> None:
    raise Terminated


class LeaseLeft(BaseException):
    """``ratchet migrate`` was stopped (Ctrl-C, SIGTERM: the stop is the ``__cause__``)
    while it released its migration lease: whether the ``DELETE`` reached Cassandra is
    unknown, so the lease may stay held until its TTL ends, a migrate started sooner
    waiting for it. The stop came out as it was, and the CLI's line said nothing of the
    lease (session 47's review, left; session 48). The run's own failure the release
    came after is in ``MigrateProgress.failure``."""

    def __init__(self, lease: str) -> None:
        super().__init__(lease)
        self.lease = lease


class MigrateProgress:
    """How far ``ratchet migrate`` got, kept by ``apply_migrations`` as it goes, read by
    the CLI's stop line wherever the stop lands (a closing session's ``finally``
    included). An exception cannot carry it: a further stop replaces the exception, and a
    stop before the lease is a bare ``KeyboardInterrupt``. The line said "what it applied
    stays applied, a migration it was applying is not recorded" in every phase, before
    the lease (nothing applied) and after the last migration was recorded alike; and a
    failure was said by the handler a later stop skipped (session 48's review, left;
    session 49).

    ``phase``: ``connecting`` (before the lease: no migration applied), ``waiting`` (for
    another migrator's lease), ``applying`` (the lease held), ``applied`` (every
    migration recorded), ``released`` (and the lease released). ``failure``: the run's
    failure, once it failed; ``failure_said``: its line was written.

    While ``applying``: ``recorded``, the migrations (file names) this run applied and
    recorded; ``under_way``, the one whose statements were sent and whose record is not
    known to be written (None between migrations), ``recording`` once its record was
    sent. The line said "a migration it was applying is not recorded" after any failure
    or stop there, true only while one was under way: not after a failure before the
    first (a checksum mismatch, a newer schema) or between two (session 49's review,
    left; session 50)."""

    def __init__(self) -> None:  # no dataclass: its import is ~30 ms of a stop's window
        self.phase = "connecting"
        self.failure: Exception | None = None
        self.failure_said = False
        self.recorded: list[str] = []
        self.under_way: str | None = None
        self.recording = False
