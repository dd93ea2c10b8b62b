"""Claim before execute: the pure rules that keep a retried request from running a
side-effecting tool twice.

A gateway claims an effect BEFORE it executes the tool; the claim is one conditional
write in the request's facts (the ledger). What the gateway may do next is decided
here, over frozen records, so a storage move never changes it:

* :func:`effect_id_for_claim` - the effect key. It must survive a retry whose model
  regenerated its tool calls (new ``call_id``s), so the call id is NOT in it:
  ``eff_`` + 32 hex of sha256(canonical JSON of
  ``["claim", idempotency_key, subturn_index, tool_name, occurrence]``), where
  ``occurrence`` numbers the calls of that tool in that subturn from 0 (model output
  order). The arguments are deliberately NOT in the key: a retry that asks the same
  slot with other arguments (a reworded e-mail) gets ``CONFLICT`` instead of silently
  running a second, different side effect. The price: a retry that reorders calls of
  one tool with different arguments gets ``CONFLICT``, and one that takes a different
  number of tool rounds gets a new key, and runs the tool again: the first run, unused
  by the promotion, is published for compensation (docs/gateway-protocol.md, section
  8, says how a gateway avoids it).
* :func:`decide_claim` - the state machine of one claim request against the stored
  claim: ``CLAIMED`` (execute now), ``COMPLETED`` (reuse the recorded output),
  ``IN_PROGRESS`` (another live holder; wait), ``LEASE_EXPIRED`` (the holder's lease
  ran out with no recorded outcome: the effect may or may not have happened; the
  policy decides), ``CONFLICT`` (same key, other arguments), ``CANCELLED`` (the request
  was cancelled: no new claims).
* :func:`decide_completion` - who may record the outcome (the holder's token only).
* :func:`result_digest` / :func:`rekey_output` - an output reused by a retry answers a
  call with a new ``call_id``: the same result, re-keyed. Promotion compares results,
  not call ids.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from ratchet.domain.plan import CorruptPartition
from schemas.canonical import canonical_digest, canonical_json, parse_json, sha256_hex
from schemas.models import Item

EFFECT_ID_PATTERN = r"^eff_[0-9a-f]{32}$"
LEASE_MS_MIN = 100
LEASE_MS_MAX = 15 * 60 * 1000
WAIT_MS_MAX = 30_000


class EffectPolicy(StrEnum):
    """What a gateway does with an effect whose previous holder vanished (LEASE_EXPIRED).

    ``at_most_once``: never execute it again; surface the uncertainty (a payment).
    ``at_least_once``: take the claim over and execute again (an idempotent upsert, a
    read, a tool with its own idempotency key)."""

    AT_MOST_ONCE = "at_most_once"
    AT_LEAST_ONCE = "at_least_once"


class ClaimState(StrEnum):
    """The typed answer to a claim."""

    CLAIMED = "CLAIMED"
    COMPLETED = "COMPLETED"
    IN_PROGRESS = "IN_PROGRESS"
    LEASE_EXPIRED = "LEASE_EXPIRED"
    CONFLICT = "CONFLICT"
    CANCELLED = "CANCELLED"
    # Not an answer of ``decide_claim``: the claims API's, before every other answer,
    # when the request already stands promoted (nothing would use a run). Learnt
    # before the claim's write and, for an answer that lets the holder run the tool
    # (CLAIMED, IN_PROGRESS, LEASE_EXPIRED), again after it, from a conditional mark in
    # the request's history partition (``CheckpointStore.mark_claim``).
    PROMOTED = "PROMOTED"


class CompletionState(StrEnum):
    """The typed answer to recording a claim's outcome."""

    COMPLETED = "COMPLETED"  # recorded now
    ALREADY_COMPLETED = "ALREADY_COMPLETED"  # the same outcome was recorded before
    NOT_HOLDER = "NOT_HOLDER"  # the claim is held by another token (taken over)
    OUTCOME_CONFLICT = "OUTCOME_CONFLICT"  # completed before with another output
    UNKNOWN_CLAIM = "UNKNOWN_CLAIM"  # no such claim for this tenant and request


def effect_id_for_claim(idempotency_key: str, subturn_index: int, tool_name: str,
                        occurrence: int) -> str:
    """The effect key of a claimed effect (module docstring: why no call id, no args).
    It is also the ``ToolEffect.effect_id`` of that effect: one id, one dedupe rule."""
    if subturn_index < 0 or occurrence < 0:
        raise ValueError("subturn_index and occurrence count from 0")
    parts = ["claim", idempotency_key, subturn_index, tool_name, occurrence]
    return "eff_" + canonical_digest(parts)[:32]


@dataclass(frozen=True)
class ClaimRequest:
    """One attempt asking to execute one effect. ``token`` is unique per claimant (a
    UUID): a re-sent claim with the same token is the same claimant (idempotent)."""

    tenant_id: str
    idempotency_key: str
    effect_id: str
    attempt: int
    subturn_index: int
    call_id: str
    tool_name: str
    arguments_digest: str
    token: str
    lease_ms: int
    policy: EffectPolicy


@dataclass(frozen=True)
class ClaimRecord:
    """A stored claim. ``completed`` with ``status`` and ``output`` once recorded.
    ``takeovers`` counts how often an expired lease was taken over;
    ``taken_over_call_ids`` are the call ids of the holders it replaced (an output
    answering one is an output of a claim with no outcome unless it carries the
    recorded result), ``previous_attempt`` the attempt the last takeover replaced."""

    tenant_id: str
    idempotency_key: str
    effect_id: str
    attempt: int
    subturn_index: int
    call_id: str
    tool_name: str
    arguments_digest: str
    token: str
    lease_until: int  # epoch millis
    claimed_at: int
    completed: bool | None = False  # None: the row's flag reads null (``claim_damage``)
    status: str | None = None  # succeeded | failed, once completed
    output: Item | None = None
    completed_at: int | None = None
    takeovers: int = 0
    taken_over_call_ids: tuple[str, ...] = ()
    previous_attempt: int | None = None

    @property
    def output_digest(self) -> str | None:
        return None if self.output is None else self.output.content_digest


# The cells every claim row is written with, by what a message calls them; once
# completed, its outcome's too. The claim's identity (subturn, call, tool, arguments
# digest: ``ClaimIn`` requires each) is among them: a row without its call id or tool
# name could not be built into an ``EffectOrphaned`` (a valid turn dead-lettered) and
# one without its digest answered ``CONFLICT`` for arguments it does not hold (an
# outside review of session 53).
_CLAIM_CELLS = (("subturn_index", "subturn index"), ("call_id", "call id"),
                ("tool_name", "tool name"), ("arguments_digest", "arguments digest"),
                ("token", "token"), ("attempt", "attempt"), ("lease_until", "lease"),
                ("claimed_at", "claim time"), ("completed", "completion flag"))
_OUTCOME_CELLS = (("status", "status"), ("output", "output"))


def claim_damage(claim: ClaimRecord) -> str | None:
    """Why a stored claim is damaged (a cell it is always written with reads null),
    or None. Every claim is written whole: its subturn index, call id, tool name and
    arguments digest, a token, an attempt, a lease, its time and a completion flag
    (false), and, completed, a status and an output. Such a row
    answered by the rules says things the row does not hold (``NOT_HOLDER`` for a
    holder nobody can check, ``OUTCOME_CONFLICT`` for an outcome it lost, ``COMPLETED``
    with no output), and a null completion flag differed by backend (memory recorded
    the completion; Cassandra's ``claim_completed = false`` condition never applied:
    503 for ever). The claims API answers it as damage (session 53)."""
    cells = _CLAIM_CELLS + (_OUTCOME_CELLS if claim.completed else ())
    missing = [name for cell, name in cells if getattr(claim, cell) in (None, "")]
    if not missing:
        return None
    return (f"the claim of effect {claim.effect_id} of request {claim.idempotency_key} of "
            f"tenant {claim.tenant_id} is damaged: it names no {' and no '.join(missing)}")


@dataclass(frozen=True)
class Answer:
    """What the gateway is told. ``claim`` is the claim as it stands after the request
    (None only for CANCELLED with no claim); ``wait_ms`` for IN_PROGRESS;
    ``previous_attempt`` when an expired lease was taken over."""

    state: ClaimState
    claim: ClaimRecord | None
    wait_ms: int | None = None
    previous_attempt: int | None = None
    detail: str = ""


@dataclass(frozen=True)
class Insert:
    """Write ``claim`` as a new claim (condition: no claim with this key, not cancelled)."""

    claim: ClaimRecord


@dataclass(frozen=True)
class TakeOver:
    """Replace the expired ``previous`` claim by ``claim`` (condition: the stored claim
    still has ``previous``'s token and lease, is not completed, request not cancelled)."""

    previous: ClaimRecord
    claim: ClaimRecord


Action = Insert | TakeOver | Answer


def new_claim(request: ClaimRequest, now_ms: int) -> ClaimRecord:
    r = request
    return ClaimRecord(r.tenant_id, r.idempotency_key, r.effect_id, r.attempt, r.subturn_index,
                       r.call_id, r.tool_name, r.arguments_digest, r.token,
                       lease_until=now_ms + r.lease_ms, claimed_at=now_ms)


def decide_claim(existing: ClaimRecord | None, request: ClaimRequest, now_ms: int,
                 cancelled: bool) -> Action:
    """The claim state machine; first matching rule wins:

    1. no claim: ``CANCELLED`` if the request is cancelled, else insert (-> CLAIMED);
    2. other arguments under the same key: ``CONFLICT``;
    3. completed: ``COMPLETED`` (reuse the recorded output; also after a cancellation:
       the effect happened, and saying so is never a new execution);
    4. cancelled: ``CANCELLED``;
    5. held by the same token: ``CLAIMED`` again (the claim call itself was re-sent,
       its answer lost: the holder never started). Its lease renewed if it ran out, by
       the takeover's conditional write, so the holder is never told to start on a
       lease that is over while another attempt may take it over; a taker that came
       first wins, and the re-sent call is decided again (``IN_PROGRESS``);
    6. lease live: ``IN_PROGRESS`` with ``wait_ms`` until the lease ends;
    7. lease expired: ``at_least_once`` takes it over (-> CLAIMED, ``previous_attempt``),
       ``at_most_once`` answers ``LEASE_EXPIRED``.
    """
    if existing is None:
        if cancelled:
            return Answer(ClaimState.CANCELLED, None, detail="the request was cancelled")
        return Insert(new_claim(request, now_ms))
    problem = claim_damage(existing)
    if problem is not None:  # no rule can be read off a row missing what it decides on
        raise CorruptPartition(problem)
    if existing.arguments_digest != request.arguments_digest:
        return Answer(ClaimState.CONFLICT, existing, detail=(
            f"effect {existing.effect_id} was claimed with other arguments "
            f"(tool {existing.tool_name}, attempt {existing.attempt})"))
    if existing.completed:
        return Answer(ClaimState.COMPLETED, existing)
    if cancelled:
        return Answer(ClaimState.CANCELLED, existing, detail="the request was cancelled")
    if existing.token == request.token:  # the answer of the call being repeated
        if now_ms < existing.lease_until:
            return Answer(ClaimState.CLAIMED, existing,
                          previous_attempt=existing.previous_attempt)
        renewed = replace(existing, lease_until=now_ms + request.lease_ms, claimed_at=now_ms)
        return TakeOver(existing, renewed)
    if now_ms < existing.lease_until:
        wait = min(existing.lease_until - now_ms, WAIT_MS_MAX)
        return Answer(ClaimState.IN_PROGRESS, existing, wait_ms=wait)
    if request.policy is EffectPolicy.AT_LEAST_ONCE:
        claim = replace(new_claim(request, now_ms), takeovers=existing.takeovers + 1,
                        taken_over_call_ids=(*existing.taken_over_call_ids, existing.call_id),
                        previous_attempt=existing.attempt)
        return TakeOver(existing, claim)
    return Answer(ClaimState.LEASE_EXPIRED, existing, detail=(
        f"attempt {existing.attempt} claimed effect {existing.effect_id} and recorded no "
        "outcome before its lease expired: it may or may not have run"))


def answer_for(action: Insert | TakeOver) -> Answer:
    """The answer once ``action``'s conditional write applied."""
    if isinstance(action, TakeOver):
        if action.claim.token == action.previous.token:  # a lease renewed (rule 5)
            return Answer(ClaimState.CLAIMED, action.claim,
                          previous_attempt=action.claim.previous_attempt)
        return Answer(ClaimState.CLAIMED, action.claim, previous_attempt=action.previous.attempt)
    return Answer(ClaimState.CLAIMED, action.claim)


def decide_completion(existing: ClaimRecord | None, token: str, status: str,
                      output: Item) -> CompletionState | None:
    """None: the holder may record now (condition: token still holds, not completed).
    A completion again by the holder is ``ALREADY_COMPLETED`` only with the same outcome
    (status and output), else ``OUTCOME_CONFLICT``: a recorded outcome never changes."""
    if existing is None:
        return CompletionState.UNKNOWN_CLAIM
    if existing.completed:
        if (existing.token == token and existing.status == status
                and existing.output_digest == output.content_digest):
            return CompletionState.ALREADY_COMPLETED
        return CompletionState.OUTCOME_CONFLICT if existing.token == token \
            else CompletionState.NOT_HOLDER
    if existing.token != token:
        return CompletionState.NOT_HOLDER
    return None


def completed(claim: ClaimRecord, status: str, output: Item, now_ms: int) -> ClaimRecord:
    return replace(claim, completed=True, status=status, output=output, completed_at=now_ms)


# --- outputs: the same result under a regenerated call id --------------------------------

_KEYING_FIELDS = ("id", "call_id")


def result_digest(item: Item) -> str:
    """sha256 of the output item's canonical content without its ``id`` and ``call_id``:
    what the tool returned, independent of which regenerated call it answers. Raises
    ``ValueError`` for content that is not a JSON object with a canonical form (e.g. a
    number beyond a double's range: ``parse_json``)."""
    content = parse_json(item.content)
    if not isinstance(content, dict):
        raise ValueError(f"output {item.item_id}: content is not a JSON object")
    return canonical_digest({k: v for k, v in content.items() if k not in _KEYING_FIELDS})


def rekey_output(output: Item, *, call_id: str, item_id: str) -> Item:
    """The recorded ``output`` answering another call: same result, new ids (for an
    ``mcp_call``, whose id names the run, the item id is the call's). Raises
    ``ValueError`` naming the output when its content is not a JSON object with a
    canonical form (the claims API refuses to record one; a record older than that
    check may hold one, e.g. ``1e400``)."""
    try:
        content = parse_json(output.content)
        if not isinstance(content, dict):
            raise ValueError("not a JSON object")
        content["id"] = item_id
        if "call_id" in content:
            content["call_id"] = call_id
        data = canonical_json(content)
    except ValueError as exc:
        raise ValueError(f"output {output.item_id}: content cannot be re-keyed: {exc}") from exc
    return Item(item_id=item_id, type=output.type, role=output.role,
                call_id=call_id if output.call_id is not None else None, content=data,
                content_digest=sha256_hex(data), format_version=output.format_version)


def output_to_json(item: Item) -> str:
    """A stored claim output: the item's fields, content as its canonical JSON text."""
    return canonical_json({
        "item_id": item.item_id, "type": item.type, "role": item.role,
        "call_id": item.call_id, "content": item.content.decode("utf-8"),
        "content_digest": item.content_digest, "format_version": item.format_version,
    }).decode("utf-8")


def output_from_json(text: str) -> Item:
    fields = parse_json(text.encode("utf-8"))
    item = Item(item_id=fields["item_id"], type=fields["type"], role=fields["role"],
                call_id=fields["call_id"], content=fields["content"].encode("utf-8"),
                content_digest=fields["content_digest"],
                format_version=fields["format_version"])
    if not item.digest_ok():
        raise ValueError(f"stored claim output {item.item_id}: digest mismatch")
    return item
