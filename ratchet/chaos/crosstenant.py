"""Reads as another tenant of the workload (docs/chaos.md, "Reads as another tenant").

``fetch_histories`` already asks some responses as ``FOREIGN_TENANT``, a tenant that
sent nothing (``tenant_leak``). Here the asker is a REAL tenant of the run, one with
histories of its own in the API's cache and store, that never used the id asked (no
event of it names that id: a response id two tenants use is each one's own), on every
read endpoint:

- a response's history: 404 ``NOT_FOUND`` (CONTRACT 5: "also for another tenant's id:
  no leak");
- a Conversation's history: 404 ``NOT_FOUND`` (gateway-protocol.md section 8: "unknown
  id, another tenant's id (same body)");
- a response's ``/status``: 200 ``unknown`` ("nothing recorded for this tenant, also
  another tenant's id");
- a response's history with ``wait_ms``: 409 ``NOT_PROMOTED`` after the whole wait
  ("another tenant's id (which waits the full time, so nothing leaks)").

Each answer must disclose nothing: every history field null, and the body the same as
the one the same tenant gets for an id nobody used (``baseline``, the id itself
replaced by ``<id>`` in both), as the docs' "same body" says.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx

from ratchet.chaos.oracle import Expectation
from schemas.models import TurnCompleted

if TYPE_CHECKING:
    from ratchet.chaos.observations import Observations

WAIT_MS = 300
# What each endpoint must answer another tenant: HTTP status, outcome/state, reason.
EXPECTED = {
    "history": (404, "failure", "NOT_FOUND"),
    "conversation": (404, "failure", "NOT_FOUND"),
    "status": (200, "unknown", None),
    "wait": (409, "failure", "NOT_PROMOTED"),
}
# Fields that would disclose a history (all null in a failure body and a status body).
DISCLOSING = ("items", "head_seq", "conversation_head_seq", "checkpoint", "seq",
              "existing_response_id")


@dataclass(frozen=True)
class CrossRead:
    """One read by ``tenant`` of ``ident``, which ``owner`` sent and ``tenant`` never
    used: the endpoint (``what``), HTTP status, body (None: not JSON) and how long it
    took (ms)."""

    what: str
    owner: str
    tenant: str
    ident: str
    http_status: int
    body: dict | None
    elapsed_ms: float


def used_ids(expectations: list[Expectation]) -> dict[str, set[str]]:
    """Every id each tenant's events name (response, Conversation, parent, chain root)."""
    used: dict[str, set[str]] = {}
    for e in expectations:
        for ev in e.story.events:
            if not isinstance(ev, TurnCompleted):
                continue
            ids = used.setdefault(ev.tenant_id, set())
            ids.update(i for i in (ev.response_id, ev.conversation_id,
                                   ev.previous_response_id, ev.chain_root_id) if i)
    return used


def foreign_picker(expectations: list[Expectation]) -> Callable[[str, str], str | None]:
    """``(owner, ident) ->`` the next tenant of the workload after ``owner`` (in name
    order) whose events never name ``ident``; None if there is none."""
    used = used_ids(expectations)
    tenants = sorted({e.story.tenant for e in expectations if e.story.kind != "garbage"})

    def pick(owner: str, ident: str) -> str | None:
        start = tenants.index(owner) + 1 if owner in tenants else 0
        for n in range(len(tenants)):
            other = tenants[(start + n) % len(tenants)]
            if other != owner and ident not in used.get(other, set()):
                return other
        return None

    return pick


def jobs(expectations: list[Expectation], responses: list[tuple[str, str]],
         conversations: list[tuple[str, str]], history_every: int = 10,
         conversation_every: int = 3, wait_every: int = 100) -> list[tuple[str, str, str, str]]:
    """(what, owner, foreign tenant, id) of every cross-tenant read of the run."""
    pick = foreign_picker(expectations)
    out = []
    for what, every, idents in (("history", history_every, responses),
                                ("status", history_every, responses[3:]),
                                ("wait", wait_every, responses[7:]),
                                ("conversation", conversation_every, conversations)):
        for owner, ident in idents[::every]:
            foreign = pick(owner, ident)
            if foreign is not None:
                out.append((what, owner, foreign, ident))
    return out


def normalized(body: dict | None, ident: str) -> str:
    """The body as canonical JSON with the id asked replaced by ``<id>``."""
    return json.dumps(body, sort_keys=True).replace(ident, "<id>")


def _get(http: httpx.Client, what: str, tenant: str, ident: str, fp_hash: str):
    if what == "status":
        return http.get(f"/v1/responses/{ident}/status", params={"tenant_id": tenant})
    if what == "conversation":
        return http.get(f"/v1/conversations/{ident}/history",
                        params={"tenant_id": tenant, "fingerprint_hash": fp_hash})
    params = {"tenant_id": tenant, "fingerprint_hash": fp_hash}
    if what == "wait":
        params["wait_ms"] = str(WAIT_MS)
    return http.get(f"/v1/responses/{ident}/history", params=params)


def read(base_url: str, fp_hash: str, todo: list[tuple[str, str, str, str]], tag: str,
         obs: Observations) -> None:
    """Every read of ``todo`` into ``obs.cross_reads``, and per endpoint and tenant
    asking, the answer for an id nobody used (``obs.cross_baseline``). A read whose
    answer is a 5xx or no answer after its retries is a ``Lost``
    (``cross_tenant_<what>``)."""
    from ratchet.chaos.observations import Lost

    def one(http, what, owner, tenant, ident) -> CrossRead | None:
        asked, error = int(time.time() * 1000), ""
        for attempt in range(5):
            start = time.monotonic()
            try:
                resp = _get(http, what, tenant, ident, fp_hash)
                elapsed = (time.monotonic() - start) * 1000
                if resp.status_code in (502, 503, 504):
                    raise httpx.HTTPError(f"HTTP {resp.status_code}")
                try:
                    body = resp.json()
                except ValueError:
                    body = None
                return CrossRead(what, owner, tenant, ident, resp.status_code,
                                 body if isinstance(body, dict) else None, elapsed)
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
                time.sleep(0.5 + attempt)
        obs.lost.append(Lost(f"cross_tenant_{what}", tenant, ident, asked,
                             int(time.time() * 1000), error))
        return None

    with httpx.Client(base_url=base_url, timeout=30) as http:
        for what, tenant in sorted({(w, t) for w, _, t, _ in todo}):
            never = f"chaos-never-{tag}-{what}"
            got = one(http, what, "-", tenant, never)
            if got is not None:
                obs.cross_baseline[(what, tenant)] = (got.http_status,
                                                      normalized(got.body, never))
        for what, owner, tenant, ident in todo:
            got = one(http, what, owner, tenant, ident)
            if got is not None:
                obs.cross_reads.append(got)
