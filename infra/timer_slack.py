"""Run a command with a coarser timer slack: ``python -m infra.timer_slack NS CMD...``.

Sets the calling thread's timer slack to NS nanoseconds (``prctl(PR_SET_TIMERSLACK)``)
and replaces itself with CMD (same pid). Every thread CMD creates inherits the value,
and ``execve`` keeps it, so it covers the whole JVM the launcher starts.

Why (docs/decisions.md, "Cassandra's spin-waits"): Cassandra's shared worker pool
(``SEPWorker``) waits for work in timed sleeps of 10 us and up, so a lightly loaded
node wakes tens of thousands of times a second. On a small machine shared with the
processor that cost about half a core. The kernel may end a timed sleep up to "timer
slack" late; a coarser slack lets those wake-ups merge. Wake-ups by a signal (a
request handed to a parked thread) are not delayed; only timed sleeps are.
"""

from __future__ import annotations

import ctypes
import os
import sys

PR_SET_TIMERSLACK = 29  # linux/prctl.h


def set_timer_slack(ns: int) -> None:
    """The calling thread's timer slack, in ns (0: the thread's default again)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(ns), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_TIMERSLACK, {ns}): {os.strerror(err)}")


def wrapped(ns: int, command: list[str]) -> list[str]:
    """``command`` started through this module with a timer slack of ``ns``."""
    return [sys.executable, "-m", "infra.timer_slack", str(ns), *command]


def main(argv: list[str]) -> None:
    if len(argv) < 2 or not argv[0].isdigit():
        raise SystemExit("usage: python -m infra.timer_slack NANOSECONDS COMMAND [ARG...]")
    set_timer_slack(int(argv[0]))
    os.execvp(argv[1], argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
