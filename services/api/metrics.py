"""Prometheus metrics of the API process (names are documented in docs/service.md).

The worker exports its own metrics (promotions, rejections, dead letters, LWT latency,
validation time, consumer lag) from its process; these are the API's. All names start
with ``ratchet_api_`` so dashboards can tell the two processes apart.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# Buckets tuned for a local Cassandra read (sub-millisecond to tens of ms) plus waits.
_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
    2.5,
    10.0,
)

LOOKUP_SECONDS = Histogram(
    "ratchet_api_lookup_seconds",
    "Time of one verified history read (store read + verification), per endpoint.",
    ["endpoint"],
    buckets=_LATENCY_BUCKETS,
)
REQUEST_SECONDS = Histogram(
    "ratchet_api_request_seconds",
    "Wall time of a history request including any wait_ms wait.",
    ["endpoint"],
    buckets=_LATENCY_BUCKETS,
)
OUTCOMES = Counter(
    "ratchet_api_outcomes_total",
    "Rehydration answers by outcome (certified|fallback|failure) and reason.",
    ["endpoint", "outcome", "reason"],
)
STATUS_ANSWERS = Counter(
    "ratchet_api_status_total",
    "Status answers by state (promoted|rejected|unknown) and reason.",
    ["state", "reason"],
)
WAITS = Counter(
    "ratchet_api_waits_total",
    "wait_ms waits by how they ended (woken_promoted|woken_rejected|woken_unknown|timeout).",
    ["result"],
)
WAIT_FIRST_LOOKS = Counter(
    "ratchet_api_wait_first_looks_total",
    "wait_ms requests' first look, by what it found (undecided: waited with no lookup; "
    "found: a lookup answered or decided to wait).",
    ["result"],
)
WAITING = Gauge("ratchet_api_waiting_requests", "Requests currently waiting for a decision.")
NOTIFIER_RECORDS = Counter(
    "ratchet_api_notifier_records_total",
    "Decision records the API consumed from Kafka, by topic and decodability.",
    ["topic", "result"],
)
NOTIFIER_LAG = Gauge(
    "ratchet_api_notifier_lag_records",
    "Records between the notifier's position and the high watermark, per topic.",
    ["topic"],
)
NOTIFIER_UP = Gauge(
    "ratchet_api_notifier_up", "1 while the decision consumer is assigned and polling."
)
NOTIFIER_RESTARTS = Counter(
    "ratchet_api_notifier_restarts_total",
    "Restarts of the decision consumer, by cause (topics_changed, topics_missing, failed).",
    ["cause"],
)
NOTIFIER_RESTART_DELAY = Gauge(
    "ratchet_api_notifier_restart_delay_seconds",
    "The delay before the decision consumer's last restart, whatever its cause "
    "(0: at once; grows with restarts in a row, bounded, jittered).",
)
SHARED_READS = Counter(
    "ratchet_api_shared_reads_total",
    "Full reads by requests for a history, by kind (response, conversation): read "
    "(a store read made) or joined (another request's read shared; flights.py).",
    ["kind", "result"],
)
SHARED_READ_OVERTAKES = Counter(
    "ratchet_api_shared_read_overtakes_total",
    "Full reads begun beside the read of the same history before them, after waiting "
    "OVERTAKE_AFTER_S for it to end (flights.py): a read slow or stuck until the store's "
    "timeout.",
    ["kind"],
)
STORE_ERRORS = Counter(
    "ratchet_api_store_errors_total",
    "Store reads that raised (infrastructure failure, answered 503).",
    ["endpoint"],
)
HISTORY_CACHE = Counter(
    "ratchet_api_history_cache_total",
    "History lookups by cache result: hit (served from memory; a Conversation's after one "
    "head read), extended (a cached prefix plus only the new rows, read and verified), "
    "miss (read in full), bypass (no-cache request: read in full).",
    ["endpoint", "result"],
)
HISTORY_CACHE_BYTES = Gauge(
    "ratchet_api_history_cache_bytes", "Bytes of rendered histories in the cache."
)
HISTORY_CACHE_ENTRIES = Gauge(
    "ratchet_api_history_cache_entries", "Verified histories in the cache."
)

PREWARM = Counter(
    "ratchet_api_history_prewarm_total",
    "Promotion records the API used to warm its history cache: warmed (extended by the "
    "new row), skipped (parent not cached), woken (a waiting request reads it instead), "
    "dropped (too many warm-ups running), failed (store error).",
    ["result"],
)
STALLED_ANSWERS = Counter(
    "ratchet_api_stalled_answers_total",
    "Connections aborted because their client took none of an answer's waiting bytes for "
    "RATCHET_API_SEND_STALL_S seconds (services/api/slow_readers.py).",
)
ANSWER_BYTES_HELD = Gauge(
    "ratchet_api_answer_bytes_held",
    "Bytes the answer budget holds: full reads running, and the answers they built that "
    "are their request's own copy until written (services/api/answer_budget.py).",
)
ANSWER_BUDGET_REFUSALS = Counter(
    "ratchet_api_answer_budget_refusals_total",
    "Full reads answered 503 because the answer budget had no room for their whole wait.",
)
