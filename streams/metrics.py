"""Prometheus metrics of the worker process, served at ``/metrics`` on its own port
(``Settings.worker_metrics_port``, ``RATCHET_WORKER_METRICS_PORT``; 0 turns it off, e.g.
for several workers on one machine in tests).

Each process exports what it alone can see: the API its lookups (``ratchet_api_*``),
the worker its decisions and their costs (``ratchet_worker_*``). Names are listed in
docs/service.md.
"""

from __future__ import annotations

import functools
import logging

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from ratchet.metric_children import child
from schemas.models import CheckpointPromoted, DeadLetter, EffectOrphaned, PromotionRejected

log = logging.getLogger(__name__)

# A local LWT is a few ms; a retrying one can take seconds.
_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)

PROMOTIONS = Counter(
    "ratchet_worker_promotions_total",
    "Turns promoted (durable and published), by certification.",
    ["certification"],
)
REJECTIONS = Counter(
    "ratchet_worker_rejections_total",
    "Turns rejected (PromotionRejected published), by reason code.",
    ["reason"],
)
DEAD_LETTERS = Counter(
    "ratchet_worker_dead_letters_total",
    "Records parked in the dead-letter topic, by reason.",
    ["reason"],
)
ORPHANED_EFFECTS = Counter(
    "ratchet_worker_orphaned_effects_total", "EffectOrphaned records published."
)
LWT_SECONDS = Histogram(
    "ratchet_worker_lwt_seconds",
    "Time of one store.promote call (the conditional batch, plus its SERIAL read if refused).",
    buckets=_BUCKETS,
)
VALIDATION_SECONDS = Histogram(
    "ratchet_worker_validation_seconds",
    "Time of the pure validation of one TurnCompleted.",
    buckets=_BUCKETS,
)
EVENTS_BY_PATH = Counter(
    "ratchet_worker_events_total",
    "Gateway events handled, by path: 'loop' (a promotion decided and written on the "
    "event loop) or 'thread' (everything else, in a worker thread).",
    ["path"],
)
PERSISTENCE_RETRIES = Counter(
    "ratchet_worker_persistence_retries_total",
    "Attempts that met unavailable Cassandra/registry and were retried (the partition waited).",
)
LINEAGE_READ_MISSES = Counter(
    "ratchet_worker_lineage_read_misses_total",
    "Turns rejected CORRUPT because fresh history reads kept missing the lineage the "
    "store's view (at SERIAL) said they extend, or kept giving a copy of it the write "
    "found changed (damaged rows, or a store whose two reads disagree; "
    "streams/turn_decider.py, MAX_LINEAGE_MISSES). A healthy store never counts.",
)
ORPHANS_WITHHELD = Counter(
    "ratchet_worker_orphans_withheld_total",
    "Times the worker published no EffectOrphaned where it would have had to decide some, "
    "because a read the decision needs met damaged rows (whether the request stands "
    "promoted, or its promotion's items): the effects stay recorded, their compensation "
    "is the operator's (docs/operations.md). By where: late_effect, cancellation, "
    "rejection, promoted_items, claim (a damaged effect claim of the request). A healthy store "
    "never counts.",
    ["where"],
)
PARTITION_PARKS = Counter(
    "ratchet_worker_partition_parks_total",
    "Times a partition's lane was full and the partition was paused until it had room "
    "(streams/parking.py): one slow partition, the others going on.",
)
CONSUMER_LAG = Gauge(
    "ratchet_worker_consumer_lag_records",
    "Records the worker still owes, per assigned partition: not fetched yet, or fetched "
    "and not acked (queued or in flight). No sample for a partition no record of which "
    "was fetched since its assignment.",
    ["topic", "partition"],
)


events_by_path = functools.partial(child, EVENTS_BY_PATH)
_promotions = functools.partial(child, PROMOTIONS)
_rejections = functools.partial(child, REJECTIONS)
_dead_letters = functools.partial(child, DEAD_LETTERS)
orphans_withheld = functools.partial(child, ORPHANS_WITHHELD)


def serve(host: str, port: int) -> bool:
    """Start the exporter; False (logged, not fatal) if the port is taken or disabled."""
    if port == 0:
        return False
    try:
        start_http_server(port, addr=host)
    except OSError as exc:
        log.warning("worker metrics not served on %s:%d: %s", host, port, exc)
        return False
    log.info("worker metrics at http://%s:%d/metrics", host, port)
    return True


def observe_published(models: list) -> None:
    """Count the outcome records of one event once they are durable AND published.

    A redelivered event publishes its outcome again and is counted again: these count
    what the worker emitted, the store holds the truth of what was promoted.
    """
    for model in models:
        if isinstance(model, CheckpointPromoted):
            _promotions(model.certification.value).inc()
        elif isinstance(model, PromotionRejected):
            _rejections(model.reason.value).inc()
        elif isinstance(model, DeadLetter):
            _dead_letters(model.reason.value).inc()
        elif isinstance(model, EffectOrphaned):
            ORPHANED_EFFECTS.inc()
