"""What a history read answers when there is no verified history to give: an unknown
id (``NOT_FOUND``), a promoted turn whose row is gone (``MISSING_HISTORY``, see
``CheckpointStore.turn_lost``), and the rule that a failure saying the stored rows are
wrong is decided from two reads (``CONFIRMED_FAILURES``, ``_confirmed``)."""

from __future__ import annotations

import logging

from ratchet.domain.history import HistoryFailure, HistoryFailureReason, VerifiedHistory

log = logging.getLogger(__name__)


def _exactly_one(response_id: str | None, conversation_id: str | None) -> None:
    if (response_id is None) == (conversation_id is None):
        raise ValueError("give exactly one of response_id or conversation_id")


def no_such_response() -> HistoryFailure:
    return HistoryFailure(HistoryFailureReason.NOT_FOUND, "no such response")


def lost_turn(tenant_id: str, partition_key: str, response_id: str) -> str:
    return (f"response {response_id} of tenant {tenant_id} was promoted in {partition_key} "
            "(its request's idempotency record names it) but its turn row is missing")


def _missing_turn(tenant_id: str, partition_key: str, response_id: str) -> HistoryFailure:
    return HistoryFailure(HistoryFailureReason.MISSING_HISTORY,
                          lost_turn(tenant_id, partition_key, response_id))


# Failures that say the stored rows are wrong: a lineage with a gap, rows that do not
# verify. A history read decides them from two reads (``read_history``). Why: once, in
# a benchmark run (2026-12-03, docs/decisions.md, "A lineage gap seen once"), an API
# partition read showed a Conversation's second turn without its first, 11 and 32 ms
# after they were written; the first turn's row was there for every later read. Rows that
# are really missing or corrupt fail both reads the same way; a read that saw less
# than storage holds is not answered as a broken history.
CONFIRMED_FAILURES = frozenset(
    {HistoryFailureReason.MISSING_HISTORY, HistoryFailureReason.CORRUPT_HISTORY}
)


def _needs_confirming(result: VerifiedHistory | HistoryFailure) -> bool:
    return isinstance(result, HistoryFailure) and result.reason in CONFIRMED_FAILURES


def _confirmed(
    tenant_id: str,
    history_id: str | None,
    first: VerifiedHistory | HistoryFailure,
    again: VerifiedHistory | HistoryFailure,
) -> VerifiedHistory | HistoryFailure:
    """The second read's answer; a second read that disagrees with the first is logged
    (the first read saw rows that storage did not hold by the second)."""
    if again != first:
        log.warning(
            "a history read failed and the read made again did not agree",
            extra={"ctx": {"tenant_id": tenant_id, "history": history_id,
                           "first": _described(first), "again": _described(again)}},
        )
    return again


def _described(result: VerifiedHistory | HistoryFailure) -> str:
    if isinstance(result, HistoryFailure):
        return f"{result.reason.value}: {result.detail}"
    return f"verified, {len(result.lineage)} turns"
