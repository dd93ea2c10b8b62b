"""Stateless validation of one ``TurnCompleted``: may it be promoted, and as what?

``validate_turn(event, now_ms)`` is a pure function of the event (plus, optionally, the
pairing state of the history it extends). It answers ``Valid(certification)`` or
``Rejected(reason, detail)``. Everything that needs stored state (DUPLICATE, CONFLICT,
PARENT_NOT_PROMOTED, CANCELLED, tool-effect bookkeeping, ...) is the stream
processor's job; it calls this first.

Checks run in one fixed order and the first failure wins, so a given event always gets
the same reason:

1. NOT_PROMOTABLE_STATUS  failed / cancelled / in_progress / queued never promote; no
                          point spending hashing on them.
2. UNSUPPORTED_FORMAT     an item format_version, the fingerprint_version or the
                          fingerprint's item_format_version this build cannot read;
                          contents holding more arrays and objects than parsing may
                          build (``bounds.container_problem``: one item's, or all
                          together). Before anything that interprets content.
3. UNKNOWN_ITEM_TYPE      an item type outside the catalogue (``catalogue.py``).
4. CORRUPT                an id the HTTP API could never serve (``schemas.ids``:
                          tenant, response, Conversation, chain root, parent); a
                          Conversation-mode turn that names a previous_response_id;
                          two items of the turn with one item_id; an item's
                          content_digest is wrong, or its content does not have its
                          type's shape (``catalogue.shape_problem``: also a key twice in
                          one JSON object); fingerprint_hash does not match the
                          fingerprint; effective_config digests disagree with the
                          fingerprint's. (Integrity before meaning.)
5. INCOMPLETE_FINGERPRINT a required component is missing, or the weights revision is
                          a mutable ref, or a LoRA has no revision.
6. UNPAIRED_TOOL_CALL     ``check_pairing`` over input then output items, continuing
                          the pairing state of the history before the turn.
7. INVALID_BOUNDARY_PROOF artifact or proof bound to another fingerprint; counts or
                          hashes inconsistent with the artifact; a router receipt of
                          another router key format than the fingerprint's, covering
                          tokens outside 0..the artifact's token_count (or with no
                          artifact), or with a receipt_id or issuer that is empty or
                          only whitespace; an artifact_id likewise blank. Checked
                          whenever an artifact, proof or receipt is present, even for
                          turns that end up logical_only: a broken proof means a broken
                          gateway.

Certification of a valid turn: ``certified`` for ``completed`` without truncation (its
logical history is certified); otherwise ``logical_only``. A certified turn carries a
reusable token artifact only with an unexpired artifact AND an unexpired boundary proof;
without them it is promoted certified with no artifact (rehydration falls back
``NO_ARTIFACT``). Expiry is the one input that depends on when the worker processes the
turn, so it decides reuse, never promotion: a backlog older than its proofs (a worker
down for longer than their lifetime) is promoted whole, not rejected turn by turn.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ratchet.domain.bounds import container_problem
from ratchet.domain.catalogue import (
    CATALOGUE,
    KNOWN_ITEM_TYPES,
    Kind,
    approval_request_id,
    shape_problem,
    unknown_type_detail,
)
from ratchet.domain.fingerprint import fingerprint_checks
from schemas.canonical import is_sha256_hex
from schemas.ids import unservable_id
from schemas.keys import root_problem
from schemas.models import (
    SUPPORTED_FINGERPRINT_VERSIONS,
    SUPPORTED_FORMAT_VERSIONS,
    Certification,
    Item,
    RejectionReason,
    TurnCompleted,
    TurnStatus,
)

PROMOTABLE_STATUSES = frozenset({TurnStatus.COMPLETED, TurnStatus.INCOMPLETE})


# The order in which validate_turn looks for problems (documented above).
EVALUATION_ORDER = (
    RejectionReason.NOT_PROMOTABLE_STATUS,
    RejectionReason.UNSUPPORTED_FORMAT,
    RejectionReason.UNKNOWN_ITEM_TYPE,
    RejectionReason.CORRUPT,
    RejectionReason.INCOMPLETE_FINGERPRINT,
    RejectionReason.UNPAIRED_TOOL_CALL,
    RejectionReason.INVALID_BOUNDARY_PROOF,
)


# --- outcomes ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PairingState:
    """What pairing needs to remember about a history to check the next turn.

    ``call_ids``: every call_id of a paired call so far, of any call type (they must
    stay unique). ``open_calls``: (call_id, call type) of the calls still waiting for
    their output, in call order; legal only at the end of a history (client-executed
    tools). ``request_ids`` / ``open_requests``: the same for MCP approval requests
    (keyed by the request's item id) and those still waiting for their response.
    """

    call_ids: frozenset[str] = frozenset()
    open_calls: tuple[tuple[str, str], ...] = ()
    request_ids: frozenset[str] = frozenset()
    open_requests: tuple[str, ...] = ()


EMPTY_PAIRING = PairingState()


@dataclass(frozen=True, slots=True)
class Unpaired:
    """Pairing is broken; ``detail`` names the item and the rule."""

    detail: str


@dataclass(frozen=True, slots=True)
class Valid:
    """The turn may be promoted with ``certification``.

    ``pairing`` is the pairing state AFTER the turn: store it with the new head so the
    next turn can be checked without re-reading the history. ``why`` says why the
    certification is what it is (for logs, not for machines). ``artifact_reusable``:
    the turn's token artifact (with its proof and receipt) is promoted with it.
    """

    certification: Certification
    pairing: PairingState
    why: str
    artifact_reusable: bool = False


@dataclass(frozen=True, slots=True)
class Rejected:
    reason: RejectionReason
    detail: str


Validation = Valid | Rejected


# --- entry points --------------------------------------------------------------------


def validate_turn(
    event: TurnCompleted, now_ms: int, *, prior: PairingState = EMPTY_PAIRING
) -> Validation:
    """Decide whether ``event`` is promotable, and as what (checks in EVALUATION_ORDER).

    ``prior`` is the pairing state of the history the turn extends (``EMPTY_PAIRING``
    for the first turn, or ``pairing_state_of(history)``).
    """
    items = event.items
    rejected = _event_checks(event, items)
    if rejected:
        return rejected
    pairing = check_pairing(items, prior)
    if isinstance(pairing, Unpaired):
        return Rejected(RejectionReason.UNPAIRED_TOOL_CALL, pairing.detail)
    rejected = check_boundary(event, now_ms)
    if rejected:
        return rejected
    certification, why = certification_of(event, now_ms)
    reusable = certification is Certification.CERTIFIED and artifact_reusable(event, now_ms)
    return Valid(certification, pairing, why, reusable)


@dataclass(frozen=True, slots=True)
class OffLineage:
    """Every check of ``validate_off_lineage`` passed: the certification the turn would
    be promoted with (and its artifact with it), for the store's judgement of its size.
    Its pairing was not checked: such a turn is never promoted from here."""

    certification: Certification
    artifact_reusable: bool


def validate_off_lineage(event: TurnCompleted, now_ms: int) -> Rejected | OffLineage:
    """Every check of ``validate_turn`` but pairing, in the same order: the first
    rejection, or what the turn would be promoted as. For a turn that continues no
    stored history (a Conversation turn whose expected head is not the head): there is
    no pairing state it could continue, and the write's answer (``CONFLICT`` /
    ``OUT_OF_ORDER``) follows these checks (docs/gateway-protocol.md, section 7)."""
    rejected = _event_checks(event, event.items) or check_boundary(event, now_ms)
    if rejected:
        return rejected
    certification, _ = certification_of(event, now_ms)
    return OffLineage(certification, certification is Certification.CERTIFIED
                      and artifact_reusable(event, now_ms))


def _event_checks(event: TurnCompleted, items: Sequence[Item]) -> Rejected | None:
    """The checks of the event alone that come before pairing, first failure wins."""
    return (
        _check_status(event)
        or _check_formats(event, items)
        or _check_item_types(items)
        or _check_integrity(event, items)
        or _check_fingerprint_complete(event)
    )


def check_pairing(
    items: Iterable[Item], prior: PairingState = EMPTY_PAIRING
) -> PairingState | Unpaired:
    """Check the pairing rules of CONTRACT section 4 over ``items``, continuing ``prior``.

    Rules, for every call type of the catalogue (function, custom tool, computer,
    local shell, shell, apply patch): call_ids are present and unique in the whole
    history; each output follows its still unanswered call and is that call type's
    output; MCP approval requests likewise: each response names an earlier, still
    unanswered request by its id. Open calls and requests may only be followed by
    other calls, outputs, requests or responses, i.e. they stay open only at the end
    of the history. Each reasoning item is followed by another item.
    Returns the state after ``items`` or ``Unpaired(detail)``.
    """
    call_ids = set(prior.call_ids)
    open_calls = dict(prior.open_calls)  # call_id -> call type, in call order
    request_ids = set(prior.request_ids)
    open_requests = dict.fromkeys(prior.open_requests)  # an ordered set
    trailing_reasoning: str | None = None
    for item in items:
        trailing_reasoning = None
        entry = CATALOGUE.get(item.type)
        kind = entry.kind if entry is not None else None
        if kind is Kind.CALL:
            problem = _open_call(item, call_ids, open_calls)
        elif kind is Kind.OUTPUT:
            problem = _answer_call(item, call_ids, open_calls)
        elif kind is Kind.APPROVAL_REQUEST:
            problem = _open_request(item, request_ids, open_requests)
        elif kind is Kind.APPROVAL_RESPONSE:
            problem = _answer_request(item, request_ids, open_requests)
        else:
            problem = _require_nothing_open(item, open_calls, open_requests)
            if kind is Kind.REASONING:
                trailing_reasoning = item.item_id
        if problem:
            return Unpaired(problem)
    if trailing_reasoning is not None:
        return Unpaired(f"reasoning item {trailing_reasoning} is not followed by another item")
    return PairingState(
        frozenset(call_ids), tuple(open_calls.items()), frozenset(request_ids),
        tuple(open_requests),
    )


def pairing_state_of(history: Sequence[Item]) -> PairingState | Unpaired:
    """The pairing state of a stored history (e.g. after loading it from the store)."""
    return check_pairing(history, EMPTY_PAIRING)


def check_boundary(event: TurnCompleted, now_ms: int) -> Rejected | None:
    """INVALID_BOUNDARY_PROOF checks: the artifact, the proof and the router receipt
    must bind to the turn."""
    return _check_artifact_and_proof(event) or _check_receipt(event)


def _check_receipt(event: TurnCompleted) -> Rejected | None:
    """A router receipt names the router key format it hashed the turn's blocks with
    and how many of the artifact's tokens it covers: a receipt of another key format
    (a fingerprint component, CONTRACT 1.2), covering tokens the artifact does not
    have, or naming no receipt or issuer (empty or only whitespace, ``blank``) would be
    handed back with a certified checkpoint as if it covered this turn. Refused like a proof that does not bind,
    not dropped: only expiry depends on when the worker runs (``artifact_reusable``);
    a receipt that does not bind is a broken gateway, whenever it is processed."""
    receipt, artifact = event.router_receipt, event.token_artifact
    if receipt is None:
        return None
    for name, value in (("receipt_id", receipt.receipt_id), ("issuer", receipt.issuer)):
        if blank(value):
            return _invalid_proof(f"router receipt's {name} {value[:80]!r} is empty or only "
                                  "whitespace")
    if receipt.router_key_format != event.fingerprint.router_key_format:
        return _invalid_proof(
            f"router receipt's router_key_format {receipt.router_key_format!r} is not the "
            f"fingerprint's {event.fingerprint.router_key_format!r}"
        )
    if artifact is None:
        return _invalid_proof("router receipt without a token artifact to cover")
    if not 0 <= receipt.covered_tokens <= artifact.token_count:
        return _invalid_proof(
            f"router receipt's covered_tokens {receipt.covered_tokens} outside "
            f"0..token_count {artifact.token_count}"
        )
    return None


def blank(name: str) -> bool:
    """A name of a reuse record (``artifact_id``, ``receipt_id``, ``issuer``) that names
    nothing: empty or only whitespace (``str.isspace``'s, the fingerprint's rule for a
    blank component). The read side asks the same of a stored record."""
    return not name.strip()


def _check_artifact_and_proof(event: TurnCompleted) -> Rejected | None:
    artifact, proof = event.token_artifact, event.boundary_proof
    if artifact is not None:
        if blank(artifact.artifact_id):
            return _invalid_proof(f"token artifact's artifact_id {artifact.artifact_id[:80]!r} is "
                                  "empty or only whitespace")
        if artifact.fingerprint_hash != event.fingerprint_hash:
            return _invalid_proof("token artifact is bound to another fingerprint_hash")
        if not 0 <= artifact.safe_append_boundary <= artifact.token_count:
            return _invalid_proof(
                f"safe_append_boundary {artifact.safe_append_boundary} outside "
                f"0..token_count {artifact.token_count}"
            )
    if proof is None:
        return None
    if proof.fingerprint_hash != event.fingerprint_hash:
        return _invalid_proof("boundary proof is bound to another fingerprint_hash")
    if min(proof.prefix_count, proof.append_count) < 0:
        return _invalid_proof("negative token count in boundary proof")
    if proof.prefix_count + proof.append_count != proof.combined_count:
        return _invalid_proof(
            f"prefix_count {proof.prefix_count} + append_count {proof.append_count} "
            f"!= combined_count {proof.combined_count}"
        )
    if artifact is None:
        return _invalid_proof("boundary proof without a token artifact to bind to")
    if proof.combined_count != artifact.token_count:
        return _invalid_proof(
            f"combined_count {proof.combined_count} != artifact token_count {artifact.token_count}"
        )
    if proof.combined_hash != artifact.token_hash:
        return _invalid_proof("combined_hash != artifact token_hash")
    return None


def certification_of(event: TurnCompleted, now_ms: int) -> tuple[Certification, str]:
    """What a VALID turn certifies, and why (assumes ``check_boundary`` passed)."""
    if event.status is not TurnStatus.COMPLETED:
        return Certification.LOGICAL_ONLY, f"status {event.status.value}"
    if event.effective_config.truncated:
        # truncated=true is only meaningful with truncation=auto; with "disabled" it is
        # contradictory, and the safe reading of a contradiction is "not certified".
        return Certification.LOGICAL_ONLY, "history was truncated"
    if not artifact_reusable(event, now_ms):
        return Certification.CERTIFIED, "completed, with no reusable token artifact"
    return Certification.CERTIFIED, "completed with a valid artifact and boundary proof"


def artifact_reusable(event: TurnCompleted, now_ms: int) -> bool:
    """The turn's token artifact can be reused: present and unexpired, with an unexpired
    proof. An expiry that passed before the turn was processed (a backlog, a worker
    down) costs the turn its reuse, never its promotion: whether a turn is promoted
    never depends on how soon the worker got to it."""
    return (
        event.token_artifact is not None
        and event.boundary_proof is not None
        and event.token_artifact.expires_at > now_ms
        and event.boundary_proof.expires_at > now_ms
    )


# --- the checks, in evaluation order -------------------------------------------------


def _check_status(event: TurnCompleted) -> Rejected | None:
    if event.status in PROMOTABLE_STATUSES:
        return None
    return Rejected(
        RejectionReason.NOT_PROMOTABLE_STATUS, f"status {event.status.value} never promotes"
    )


def _check_formats(event: TurnCompleted, items: Sequence[Item]) -> Rejected | None:
    for item in items:
        if item.format_version not in SUPPORTED_FORMAT_VERSIONS:
            return _unsupported(f"item {item.item_id} has format_version {item.format_version}")
    fingerprint = event.fingerprint
    if fingerprint.fingerprint_version not in SUPPORTED_FINGERPRINT_VERSIONS:
        return _unsupported(f"fingerprint_version {fingerprint.fingerprint_version}")
    version = fingerprint.item_format_version
    if version is not None and version not in SUPPORTED_FORMAT_VERSIONS:
        return _unsupported(f"fingerprint item_format_version {version}")
    problem = container_problem(items)  # before any content is parsed
    return None if problem is None else _unsupported(problem)


def _check_item_types(items: Sequence[Item]) -> Rejected | None:
    for item in items:
        if item.type not in KNOWN_ITEM_TYPES:
            return Rejected(RejectionReason.UNKNOWN_ITEM_TYPE, unknown_type_detail(item))
    return None


def request_digest_problem(request_digest: str) -> str | None:
    """Why a turn's ``request_digest`` is not a sha256 hex digest, or None. It is the
    request's identity across retries: a value that is not a digest (e.g. empty) would
    make unrelated requests of one key look like retries. The processor asks it before
    the response id is claimed (a claim binds the id to the digest)."""
    if not is_sha256_hex(request_digest):
        return (f"request_digest {request_digest[:80]!r} is not a sha256 hex digest "
                "(64 lowercase hex characters)")
    return None


def _check_integrity(event: TurnCompleted, items: Sequence[Item]) -> Rejected | None:
    problem = unservable_id(event) or _mode_problem(event)
    if problem:
        return _corrupt(problem)
    if event.attempt < 1:  # numbered from 1 (the claims API refuses the same)
        return _corrupt(f"attempt {event.attempt} is below 1")
    problem = request_digest_problem(event.request_digest)
    if problem:
        return _corrupt(problem)
    sha256 = hashlib.sha256  # the hot loop of validation: every digest, every time
    item_ids: set[str] = set()
    for item in items:
        if item.item_id in item_ids:
            # Rules that look items up by id (an mcp_call's recorded effect, an approval
            # request) would see only one of them: refuse, never guess which.
            return _corrupt(f"item_id {item.item_id!r} is not unique in the turn")
        if not item.item_id:
            return _corrupt("an item has an empty item_id")
        item_ids.add(item.item_id)
        if sha256(item.content).hexdigest() != item.content_digest:
            return _corrupt(f"item {item.item_id}: content does not match content_digest")
        problem = shape_problem(item)
        if problem:
            return _corrupt(problem)
    fingerprint = event.fingerprint
    if fingerprint_checks(fingerprint)[0] != event.fingerprint_hash:
        return _corrupt("fingerprint_hash does not match the fingerprint")
    config = event.effective_config
    for name in ("instructions_digest", "tools_digest"):
        in_fingerprint = getattr(fingerprint, name)
        if in_fingerprint is not None and in_fingerprint != getattr(config, name):
            return _corrupt(f"effective_config.{name} differs from fingerprint.{name}")
    return None


def _mode_problem(event: TurnCompleted) -> str | None:
    """A Conversation-mode turn continues the Conversation's head: a
    ``previous_response_id`` beside it names a second parent (the Responses API refuses
    ``conversation`` with ``previous_response_id`` too)."""
    if event.conversation_id is not None and event.previous_response_id is not None:
        return (f"Conversation-mode turn (conversation_id {event.conversation_id!r}) has "
                f"previous_response_id {event.previous_response_id!r}: it must be null")
    if event.conversation_id is None and event.expected_head_seq is not None:
        # A chain has no head: a gateway that sends one believes in a Conversation.
        return (f"chain-mode turn has expected_head_seq {event.expected_head_seq}: it must "
                "be null (a chain turn continues previous_response_id)")
    return root_problem(event)


def _check_fingerprint_complete(event: TurnCompleted) -> Rejected | None:
    missing = fingerprint_checks(event.fingerprint)[1]
    if not missing:
        return None
    return Rejected(RejectionReason.INCOMPLETE_FINGERPRINT, "missing: " + ", ".join(missing))


# --- pairing steps -------------------------------------------------------------------


def _open_call(item: Item, call_ids: set[str], open_calls: dict[str, str]) -> str | None:
    if not item.call_id:
        return f"{item.type} {item.item_id} has no call_id"
    if item.call_id in call_ids:
        return f"{item.type} {item.item_id}: call_id {item.call_id!r} is not unique"
    call_ids.add(item.call_id)
    open_calls[item.call_id] = item.type
    return None


def _answer_call(item: Item, call_ids: set[str], open_calls: dict[str, str]) -> str | None:
    if not item.call_id:
        return f"{item.type} {item.item_id} has no call_id"
    call_type = open_calls.get(item.call_id)
    if call_type is not None:
        expected = CATALOGUE[call_type].output_type
        if item.type != expected:
            return (f"{item.type} {item.item_id} answers {call_type} {item.call_id!r}, "
                    f"which expects a {expected}")
        del open_calls[item.call_id]
        return None
    if item.call_id in call_ids:
        return f"{item.type} {item.item_id}: call {item.call_id!r} already answered"
    return f"{item.type} {item.item_id}: no earlier call {item.call_id!r}"


def _open_request(item: Item, request_ids: set[str], open_requests: dict[str, None]) -> str | None:
    if item.item_id in request_ids:
        return f"{item.type} {item.item_id}: request id is not unique"
    request_ids.add(item.item_id)
    open_requests[item.item_id] = None
    return None


def _answer_request(
    item: Item, request_ids: set[str], open_requests: dict[str, None]
) -> str | None:
    request_id = approval_request_id(item)
    if request_id is None:
        return f"{item.type} {item.item_id} has no approval_request_id"
    if request_id in open_requests:
        del open_requests[request_id]
        return None
    if request_id in request_ids:
        return f"{item.type} {item.item_id}: request {request_id!r} already answered"
    return f"{item.type} {item.item_id}: no earlier mcp_approval_request {request_id!r}"


def _require_nothing_open(
    item: Item, open_calls: dict[str, str], open_requests: dict[str, None]
) -> str | None:
    if open_calls:
        waiting, call_type = next(iter(open_calls.items()))
        return f"{call_type} {waiting!r} is unanswered before {item.type} {item.item_id}"
    if open_requests:
        waiting = next(iter(open_requests))
        return (f"mcp_approval_request {waiting!r} is unanswered before {item.type} "
                f"{item.item_id}")
    return None


# --- small constructors ----------------------------------------------------------------


def _unsupported(detail: str) -> Rejected:
    return Rejected(RejectionReason.UNSUPPORTED_FORMAT, detail)


def _corrupt(detail: str) -> Rejected:
    return Rejected(RejectionReason.CORRUPT, detail)


def _invalid_proof(detail: str) -> Rejected:
    return Rejected(RejectionReason.INVALID_BOUNDARY_PROOF, detail)
