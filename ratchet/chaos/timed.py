"""Expiries that pass during the run, judged by when each read was asked.

A turn of the workload's ``expiring`` scenario (``Story.timed``) has its router receipt,
its token artifact or its logical expiry (``TurnCompleted.expires_at``) end
``TIMED_MS`` after its send: the producer stamps that expiry when it sends the turn
(``Stamper``; generation time is no use, every process generates the workload at its own
moment) and logs it (``<out>/stamps-<i>.jsonl``). What the docs promise
(docs/gateway-protocol.md section 6 and section 8, "Logical expiry"):

- a router receipt or token artifact past its ``expires_at`` is no longer offered for
  reuse: reads fall back ``ARTIFACT_EXPIRED`` (after ``NO_ARTIFACT`` and
  ``FINGERPRINT_MISMATCH``, in that order). An artifact already expired when the turn is
  processed is not kept (``NO_ARTIFACT``): which of the two applies depends on when the
  worker processed it, which only the run can tell (``settle``). A receipt is kept
  whatever its expiry, so its turns do not depend on that;
- a response past its logical expiry reads ``EXPIRED`` (410); promotion ignores it.

Reads are judged only far enough from the expiry (``MARGIN_MS``): a read ANSWERED more
than the margin before it must still be served as before the expiry, a read ASKED more
than the margin after it must show the expiry; a read in between is not judged (a slow
machine must not raise false alarms). The ``Prober`` asks each timed turn right after
its send (with ``wait_ms``) and again after its expiry; the runner waits until every
expiry is past before the checker's own reads (``wait_past``), so ``Promo.read`` (the
oracle's answer past the expiry) judges those; ``wait_ms`` answers of timed turns are
judged here, by the time they were asked (``take_waits``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from ratchet.chaos import recipes
from ratchet.chaos.observations import History, Observations, Violation
from ratchet.chaos.oracle import Expectation, Promo
from ratchet.chaos.story import Story, workload_fp_hash
from ratchet.chaos.workload import Workload
from schemas.models import TurnCompleted

# Reads closer than this to an expiry are not judged; the runner's reads wait this long
# past the last expiry.
MARGIN_MS = 1500


def now_ms() -> int:
    return int(time.time() * 1000)


def stamp(story: Story, index: int, ev: TurnCompleted, at_ms: int) -> TurnCompleted:
    """The turn as sent at ``at_ms``: what ``story.timed[index]`` names expires
    ``offset`` ms later (the proof keeps its own expiry: its expiry is judged as the
    artifact's, so one timed thing of the two is enough)."""
    what, offset = story.timed[index]
    expires = at_ms + offset
    if what == "receipt":
        return ev.model_copy(update={"router_receipt": ev.router_receipt.model_copy(
            update={"expires_at": expires})})
    if what == "artifact":
        return ev.model_copy(update={"token_artifact": ev.token_artifact.model_copy(
            update={"expires_at": expires})})
    return ev.model_copy(update={"expires_at": expires})


@dataclass(frozen=True)
class Stamp:
    tenant: str
    response_id: str
    what: str
    expires_ms: int
    sent_ms: int


class Stamper:
    """The producer's: stamps a timed turn at its first send and logs it; the same
    event again (a round sent again, a redelivery) is the same bytes."""

    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._sent: dict[tuple[int, int], TurnCompleted] = {}

    def __call__(self, story: Story, index: int, ev):
        if index not in story.timed or not isinstance(ev, TurnCompleted):
            return ev
        key = (story.index, index)
        if key not in self._sent:
            at = now_ms()
            self._sent[key] = stamp(story, index, ev, at)
            if self._path is not None:
                what, offset = story.timed[index]
                with self._path.open("a") as log:
                    log.write(json.dumps({"tenant": ev.tenant_id, "rid": ev.response_id,
                                          "what": what, "expires_ms": at + offset,
                                          "sent_ms": at}) + "\n")
        return self._sent[key]


def read_stamps(out: Path) -> dict[tuple[str, str], Stamp]:
    stamps: dict[tuple[str, str], Stamp] = {}
    for path in sorted(out.glob("stamps-*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                stamps.setdefault((r["tenant"], r["rid"]),
                                  Stamp(r["tenant"], r["rid"], r["what"], r["expires_ms"],
                                        r["sent_ms"]))
    return stamps


def wait_past(stamps: dict[tuple[str, str], Stamp], say=print) -> None:
    """Sleep until every expiry is more than the margin past."""
    if not stamps:
        return
    left = max(s.expires_ms for s in stamps.values()) + MARGIN_MS + 200 - now_ms()
    if left > 0:
        say(f"waiting {left / 1000:.1f}s for the timed turns' expiries to pass")
        time.sleep(left / 1000)


# ---------------------------------------------------------------------------- reads


@dataclass(frozen=True)
class TimedRead:
    tenant: str
    response_id: str
    history: History
    asked_ms: int
    answered_ms: int | None  # None: not known (a ``wait_ms`` answer of the waiters)


@dataclass
class Prober:
    """Asks each timed turn's history right after its send (``wait_ms``) and again once
    its expiry is past, from the stamps the producers log."""

    base_url: str
    out: Path
    reads: list[TimedRead] = field(default_factory=list)
    wait_ms: int = 2000

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-timed-prober",
                                        daemon=True)
        self._pool = ThreadPoolExecutor(3)
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self._pool.shutdown(wait=True)

    def _run(self) -> None:
        seen: set[tuple[str, str]] = set()
        later: list[Stamp] = []
        while not self._stop.is_set():
            for key, st in read_stamps(self.out).items():
                if key not in seen:
                    seen.add(key)
                    self._pool.submit(self._ask, st, self.wait_ms)
                    later.append(st)
            due = [s for s in later if now_ms() > s.expires_ms + MARGIN_MS + 100]
            for st in due:
                later.remove(st)
                self._pool.submit(self._ask, st, 0)
            self._stop.wait(0.2)
        for st in later:  # the run is over: past every expiry by now (wait_past)
            self._pool.submit(self._ask, st, 0)

    def _ask(self, st: Stamp, wait_ms: int) -> None:
        from ratchet.chaos.observe import history_of
        from services.gateway.client import RehydrationClient
        from services.gateway.errors import GatewayError

        fp = workload_fp_hash()
        try:
            with RehydrationClient(self.base_url, timeout_s=30) as client:
                asked = now_ms()
                outcome = client.response_history(st.tenant, st.response_id, fp, wait_ms)
                answered = now_ms()
        except GatewayError:
            return
        with self._lock:
            self.reads.append(TimedRead(st.tenant, st.response_id, history_of(outcome, fp),
                                        asked, answered))


# -------------------------------------------------------------------------- judging


def _promos(expectations: Iterable[Expectation]) -> dict[tuple[str, str], list[tuple]]:
    """(tenant, rid) of every timed promotion -> [(world, promo)] of its story."""
    out: dict[tuple[str, str], list[tuple]] = {}
    for e in expectations:
        for w in e.worlds:
            for rid, promo in w.promoted.items():
                if promo.expiring is not None:
                    out.setdefault((e.story.tenant, rid), []).append((w, promo))
    return out


def settle(expectations: list[Expectation], stamps: dict[tuple[str, str], Stamp],
           obs: Observations) -> None:
    """What only the run can tell: whether a timed artifact had expired when its turn
    was processed (then it was never kept: ``NO_ARTIFACT``). Published more than the
    margin before its expiry: surely kept. Else (a slow worker) the checker's read of it
    says which, among the two the docs allow, and every other read must agree."""
    published: dict[tuple[str, str], int] = {}
    for p in obs.promoted:
        key = (p.tenant, p.response_id)
        published[key] = min(published.get(key, p.at_ms), p.at_ms)
    for key, pairs in _promos(expectations).items():
        st = stamps.get(key)
        for w, promo in pairs:
            if promo.expiring != "artifact" or st is None:
                continue
            at = published.get(key)
            if at is not None and at < st.expires_ms - MARGIN_MS:
                continue
            got = obs.histories.get(key)
            late = got is not None and got.reason == "NO_ARTIFACT"
            w.promoted[key[1]] = replace(promo, late=late)
            if w.keys.get(promo.key) is promo:
                w.keys[promo.key] = w.promoted[key[1]]


def take_waits(obs: Observations, stamps: dict[tuple[str, str], Stamp]) -> list[TimedRead]:
    """The ``wait_ms`` answers of timed turns, out of the checker's hands (it judges a
    read as if asked after every expiry): judged here by when each was asked."""
    keep, taken = [], []
    for wait in obs.waits:
        if (wait.tenant, wait.response_id) in stamps:
            taken.append(TimedRead(wait.tenant, wait.response_id, wait.history,
                                   wait.asked_ms, None))
        else:
            keep.append(wait)
    obs.waits[:] = keep
    return taken


def judge(expectations: list[Expectation], stamps: dict[tuple[str, str], Stamp],
          reads: Iterable[TimedRead]) -> tuple[list[Violation], dict[str, int]]:
    """Each read of a timed turn far enough from its expiry against the oracle: before
    it, as if nothing expired; after it, the expiry's answer. A failure before the
    promotion is not judged here (the checker judges decisions and stale waits)."""
    promos = _promos(expectations)
    fp = workload_fp_hash()
    out: list[Violation] = []
    counts = {"before": 0, "after": 0, "unjudged": 0, "missing_stamp": 0}
    for r in reads:
        key = (r.tenant, r.response_id)
        st, pairs = stamps.get(key), promos.get(key)
        if st is None or not pairs:
            counts["missing_stamp" if pairs else "unjudged"] += 1
            continue
        if r.history.outcome == "failure" and r.history.reason in ("NOT_PROMOTED", "NOT_FOUND"):
            counts["unjudged"] += 1  # not decided yet when asked
            continue
        if r.asked_ms > st.expires_ms + MARGIN_MS:
            when, past = "after", True
        elif r.answered_ms is not None and r.answered_ms < st.expires_ms - MARGIN_MS:
            when, past = "before", False
        else:
            counts["unjudged"] += 1
            continue
        counts[when] += 1
        wanted = {_want(promo, fp, past) for _, promo in pairs}
        got = (r.history.outcome, r.history.reason)
        if got not in wanted:
            out.append(Violation("expiry_mismatch", r.tenant, (
                f"{r.response_id} ({st.what} expiring at {st.expires_ms}) read "
                f"{r.asked_ms - st.expires_ms:+d} ms from its expiry: "
                f"{'/'.join(x for x in got if x)}, expected "
                f"{' or '.join('/'.join(x for x in w if x) for w in sorted(wanted, key=str))}")))
    return out, counts


def _want(promo: Promo, fp: str, past: bool) -> tuple[str, str | None]:
    return promo.read_at(fp, past_expiry=past)


def recipe_violations(workload: Workload) -> list[Violation]:
    """Where the product's gateway library computed a digest otherwise than the docs'
    recipe (ratchet/chaos/recipes.py): a drift the oracle would otherwise move with."""
    return [Violation("recipe_mismatch", "-", detail) for detail in recipes.cross_check(
        e for s in workload.stories for e in s.events)]


