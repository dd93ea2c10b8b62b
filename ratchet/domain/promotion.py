"""The promotion decision of CONTRACT section 4, as pure functions over frozen records.

The processor (``streams/processor.py``) reads facts, calls these functions, writes
and publishes; every rule lives here so a reader finds them in one place:

1. :func:`decide_turn` - may this ``TurnCompleted`` be promoted at all, and as what?
   Checks, first broken rule wins: conversation owned by another tenant
   (``TENANT_MISMATCH``), a ``TurnCancelled`` already seen for its idempotency key
   (``CANCELLED``), the event's own validation (status, items, fingerprint, proof
   ...), the tool-effect ledger and the effect claims (``DUPLICATE_TOOL_EFFECT``,
   ``MISSING_TOOL_EFFECT``, recorded outputs: one rule, :func:`_effects_rule`). Pairing across the existing history is part of the event's
   validation (:func:`validate` continues the stored history's pairing state).
   Result: a ``Promote`` carrying the store request, or a ``Reject``.
2. :func:`interpret` - turn the store's compare-and-set outcome into the verdict:
   ``Promoted`` -> accepted; ``Duplicate`` -> the original outcome again (same
   response) or ``DUPLICATE``; ``KeyReused`` -> ``IDEMPOTENCY_KEY_REUSED``;
   ``Conflict``, ``ResponseExists``, ``ResponseClaimed`` (the response id is bound to
   another request, maybe in another partition) -> ``CONFLICT``; ``AheadOfHead`` -> ``OUT_OF_ORDER``;
   ``ParentMissing`` -> ``PARENT_NOT_PROMOTED`` or ``TENANT_MISMATCH`` (parent owned
   by another tenant).
3. :func:`orphaned_effects` - which recorded tool effects must be published as
   ``EffectOrphaned`` for compensation once the verdict is known.

Subturn (ephemeral) artifacts are never promoted: the store request carries only
the turn's outer ``token_artifact``, and only for a certified turn.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from ratchet.domain.catalogue import EFFECT_OUTPUT_TYPES, effect_key
from ratchet.domain.claims import ClaimRecord, claim_damage, result_digest
from ratchet.domain.history import (
    FIRST_MS,
    LAST_MS,
    CheckpointRecord,
    PromotionMode,
    StoredTokenArtifact,
)
from ratchet.domain.plan import (
    AheadOfHead,
    Conflict,
    Duplicate,
    KeyReused,
    ParentMissing,
    Promoted,
    PromotionOutcome,
    PromotionRequest,
    ResponseClaimed,
    ResponseExists,
    TooLarge,
)
from ratchet.domain.validation import (
    OffLineage,
    PairingState,
    Rejected,
    Unpaired,
    Validation,
    pairing_state_of,
    validate_off_lineage,
    validate_turn,
)
from schemas.canonical import canonical_json_text
from schemas.keys import partition_key
from schemas.models import (
    BoundaryProof,
    Certification,
    Item,
    OrphanReason,
    RejectionReason,
    RouterReceipt,
    TurnCompleted,
)

R = RejectionReason


# --- inputs and results ----------------------------------------------------------------


@dataclass(frozen=True)
class RecordedEffect:
    """One tool effect as first recorded (later duplicates never change it)."""

    tenant_id: str
    idempotency_key: str
    effect_id: str
    attempt: int
    subturn_index: int
    call_id: str
    tool_name: str
    arguments_digest: str
    status: str  # succeeded | failed
    output_item_id: str
    output_digest: str
    executed_at: int  # epoch millis
    # True once a second record with a different output digest was seen: the effect
    # can no longer be trusted and any turn that uses it is DUPLICATE_TOOL_EFFECT.
    conflicted: bool = False
    # The request scope it was recorded in (``schemas.keys.request_scope``): a fact of
    # the request of its key in that Conversation (or the tenant's chains) only. None: recorded before
    # scopes, a fact of every request of its key.
    scope: str | None = None



@dataclass(frozen=True)
class Facts:
    """What the processor read before deciding on one ``TurnCompleted``.

    ``effects``: every tool effect recorded for the turn's (tenant, idempotency key),
    by effect_id. ``conversation_owner``: the tenant that owns the conversation
    (None in chain mode or for a new conversation).
    """

    cancelled: bool = False
    # Why a cancellation's order against the request's promotion cannot be told
    # (damaged rows): ``CORRUPT`` where ``CANCELLED`` would claim it was never promoted.
    cancellation_unsettled: str | None = None
    effects: Mapping[str, RecordedEffect] = None  # type: ignore[assignment]
    conversation_owner: str | None = None
    # The request's effect claims by effect_id (claim before execute, claims.py).
    claims: Mapping[str, ClaimRecord] = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.effects is None:
            object.__setattr__(self, "effects", {})
        if self.claims is None:
            object.__setattr__(self, "claims", {})


@dataclass(frozen=True)
class ValidationVerdict:
    """The part of ``validate_turn``'s answer the decision needs (see ``from_validation``)."""

    certification: Certification | None  # None when rejected
    reason: RejectionReason | None = None
    detail: str = ""
    # The pairing state of the lineage AFTER this turn (None when rejected): what the
    # next turn extending it continues from (the processor's tail cache keeps it).
    pairing: PairingState | None = None
    # The token artifact (with proof and receipt) is promoted with the turn.
    artifact_reusable: bool = False

    @classmethod
    def from_validation(cls, result: Validation) -> ValidationVerdict:
        if isinstance(result, Rejected):
            return cls(None, result.reason, result.detail)
        return cls(result.certification, pairing=result.pairing,
                   artifact_reusable=result.artifact_reusable)


def validate(turn: TurnCompleted, now_ms: int, history: Sequence[Item]) -> ValidationVerdict:
    """``validate_turn`` continuing the pairing state of ``history`` (the turn's lineage)."""
    return validate_after(turn, now_ms, pairing_state_of(history))


def validate_after(turn: TurnCompleted, now_ms: int,
                   prior: PairingState | Unpaired) -> ValidationVerdict:
    """``validate_turn`` continuing ``prior``, the pairing state of the turn's lineage
    (``pairing_state_of`` its items, or a remembered state of the same lineage).

    A stored history whose own pairing is broken cannot be extended safely: the turn
    is ``UNPAIRED_TOOL_CALL`` too (the rehydration service reports the history).
    """
    if isinstance(prior, Unpaired):
        return ValidationVerdict(None, R.UNPAIRED_TOOL_CALL, f"stored history: {prior.detail}")
    return ValidationVerdict.from_validation(validate_turn(turn, now_ms, prior=prior))


@dataclass(frozen=True)
class Promote:
    """The turn may be promoted: hand ``request`` to the checkpoint store."""

    request: PromotionRequest


@dataclass(frozen=True)
class Reject:
    """The turn is not promoted, for ``reason``; published as ``PromotionRejected``.
    ``detail`` is cut to ``MAX_DETAIL_CHARS``: it quotes the turn's own values (an item
    type of 9 MiB of control characters, quoted, made a 36 MiB detail, a decision write
    Cassandra refused for ever: the partition stopped; an outside review, session 26)."""

    reason: RejectionReason
    detail: str
    head_seq: int | None = None
    existing_response_id: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "detail", bounded_detail(self.detail))


# The most characters of a rejection's (or orphan's) detail: enough for any message of
# the rules with the ids they name, far from Cassandra's and Kafka's request limits.
MAX_DETAIL_CHARS = 2_000


def bounded_detail(detail: str) -> str:
    """``detail`` itself, or its start and how much was cut."""
    if len(detail) <= MAX_DETAIL_CHARS:
        return detail
    return f"{detail[:MAX_DETAIL_CHARS - 40]}... ({len(detail) - MAX_DETAIL_CHARS + 40} characters cut)"


@dataclass(frozen=True)
class Accepted:
    """The turn is promoted; ``replayed`` when the store already held it (redelivery)."""

    checkpoint: CheckpointRecord
    replayed: bool = False


Verdict = Accepted | Reject


@dataclass(frozen=True)
class Orphan:
    effect: RecordedEffect
    reason: OrphanReason
    rejection_reason: RejectionReason | None = None
    detail: str = ""
    # False for a claim whose holder never recorded an outcome: it may or may not have run.
    completed: bool = True
    # A recorded run its effect id's reference output displaced (its claim was completed
    # with another output): published beside the effect id's own orphan, under an
    # outcome id of its own.
    displaced: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "detail", bounded_detail(self.detail))


# --- 1. may the turn be promoted? ------------------------------------------------------


def decide_turn(turn: TurnCompleted, validation: ValidationVerdict, facts: Facts, *,
                used: tuple[str, ...] | None = None, key: str | None = None
                ) -> Promote | Reject:
    """Every pre-write rule of contract section 4; the store decides ordering after.

    ``used`` and ``key``: the turn's ``used_effect_ids`` and ``partition_key`` when the
    caller computed them already (the loop path does, to choose its path); else they
    are computed here, once for the rules and the request."""
    if used is None:
        used = used_effect_ids(turn)
    rejection = _first_rejection(turn, validation, facts, used)
    if rejection is not None:
        return rejection
    assert validation.certification is not None
    carried = (carried_effect_ids(turn, facts.effects.values(), facts.claims.values())
               if facts.effects or facts.claims else ())  # none recorded: none carried
    return Promote(promotion_request(turn, validation.certification,
                                     validation.artifact_reusable, carried,
                                     used=used, key=key))


@dataclass(frozen=True)
class JudgeOnly:
    """A turn that passed every pre-write rule it was checked by, but that cannot be
    written where it was sent: ``request`` is for the store's judgement (the write's
    answer, ``CheckpointStore.judge``), never written."""

    request: PromotionRequest


def decide_off_lineage(turn: TurnCompleted, now_ms: int, facts: Facts) -> JudgeOnly | Reject:
    """``decide_turn`` for a Conversation turn whose expected head is not the current
    head: every pre-write rule but pairing (``validate_off_lineage``: the turn continues
    no stored history), then the write's answer (the request standing promoted, the
    response id bound, else ``CONFLICT`` / ``OUT_OF_ORDER``); never promoted from here."""
    checked = validate_off_lineage(turn, now_ms)
    validation = (ValidationVerdict(None, checked.reason, checked.detail)
                  if isinstance(checked, Rejected) else ValidationVerdict(None))
    rejection = _first_rejection(turn, validation, facts, used_effect_ids(turn))
    if rejection is not None:
        return rejection
    assert isinstance(checked, OffLineage)
    # The request as it would be written (its size counts the artifact a certified
    # turn carries), judged only.
    return JudgeOnly(promotion_request(turn, checked.certification, checked.artifact_reusable))


def _first_rejection(turn: TurnCompleted, validation: ValidationVerdict,
                     facts: Facts, used: tuple[str, ...]) -> Reject | None:
    for check in (_tenant_rule, _cancel_rule, _validation_rule):
        rejection = check(turn, validation, facts)
        if rejection is not None:
            return rejection
    rejection = _damaged_claims_rule(facts) or _effects_rule(turn, facts, used)
    if rejection is not None:
        return rejection
    unreadable = _unreadable_timestamp(turn)  # before ``_utc_ms`` could raise on one
    return None if unreadable is None else Reject(R.CORRUPT, unreadable)


def damaged_claim(claims: Iterable[ClaimRecord]) -> str | None:
    """Why one of a request's effect claims is damaged (``claims.claim_damage``: a cell
    every claim row is written with reads null), or None. The processor reads such a
    row as the claims API does (session 53's outside review): as damage, never by the
    cell (a null completion flag read "not completed": the turn carrying the recorded
    result was ``MISSING_TOOL_EFFECT`` and its run published for compensation)."""
    return next((p for p in map(claim_damage, claims) if p is not None), None)


def _damaged_claims_rule(facts: Facts) -> Reject | None:
    """Every turn of a request with a damaged effect claim is ``CORRUPT``: the effect
    rules and the request's orphans are read off its claims, and what the row lost
    cannot be known (the partition needs an operator)."""
    problem = damaged_claim(facts.claims.values())
    if problem is None:
        return None
    return Reject(R.CORRUPT, f"stored partition is corrupt: {problem}")


def _unreadable_timestamp(turn: TurnCompleted) -> str | None:
    """Why a timestamp of the turn lies outside years 1 to 9999, or None. The Avro
    decoder dead-letters such a record; a turn that reached the rules another way is
    refused here, whichever of its timestamps it is (docs/gateway-protocol.md, section 6)."""
    stamps = {"produced_at": turn.produced_at, "expires_at": turn.expires_at}
    for name, record in (("token_artifact", turn.token_artifact),
                         ("boundary_proof", turn.boundary_proof),
                         ("router_receipt", turn.router_receipt)):
        if record is not None:
            stamps[f"{name}.expires_at"] = record.expires_at
    for name, value in stamps.items():
        if value is not None and not FIRST_MS <= value <= LAST_MS:
            return f"{name} {value} ms is outside the readable range (years 1 to 9999)"
    return None


def _tenant_rule(turn: TurnCompleted, _v: ValidationVerdict, facts: Facts) -> Reject | None:
    owner = facts.conversation_owner
    if owner is not None and owner != turn.tenant_id:
        return Reject(R.TENANT_MISMATCH, f"conversation {turn.conversation_id} belongs to "
                      "another tenant")
    return None


def _cancel_rule(turn: TurnCompleted, _v: ValidationVerdict, facts: Facts) -> Reject | None:
    if facts.cancelled and facts.cancellation_unsettled is not None:
        return Reject(R.CORRUPT, f"request {turn.idempotency_key} was cancelled, and whether "
                      "before its promotion cannot be told: stored partition is corrupt: "
                      f"{facts.cancellation_unsettled}")
    if facts.cancelled:
        return Reject(R.CANCELLED, f"request {turn.idempotency_key} was cancelled before "
                      "its completion was processed")
    return None


def _validation_rule(turn: TurnCompleted, v: ValidationVerdict, _f: Facts) -> Reject | None:
    if v.reason is not None:
        return Reject(v.reason, v.detail)
    return None


def used_effect_ids(turn: TurnCompleted) -> tuple[str, ...]:
    """Effect ids the turn relies on: ``tool_effect_ids`` plus every subturn's ids."""
    ids = list(turn.tool_effect_ids)
    seen = set(ids)  # a set: 120 000 subturns took minutes with a list (session 26)
    for subturn in turn.subturns:
        for effect_id in subturn.effect_ids:
            if effect_id not in seen:
                seen.add(effect_id)
                ids.append(effect_id)
    return tuple(ids)


def _effects_rule(turn: TurnCompleted, facts: Facts, used: tuple[str, ...]) -> Reject | None:
    """Every used effect (``used``: the turn's ``used_effect_ids``) recorded,
    unconflicted, and matching the turn's outputs; the ONE rule for effects recorded
    after the fact (``ToolEffect``, deduplicated by ``effect_id``) and effects claimed
    before execution (same ``effect_id``).

    * a claimed effect must be completed, and the turn must carry its recorded result
      (``claims.result_digest``: the output without its ids, so a retry whose calls
      got new call ids reuses it); a ``ToolEffect`` of the same id must agree;
    * an unclaimed effect must be recorded; the turn's item that answers it is found
      among the executed-output types of the catalogue (any call type's output, or an
      ``mcp_call``) by its effect key; equal digests mean equal bytes;
    * no output of the turn may answer a call of this request whose claim has no
      recorded outcome (a turn only carries outputs of completed claims);
    * an output answering the call of an effect recorded for the request that the turn
      does not list must still be that effect's recorded output (CONTRACT 4: the
      turn's outputs match the recorded ones): another one means the tool ran again.

    An ``mcp_call``'s key is its item id, a call output's its call id: two items of
    the turn may share one key (separate namespaces), so an effect is answered when any
    item under its key carries its digest.
    """
    outputs = [i for i in turn.items if i.type in EFFECT_OUTPUT_TYPES]
    outputs_by_call: dict[str | None, list[Item]] = {}
    for item in outputs:
        outputs_by_call.setdefault(effect_key(item), []).append(item)
    results = _Results(outputs)
    for effect_id in used:
        effect = facts.effects.get(effect_id)
        claim = facts.claims.get(effect_id)
        if effect is not None and effect.conflicted:
            return Reject(R.DUPLICATE_TOOL_EFFECT, f"tool effect {effect_id} was recorded "
                          "twice with different outputs")
        if claim is not None:
            rejection = _claimed_effect_rule(turn, claim, effect, results, outputs_by_call)
            if rejection is not None:
                return rejection
            continue
        if effect is None:
            return Reject(R.MISSING_TOOL_EFFECT, f"tool effect {effect_id} is not recorded "
                          f"for request {turn.idempotency_key}")
        other = _other_answer(effect, outputs_by_call)
        if other is not None:
            return Reject(R.DUPLICATE_TOOL_EFFECT, f"{other.type} for call "
                          f"{effect.call_id} differs from recorded effect {effect_id}")
    listed = set(used)
    for claim in facts.claims.values():
        if not claim.completed and claim.call_id in outputs_by_call:
            return Reject(R.MISSING_TOOL_EFFECT, f"output for call {claim.call_id} but its "
                          f"claim {claim.effect_id} has no recorded outcome")
        if claim.effect_id not in listed and claim.call_id in outputs_by_call \
                and not _carries_claim_result(claim, outputs_by_call, results):
            return Reject(R.DUPLICATE_TOOL_EFFECT, f"{outputs_by_call[claim.call_id][0].type} "
                          f"for call {claim.call_id} differs from the recorded outcome of "
                          f"claimed effect {claim.effect_id} (not listed by the turn): the "
                          "tool ran again")
        stale = _stale_holders_output(claim, outputs_by_call, results)
        if stale is not None:
            return Reject(R.MISSING_TOOL_EFFECT, f"output for call {stale}, whose claim "
                          f"{claim.effect_id} was taken over: it is not the claim's "
                          "recorded outcome")
    for effect in facts.effects.values():
        if effect.effect_id in listed or effect.call_id not in outputs_by_call:
            continue
        other = _other_answer(effect, outputs_by_call)
        if other is None and effect.conflicted:  # recorded twice: no output is trusted
            other = outputs_by_call[effect.call_id][0]
        if other is not None:
            return Reject(R.DUPLICATE_TOOL_EFFECT, f"{other.type} for call {effect.call_id} "
                          f"differs from effect {effect.effect_id} recorded for request "
                          f"{turn.idempotency_key} (not listed by the turn)")
    return None


class _Results:
    """Each output's result digest (``claims.result_digest``; None without a canonical
    form), computed once per decision. Each claim compared its result with the outputs
    again, parsing each output once per claim: a turn answering 2 000 claims took 26 s
    (a review, session 34)."""

    def __init__(self, outputs: Iterable[Item] = ()) -> None:
        self._outputs = list(outputs)
        self._of: dict[int, str | None] = {}  # by id(): the items outlive the decision
        self._all: set[str | None] | None = None

    def of(self, item: Item) -> str | None:
        key = id(item)
        if key not in self._of:
            self._of[key] = _result_or_none(item)
        return self._of[key]

    def any_output_is(self, wanted: str) -> bool:
        """Whether any of the turn's outputs carries the result ``wanted``."""
        if self._all is None:
            self._all = {self.of(o) for o in self._outputs}
        return wanted in self._all


def _carries_claim_result(claim: ClaimRecord,
                          outputs_by_call: dict[str | None, list[Item]],
                          results: _Results) -> bool:
    """Whether an output answering the claim's call is its recorded result (ids
    aside, as for a listed claim). A claim without a recorded outcome, or whose outcome
    has no canonical form, is carried by nothing."""
    wanted = _claim_result(claim)
    return wanted is not None and any(
        results.of(o) == wanted for o in outputs_by_call.get(claim.call_id, ()))


def _claim_result(claim: ClaimRecord) -> str | None:
    """The digest of the claim's recorded result, ids aside; None when it has no
    recorded outcome, or one without a canonical form."""
    if not claim.completed or claim.output is None:
        return None
    try:
        return result_digest(claim.output)
    except (ValueError, TypeError, RecursionError):
        return None


def carried_effect_ids(turn: TurnCompleted, effects: Iterable[RecordedEffect],
                       claims: Iterable[ClaimRecord]) -> set[str]:
    """Effects of the request the turn does not list but whose recorded output it
    carries (an item under the effect's key with its digest; a claim's result, ids
    aside): the promoted history holds them, so they are used like listed ones and never
    orphaned (docs/gateway-protocol.md, section 6, ``tool_effect_ids``)."""
    return carried_by_items(turn.items, used_effect_ids(turn), effects, claims)


def carried_by_items(items: Iterable[Item], listed: Iterable[str],
                     effects: Iterable[RecordedEffect],
                     claims: Iterable[ClaimRecord], *, stored: bool = False) -> set[str]:
    """``carried_effect_ids`` for any turn's ``items`` (the event's, or a stored
    promotion's, for effects recorded after it) and the effect ids it ``listed``.

    A conflicted effect is carried by no turn still to be decided (every turn carrying
    it is refused). A ``stored`` promotion was decided before the conflict: it carries
    a conflicted effect whose reference output (the one recorded first) its items
    hold, and that execution is in the history. Counted unused, it was published
    ``ATTEMPT_SUPERSEDED`` (or ``EFFECT_CONFLICT`` under that output) once a later
    attempt re-ran the tool: compensators undid the run the model saw (an outside
    review, session 38). The re-run itself is published ``EFFECT_CONFLICT`` under its
    own output when it is recorded (``RequestFacts._conflict_orphan``)."""
    effects, claims = list(effects), list(claims)
    if not effects and not claims:
        return set()  # the common turn: no effect recorded for its request
    listed = set(listed)
    # A call the turn answers with a listed effect is that effect's: another effect of
    # the same call (a re-run of the tool by another attempt or subturn) with the same
    # output is a second execution, not carried (an outside review, session 26).
    answered = ({e.call_id for e in effects if e.effect_id in listed}
                | {c.call_id for c in claims if c.effect_id in listed})
    outputs_by_call: dict[str | None, list[Item]] = {}
    for item in items:
        if item.type in EFFECT_OUTPUT_TYPES and effect_key(item) not in answered:
            outputs_by_call.setdefault(effect_key(item), []).append(item)
    carried = {e.effect_id for e in effects
               if e.effect_id not in listed and (stored or not e.conflicted)
               and any(a.content_digest == e.output_digest
                       for a in outputs_by_call.get(e.call_id, ()))}
    results = _Results()
    carried |= {c.effect_id for c in claims if c.effect_id not in listed
                and _carries_claim_result(c, outputs_by_call, results)}
    return carried


def needs_promoted_items(promoted: CheckpointRecord, effect_ids: Iterable[str]) -> bool:
    """Whether orphaning ``effect_ids`` against the stored promotion ``promoted`` needs
    its items: an effect it does not list as used may have been recorded after it, and
    its output still be in the promoted turn (``orphaned_effects``,
    ``promoted_items``). False when the checkpoint does not say which it used (nothing
    is orphaned then) or uses them all (the common case: no read)."""
    used = promoted.accepted_effect_ids
    return used is not None and not set(effect_ids) <= set(used)


def _stale_holders_output(claim: ClaimRecord,
                          outputs_by_call: dict[str | None, list[Item]],
                          results: _Results) -> str | None:
    """The call id of a holder the claim's takeovers replaced that the turn answers
    with something else than the claim's recorded result (none yet, or another): that
    holder's run has no outcome. A retry whose call kept that id and carries the
    recorded result is fine."""
    for call_id in claim.taken_over_call_ids:
        answers = outputs_by_call.get(call_id)
        if not answers or call_id == claim.call_id:
            continue
        wanted = _claim_result(claim)
        if wanted is None or all(results.of(a) != wanted for a in answers):
            return call_id
    return None


def _other_answer(effect: RecordedEffect,
                  outputs_by_call: dict[str | None, list[Item]]) -> Item | None:
    """The turn's answer to the effect's call when no item under its key is the
    effect's recorded output; None when the call is unanswered or answered by it."""
    answers = outputs_by_call.get(effect.call_id, ())
    if any(a.content_digest == effect.output_digest for a in answers):
        return None
    return answers[0] if answers else None


def _claimed_effect_rule(turn: TurnCompleted, claim: ClaimRecord,
                         effect: RecordedEffect | None, results: _Results,
                         outputs_by_call: dict[str | None, list[Item]]) -> Reject | None:
    """A claimed effect: completed; a ``ToolEffect`` of its id records the same output
    (the same execution recorded twice); and the turn carries its result. The output
    answering the claim's own call must be that result (two claims' results swapped
    between their calls are refused); only when no output answers that call (a retry
    whose calls got new call ids) may any output carry it. A recorded output whose
    result cannot be digested (no canonical form, e.g. ``1e400`` recorded before the
    claims API refused it) equals no output: a typed rejection, never an exception
    (which would dead-letter a decodable turn)."""
    if not claim.completed or claim.output is None:
        return Reject(R.MISSING_TOOL_EFFECT, f"claimed effect {claim.effect_id} (attempt "
                      f"{claim.attempt}) has no recorded outcome")
    if effect is not None and effect.output_digest != claim.output.content_digest:
        return Reject(R.DUPLICATE_TOOL_EFFECT, f"tool effect {claim.effect_id} was recorded "
                      "with another output than its claim's completion")
    try:
        wanted = result_digest(claim.output)
    except (ValueError, TypeError, RecursionError) as exc:
        return Reject(R.DUPLICATE_TOOL_EFFECT, f"the recorded outcome of claimed effect "
                      f"{claim.effect_id} has no canonical form ({exc}): no output of the "
                      "turn can equal it")
    own = outputs_by_call.get(claim.call_id)
    if own:
        if all(results.of(o) != wanted for o in own):
            return Reject(R.DUPLICATE_TOOL_EFFECT, f"{own[0].type} for call {claim.call_id} "
                          f"differs from the recorded outcome of claimed effect "
                          f"{claim.effect_id}")
        return None
    if not results.any_output_is(wanted):
        return Reject(R.DUPLICATE_TOOL_EFFECT, f"turn carries no output equal to the "
                      f"recorded outcome of claimed effect {claim.effect_id} for request "
                      f"{turn.idempotency_key}")
    return None


def _result_or_none(item: Item) -> str | None:
    try:
        return result_digest(item)
    except ValueError:
        return None  # validation rejects such content before this rule is reached


# --- the store request --------------------------------------------------------------------


def promotion_request(turn: TurnCompleted, certification: Certification,
                      artifact_reusable: bool = True,
                      carried: Iterable[str] = (), *,
                      used: tuple[str, ...] | None = None,
                      key: str | None = None) -> PromotionRequest:
    """The store request for a turn: its new items and the outer checkpoint metadata.
    The artifact, receipt and proof travel only with a certified turn whose artifact is
    reusable (``artifact_reusable``); a certified turn without one falls back
    ``NO_ARTIFACT`` on reads. The checkpoint keeps the effects the turn uses: those it
    lists, then those it ``carried`` without listing (``carried_effect_ids``).
    ``used`` and ``key``: the turn's ``used_effect_ids`` and ``partition_key`` if the
    caller has them (``decide_turn``), else computed here."""
    certified = certification is Certification.CERTIFIED and artifact_reusable
    conversation = turn.conversation_id is not None
    return PromotionRequest(
        tenant_id=turn.tenant_id,
        partition_key=partition_key(turn) if key is None else key,
        mode=PromotionMode.CONVERSATION if conversation else PromotionMode.CHAIN,
        response_id=turn.response_id,
        idempotency_key=turn.idempotency_key,
        request_digest=turn.request_digest,
        items=turn.items,
        certification=certification,
        fingerprint_hash=turn.fingerprint_hash,
        previous_response_id=turn.previous_response_id,
        expected_head_seq=turn.expected_head_seq if conversation else None,
        token_artifact=_store_artifact(turn) if certified else None,
        router_receipt=_json_or_none(turn.router_receipt) if certified else None,
        boundary_proof=_json_or_none(turn.boundary_proof) if certified else None,
        expires_at=None if turn.expires_at is None else _utc_ms(turn.expires_at),
        attempt=turn.attempt,
        effect_ids=_with_carried(used_effect_ids(turn) if used is None else used, carried),
    )


def _with_carried(used: tuple[str, ...], carried: Iterable[str]) -> tuple[str, ...]:
    return (*used, *sorted(set(carried) - set(used)))


def _utc_ms(epoch_ms: int) -> datetime:
    """``epoch_ms`` as an aware UTC datetime, exact to the millisecond: integer seconds
    and milliseconds (a float division loses the millisecond from ~1e13 ms, year 2286,
    on). Raises ``ValueError`` outside datetime's range, 0001-01-01T00:00:00.000Z to
    9999-12-31T23:59:59.999Z (docs/gateway-protocol.md, section 6)."""
    seconds, millis = divmod(epoch_ms, 1000)
    try:
        return datetime.fromtimestamp(seconds, UTC).replace(microsecond=millis * 1000)
    except (ValueError, OverflowError, OSError) as exc:
        raise ValueError(f"timestamp {epoch_ms} ms is outside the readable range "
                         "(years 1 to 9999)") from exc


def _store_artifact(turn: TurnCompleted) -> StoredTokenArtifact | None:
    art = turn.token_artifact
    if art is None:
        return None
    return StoredTokenArtifact(
        artifact_id=art.artifact_id,
        token_hash=art.token_hash,
        token_count=art.token_count,
        safe_append_boundary=art.safe_append_boundary,
        fingerprint_hash=art.fingerprint_hash,
        expires_at=_utc_ms(art.expires_at),
    )


def _json_or_none(record: RouterReceipt | BoundaryProof | None) -> str | None:
    """The record's canonical JSON. Both models hold ``str`` and ``int`` fields alone
    (``EpochMillis`` is an ``int``; pinned by ``test_promotion_request_json``), so the
    field values pydantic keeps in ``__dict__`` are already what ``model_dump(mode=
    "json")`` would return: one certified turn's proof ~1.2 against ~2.9 us. A new
    field of another type fails that test (a nested model or a datetime would also
    make ``canonical_json``'s ``json.dumps`` raise). Only for exactly these two models:
    a turn keeps a subclass instance as given (pydantic does not revalidate it), and a
    subclass's computed fields, field serializers and excluded fields are in its dump,
    not its ``__dict__`` (an outside review, session 50): it takes the dump."""
    if record is None:
        return None
    if record.__class__ in _FLAT_MODELS:
        return canonical_json_text(record.__dict__)
    return canonical_json_text(record.model_dump(mode="json"))


# The models ``_json_or_none`` writes from ``__dict__`` (their exact types).
_FLAT_MODELS = frozenset({RouterReceipt, BoundaryProof})


# --- 2. what the store said ----------------------------------------------------------------


def interpret(turn: TurnCompleted, outcome: PromotionOutcome,
              parent_owner: str | None = None) -> Verdict:
    """Map the store's outcome to the verdict published for this turn.

    ``parent_owner`` is the tenant that promoted ``previous_response_id`` (looked up
    only after ``ParentMissing``): another tenant's parent is ``TENANT_MISMATCH``,
    never a hint that the id exists.
    """
    match outcome:
        case Promoted(checkpoint=cp):
            return Accepted(cp)
        case Duplicate(original=cp) if cp.response_id == turn.response_id:
            return Accepted(cp, replayed=True)
        case Duplicate(original=cp):
            return Reject(R.DUPLICATE, f"already promoted as {cp.response_id} at seq {cp.seq}",
                          head_seq=cp.seq, existing_response_id=cp.response_id)
        case ResponseExists(original=cp):
            # Another request already owns this response id: never rebind it (CONTRACT 4).
            # ``existing_response_id`` names the bound id (the turn's own): what tells
            # this CONFLICT from the head's, which a resend at the current head answers.
            return Reject(R.CONFLICT, f"response id {cp.response_id} is already bound to "
                          f"request {cp.idempotency_key} at seq {cp.seq}", head_seq=cp.seq,
                          existing_response_id=cp.response_id)
        case ResponseClaimed(holder=claim):
            # A claim with a null cell decides by its intact ones (``check_claim``): the
            # answer names what the row holds, never "None" (a null partition printed
            # "in None" until session 52's second outside review).
            bound = (f"request {claim.idempotency_key}" if claim.idempotency_key
                     else "another request")
            where = (f"in {claim.partition_key}" if claim.partition_key
                     else "(its claim names no partition)")
            return Reject(R.CONFLICT, f"response id {claim.response_id} is already bound to "
                          f"{bound} {where}", existing_response_id=claim.response_id)
        case KeyReused(original_response_id=rid):
            return Reject(R.IDEMPOTENCY_KEY_REUSED, f"idempotency key {turn.idempotency_key} "
                          f"already promoted a different request ({rid})",
                          existing_response_id=rid)
        case Conflict(current_head_seq=head):
            return Reject(R.CONFLICT, f"expected head {turn.expected_head_seq}, head is {head}",
                          head_seq=head)
        case AheadOfHead(current_head_seq=head):
            return Reject(R.OUT_OF_ORDER, f"expected head {turn.expected_head_seq} is ahead "
                          f"of head {head}", head_seq=head)
        case ParentMissing(previous_response_id=parent):
            if parent_owner is not None and parent_owner != turn.tenant_id:
                return Reject(R.TENANT_MISMATCH, f"previous response {parent} belongs to "
                              "another tenant")
            return Reject(R.PARENT_NOT_PROMOTED, f"previous response {parent} is not promoted")
        case TooLarge(size=size, limit=limit):
            # No reason code says "too large"; the turn cannot be stored in this format.
            return Reject(R.UNSUPPORTED_FORMAT, f"turn of {size} bytes exceeds the "
                          f"{limit}-byte atomic write limit")
    raise TypeError(f"unknown store outcome {outcome!r}")


# --- 3. effects to compensate ---------------------------------------------------------------


def _accepted_effect_ids(turn: TurnCompleted, verdict: Accepted) -> set[str] | None:
    """The effects the promoted turn used. This turn's own, unless the store held the
    promotion already (``replayed``): then the turn is a redelivery or another attempt
    of the request, and what counts is the turn that WAS promoted, whose effects its
    checkpoint keeps. None if it does not (promoted before migration 012): nothing can
    be shown unused, so nothing is orphaned.

    A fresh promotion's checkpoint is this turn's, and it keeps what the turn used when
    it was decided, carried effects included: those stay used even if the facts read
    after the batch show one of them conflicted since (another attempt re-ran the tool:
    that re-run is published ``EFFECT_CONFLICT`` by its own record; the run the history
    holds is never ``ATTEMPT_SUPERSEDED``; found by a mutation review, session 41)."""
    kept = verdict.checkpoint.accepted_effect_ids
    if not verdict.replayed:
        return set(used_effect_ids(turn)) | set(kept or ())
    return None if kept is None else set(kept)


def orphaned_effects(turn: TurnCompleted, verdict: Verdict,
                     effects: Iterable[RecordedEffect],
                     claims: Iterable[ClaimRecord] = (),
                     promoted: CheckpointRecord | None = None,
                     promoted_items: Iterable[Item] | None = None) -> list[Orphan]:
    """Recorded or claimed effects that no accepted turn uses, to publish as
    ``EffectOrphaned`` for compensation once the verdict is known.

    A claim without a ``ToolEffect`` of its id counts as an effect of its holder's
    attempt; ``completed`` says whether its outcome was recorded (an uncompleted claim
    may or may not have run). ``promoted``: for a rejected turn, the checkpoint its
    request (idempotency key) stands promoted with, by another attempt or response id,
    if any. Then:

    * accepted: every effect recorded for the request that the accepted turn does
      not use (earlier attempts' leftovers) -> ``ATTEMPT_SUPERSEDED``. When the
      promotion was already stored (a redelivery, or a retry by another attempt), the
      accepted turn is the stored one, not this event's (``_accepted_effect_ids``);
    * rejected while the request stands promoted: an effect the promoted turn used is
      never orphaned (if its checkpoint does not say which it used, nothing is);
      ``DUPLICATE`` (a retry under another response id) orphans every other effect of
      the request -> ``ATTEMPT_SUPERSEDED``, as a retry answered with the promotion
      does; other rejections orphan what this attempt used or recorded, as below;
    * cancelled: every effect recorded for the request -> ``TURN_CANCELLED``;
    * any other rejection: the effects this attempt used or recorded (a chain's first
      response: recorded, its own attempt's only) ->
      ``TURN_NOT_PROMOTABLE`` (failed/in-progress status), ``EFFECT_CONFLICT``
      (conflicted effects) or ``TURN_REJECTED``.

    ``promoted_items``: the items of the stored promotion that stands (the replayed
    checkpoint of an accepted turn, ``promoted`` of a rejected one), read when
    ``needs_promoted_items``. An effect recorded after that promotion whose output it
    carries is used as if it listed it (its checkpoint could not: it did not exist yet).
    """
    effects, claims = tuple(effects), tuple(claims)
    if not effects and not claims:
        return []  # every orphan is a recorded or claimed effect: most turns have none
    claim_by_id, found, others = _merged(effects, claims)
    return others + _orphans_of_verdict(turn, verdict, claim_by_id, found, promoted,
                                        promoted_items)


def cancellation_orphans(effects: Iterable[RecordedEffect],
                         claims: Iterable[ClaimRecord] = ()) -> list[Orphan]:
    """The orphans of a request cancelled while it stands promoted nowhere: every
    effect and claim of it ``TURN_CANCELLED`` (a run its claim's completion displaced:
    ``EFFECT_CONFLICT``), what a turn of it decided after the cancellation publishes.
    Published by the cancellation itself: a turn of the request rejected before it
    orphaned only its own attempt's effects, and no turn may come after it (an outside
    review, session 38: a claim whose holder vanished was published nowhere)."""
    claim_by_id, found, others = _merged(effects, claims)
    return others + [
        _orphan_of(e, claim_by_id, OrphanReason.TURN_CANCELLED, R.CANCELLED,
                   "the request was cancelled before any turn of it was promoted")
        for e in (found[k] for k in sorted(found))]


def _orphan_of(e: RecordedEffect, claim_by_id: dict[str, ClaimRecord], reason: OrphanReason,
               rejection: RejectionReason | None = None, detail: str = "") -> Orphan:
    claim = claim_by_id.get(e.effect_id)
    completed = claim is None or claim.completed or e.output_digest != ""
    return Orphan(e, reason, rejection, detail, completed=completed)


def _merged(effects: Iterable[RecordedEffect], claims: Iterable[ClaimRecord]
            ) -> tuple[dict[str, ClaimRecord], dict[str, RecordedEffect], list[Orphan]]:
    """One effect per id, claims standing for the effects they displaced, and the
    displaced runs' own orphans."""
    claim_by_id = {c.effect_id: c for c in claims}
    found = {e.effect_id: e for e in effects}
    displaced: list[RecordedEffect] = []
    for claim in claim_by_id.values():
        recorded = found.setdefault(claim.effect_id, _as_effect(claim))
        if claim.completed and claim.output is not None \
                and recorded.output_digest != claim.output.content_digest:
            # A ToolEffect of a completed claim with another output: the effect is
            # conflicted (gateway-protocol.md section 8, rule 3), every turn listing it
            # is refused, and its orphan names the claim's recorded result (found by a
            # gateway built from the docs, session 25). The ToolEffect's run is another
            # execution that no turn can use: every verdict names it too (a review,
            # session 31: a stale holder's run recorded before the completion was
            # published nowhere when the completion's own ToolEffect never came).
            found[claim.effect_id] = replace(_as_effect(claim), conflicted=True)
            displaced.append(replace(recorded, conflicted=True))
    others = [Orphan(e, OrphanReason.EFFECT_CONFLICT, detail=(
        f"effect {e.effect_id} recorded with output digest {e.output_digest}, not its "
        "claim's completion: another execution of the tool, used by no turn"),
        displaced=True) for e in sorted(displaced, key=lambda e: e.effect_id)]
    return claim_by_id, found, others


def _orphans_of_verdict(turn: TurnCompleted, verdict: Verdict,
                        claim_by_id: dict[str, ClaimRecord],
                        found: dict[str, RecordedEffect],
                        promoted: CheckpointRecord | None,
                        promoted_items: Iterable[Item] | None) -> list[Orphan]:
    """``orphaned_effects`` for one effect per id (the claims' completions standing for
    the effects they displaced)."""

    def orphan(e: RecordedEffect, reason: OrphanReason, rejection: RejectionReason | None = None,
               detail: str = "") -> Orphan:
        return _orphan_of(e, claim_by_id, reason, rejection, detail)

    all_effects = [found[k] for k in sorted(found)]
    effects_only = [e for k, e in found.items() if k not in claim_by_id]

    def carried_by_stored(used: set[str]) -> set[str]:
        if promoted_items is None:
            return set()
        return carried_by_items(promoted_items, used, effects_only, claim_by_id.values(),
                                stored=True)

    if isinstance(verdict, Accepted):
        used = _accepted_effect_ids(turn, verdict)
        if used is None:
            return []
        if verdict.replayed:  # its checkpoint kept what its turn carried then
            used |= carried_by_stored(used)
        else:
            used |= carried_effect_ids(turn, effects_only, claim_by_id.values())
        return [orphan(e, OrphanReason.ATTEMPT_SUPERSEDED) for e in all_effects
                if e.effect_id not in used]
    protected: set[str] = set()
    if promoted is not None:
        if promoted.accepted_effect_ids is None:
            return []  # promoted before migration 012: nothing can be shown unused
        protected = set(promoted.accepted_effect_ids)
        protected |= carried_by_stored(protected)
    if verdict.reason is R.DUPLICATE:
        if promoted is None:
            return []  # the original's promotion could not be read: orphan nothing
        return [orphan(e, OrphanReason.ATTEMPT_SUPERSEDED) for e in all_effects
                if e.effect_id not in protected]
    if verdict.reason is R.CANCELLED:
        return [orphan(e, OrphanReason.TURN_CANCELLED, R.CANCELLED) for e in all_effects
                if e.effect_id not in protected]
    # A chain's first response: its other attempts are other partitions, one of which
    # may be promoting with an effect this turn replays (a retry lists the calls it
    # answered, with their ids) while this rejection is published: each attempt's
    # effects are left to that attempt's own outcome (a promotion uses or supersedes
    # them, a rejection orphans them).
    other_partitions = turn.conversation_id is None and turn.previous_response_id is None
    used = set() if other_partitions else set(used_effect_ids(turn))
    mine = [e for e in all_effects if (e.effect_id in used or e.attempt == turn.attempt)
            and e.effect_id not in protected]
    if promoted is not None:
        # The request stands promoted without them: settled, so final (section 7's
        # ATTEMPT_SUPERSEDED), not the provisional TURN_REJECTED / TURN_NOT_PROMOTABLE,
        # after which a compensator waits for a promotion that cannot come (an outside
        # review, session 38).
        return [orphan(e, OrphanReason.EFFECT_CONFLICT if e.conflicted
                       else OrphanReason.ATTEMPT_SUPERSEDED, verdict.reason, verdict.detail)
                for e in mine]
    return [orphan(e, _rejected_orphan_reason(e, verdict), verdict.reason, verdict.detail)
            for e in mine]


def _as_effect(claim: ClaimRecord) -> RecordedEffect:
    """A claim with no ``ToolEffect`` as the effect it stands for (output digest empty
    while no outcome is recorded)."""
    out = claim.output
    return RecordedEffect(
        claim.tenant_id, claim.idempotency_key, claim.effect_id, claim.attempt,
        claim.subturn_index, claim.call_id, claim.tool_name, claim.arguments_digest,
        claim.status or "", "" if out is None else out.item_id,
        "" if out is None else out.content_digest, claim.completed_at or claim.claimed_at)


def _rejected_orphan_reason(effect: RecordedEffect, verdict: Reject) -> OrphanReason:
    if effect.conflicted:
        return OrphanReason.EFFECT_CONFLICT
    if verdict.reason is R.NOT_PROMOTABLE_STATUS:
        return OrphanReason.TURN_NOT_PROMOTABLE
    return OrphanReason.TURN_REJECTED
