"""A full read of a history, shared and budgeted: what both readers
(response_reader.py, conversation_reader.py) do when the cache cannot answer.

A full read waits for room in the answer budget (answer_budget.py), is shared by the
concurrent requests for the same history (flights.py: the readers hold the flights),
is rendered and cached once (``loaded``), and each request answers from it with its
own fingerprint (``answer``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime

from ratchet.domain.history import HistoryFailure, VerifiedHistory
from ratchet.domain.rehydration import fallback_reason
from ratchet.metric_children import child
from services.api import metrics
from services.api.answer import (
    Answer,
    failure_answer,
    not_promoted,
    unrenderable_answer,
    verified_answer,
)
from services.api.answer_budget import AnswerBudget
from services.api.cache import HistoryCache
from services.api.cached_histories import CachedHistories
from services.api.models import HistoryBody
from services.api.render import RenderedHistory, render_history


@dataclass(frozen=True)
class Loaded:
    """A full read's result, which the requests sharing it each answer from."""

    history: VerifiedHistory | HistoryFailure
    # A verified history's rendering (cached), or its CORRUPT_HISTORY body.
    rendered: RenderedHistory | HistoryBody | None
    now: datetime  # when the read began: its expiry and fallback are judged then
    # Not found, and the ledger recorded its rejection: (response id, detail).
    rejected: tuple[str, str] | None = None


class Recheck:
    """The cache's answer asked again once a full read has room (``budgeted``), and
    whether it answered. A request counts once in ``ratchet_api_history_cache_total``,
    as what it finally was: a hit when this found its history cached (``hit`` counts
    it), else a miss. Before, such a request counted as a miss when it queued and a hit
    when it found the history (session 45)."""

    def __init__(self, cached: Callable[[], Awaitable[Answer | None]]) -> None:
        self._cached = cached
        self.answered = False

    async def __call__(self) -> Answer | None:
        found = await self._cached()
        self.answered = found is not None
        return found

    def count_miss(self, endpoint: str) -> None:
        """Counts the request a miss unless the cache answered it."""
        if not self.answered:
            child(metrics.HISTORY_CACHE, endpoint, "miss").inc()


class FullReads:
    """The answer budget's wait around a full read, and each request's answer from it."""

    def __init__(
        self,
        cache: HistoryCache | None,
        histories: CachedHistories,
        answers: AnswerBudget | None,
    ) -> None:
        self._cache = cache
        self._histories = histories
        self._answers = answers

    async def budgeted(
        self,
        key: tuple[str, ...],
        read: Callable[[], Awaitable[Answer]],
        learn_as: Callable[[Answer], tuple[str, ...]] | None = None,
        cached: Callable[[], Awaitable[Answer | None]] | None = None,
    ) -> Answer:
        """``read`` (a full read) once the answer budget has room for what it will cost;
        its answer then holds its own bytes until written (answer_budget.py).
        ``learn_as``: the key the answer's cost is learned under (None: ``key``).
        ``cached``: the cache's answer, or None; asked again once the read has room,
        before reading (a read of the same history may have cached it meanwhile): the
        requests for one history waiting for room behind the read of it (one at a time,
        when its cost is most of the budget) each read it again before session 44."""
        if self._answers is None:
            return await read()
        reservation = await self._answers.reserve(key)
        try:
            found = None if cached is None else await cached()
            if found is not None:
                reservation.release()
                return found
            answer = await read()
        except BaseException:
            reservation.release()
            raise
        # Only a history teaches a lookup's cost: a failure (a poll before promotion
        # answers NOT_FOUND in a few hundred bytes) says nothing of the next read's.
        learned = sum(len(part) for part in answer.parts) if answer.status_code == 200 else None
        reservation.settle(learned, answer.own_bytes,
                           None if learn_as is None else learn_as(answer))
        if reservation.nbytes == 0:
            return answer
        return replace(answer, held=reservation)

    def loaded(self, history: VerifiedHistory | HistoryFailure, now: datetime) -> Loaded:
        """A history read: rendered and cached once, whoever shares the read."""
        if isinstance(history, HistoryFailure):
            self._histories.remember_expired(history)
            return Loaded(history, None, now)
        rendered = render_history(history)
        if isinstance(rendered, RenderedHistory):
            rendered = self._histories.shared(history.checkpoint, rendered)
            self._histories.fill(history, rendered)
        return Loaded(history, rendered, now)

    def answer(self, loaded: Loaded, fingerprint_hash: str, endpoint: str) -> Answer:
        """One request's answer from a history read (its own fingerprint)."""
        history, rendered = loaded.history, loaded.rendered
        if isinstance(history, HistoryFailure):
            if loaded.rejected is not None:
                return not_promoted(*loaded.rejected)
            return failure_answer(history, endpoint)
        if isinstance(rendered, HistoryBody):  # stored bytes that are not a UTF-8 JSON object
            return unrenderable_answer(rendered, endpoint)
        assert rendered is not None
        return verified_answer(
            self._cache,
            rendered,
            history.checkpoint,
            history.head_seq,
            fallback_reason(history.checkpoint, fingerprint_hash, loaded.now),
            endpoint,
        )
