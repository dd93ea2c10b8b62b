"""A process's first log lines, kept until it has set up logging (or failed to start).

The worker connects, creates its topics and says which group it joins before Faust's
worker configures logging; Python drops an INFO record that finds no handler, so those
lines never reached the log (docs/operations.md promised them; found by an outside
review of the deployment, session 25). ``hold()`` keeps them; ``replay()``, called once
the process's handlers exist, passes each to them as if it had just been logged (its
own time, logger and level), then stops holding. A process that cannot start drops
them and says why in one line (``ratchet api``: the Cassandra driver's connection
errors came first, with tracebacks; an operator's review, session 38).
"""

from __future__ import annotations

import logging


class EarlyRecords(logging.Handler):
    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.records: list[logging.LogRecord] = []  # replay() empties it: once only

    def emit(self, record: logging.LogRecord) -> None:
        if any(h is not self for h in logging.getLogger().handlers):
            return  # logging is set up: another handler has this record
        if len(self.records) < 1000:  # start-up lines only: never a memory leak
            self.records.append(record)

    def replay(self) -> None:
        # Faust's logging set-up may have removed this handler from the root already.
        logging.getLogger().removeHandler(self)
        for record in self.records:
            logger = logging.getLogger(record.name)
            if logger.isEnabledFor(record.levelno):
                logger.handle(record)
        self.records.clear()


def hold(level: str) -> EarlyRecords:
    """Keep the records of ``level`` and above logged from now until ``replay``."""
    numeric = logging.getLevelName(level.upper())
    held = EarlyRecords(numeric if isinstance(numeric, int) else logging.INFO)
    root = logging.getLogger()
    root.addHandler(held)
    if root.level > held.level or root.level == logging.NOTSET:
        root.setLevel(held.level)  # Faust sets the root's level itself when it starts
    return held
