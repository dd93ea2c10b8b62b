"""The oracle: what each produced event must lead to, from the CONTRACT rules (section 4).

Written apart from ``ratchet/domain`` on purpose (it imports no ratchet code but the
event models; its digests are the docs' recipes, ``ratchet/chaos/recipes.py``, checked
against the published vectors): if the processor and the oracle disagree, one of them
is wrong, and the report shows the event. It replays one story's events in the order they were
sent. A step's ``race`` events may land in Kafka in any order, so the oracle keeps one
**world** per possible order; the checker accepts a story when some world matches.

An event whose acceptable outcomes hold several rejections (it breaks several rules and
the contract fixes no order between them) accepts any of them.

Outcome signatures:
- ``("P", seq, certification, idempotency_key, request_digest, item_count)``: promoted;
- ``("R", reason, existing_response_id)``: rejected (``existing_response_id`` only for
  ``DUPLICATE``, which must name the original response; else None).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from dataclasses import dataclass, field, replace

from ratchet.chaos import recipes
from ratchet.chaos.claims import ClaimedRun
from ratchet.chaos.story import RawRecord, Story, workload_fp_hash
from schemas.models import ToolEffect, TurnCancelled, TurnCompleted

# The Responses item types a gateway stores (CONTRACT 3, docs/gateway-protocol.md section
# 5); anything else is UNKNOWN_ITEM_TYPE. Listed here, not imported: the oracle must not
# share the code's list. Calls answered by their own ``<type>_output`` (by ``call_id``):
CALL_TYPES = frozenset({"function_call", "custom_tool_call", "computer_call",
                        "local_shell_call", "shell_call", "apply_patch_call"})
OUTPUT_TYPES = frozenset(f"{t}_output" for t in CALL_TYPES)
# An approval request answered by its response (by ``approval_request_id``).
APPROVAL_REQUEST, APPROVAL_RESPONSE = "mcp_approval_request", "mcp_approval_response"
KNOWN_TYPES = frozenset({
    "message", "reasoning", "compaction", "web_search_call", "file_search_call",
    "code_interpreter_call", "image_generation_call", "mcp_list_tools", "mcp_call",
    *CALL_TYPES, *OUTPUT_TYPES, APPROVAL_REQUEST, APPROVAL_RESPONSE})
NEVER_PROMOTED = frozenset({"failed", "cancelled", "in_progress", "queued"})
# A weights revision that names a branch, not immutable weights (CONTRACT 1.2: "a model
# alias alone is never an identity"); docs/gateway-protocol.md lists these.
MUTABLE_REVISIONS = frozenset({"main", "master", "latest", "head", "default", "stable"})

Sig = tuple


@dataclass(frozen=True)
class Promo:
    response_id: str
    key: str
    digest: str
    seq: int
    # The complete history, in order: (item_id, type, sha256 of content) per item.
    items: tuple[tuple[str, str, str], ...]
    certification: str
    artifact: bool = False  # a reusable token artifact (else a certified read is NO_ARTIFACT)
    # The lineage its outcome record must name (the promoted event's own fields).
    conversation_id: str | None = None
    previous_response_id: str | None = None
    fingerprint_hash: str = ""  # the promoted turn's
    # (type, call_id) of each item of ``items``: the pairing state a child continues.
    calls: tuple[tuple[str, str | None], ...] = ()
    # The effects its turn listed, and (call_id, digest) of each output its turn
    # carried: what an effect recorded after the promotion is judged by.
    effect_ids: frozenset[str] = frozenset()
    outputs: frozenset[tuple[str | None, str]] = frozenset()
    # Its logical expiry had passed when it was sent (the workload's ``expired``):
    # promoted all the same, and its own reads answer EXPIRED (expiry is per response).
    expired: bool = False
    # What of it expires a few seconds after its send (the workload's ``expiring``:
    # ``receipt``, ``artifact`` or ``logical``; ratchet/chaos/timed.py). The checker's
    # reads come after that expiry (the runner waits for it), so ``read`` answers as
    # past it; ``late``: the artifact had expired when the turn was processed (the
    # oracle learns it after the run, ``timed.settle``), so it was never kept.
    expiring: str | None = None
    late: bool = False
    # What a certified answer's checkpoint must carry: the promoted turn's artifact,
    # boundary proof and receipt (``certificate_of``); a retry is answered with these.
    certificate: tuple | None = None

    def read(self, fingerprint_hash: str) -> tuple[str, str | None]:
        """Outcome and reason of its history asked with ``fingerprint_hash`` (CONTRACT 5:
        the response's own logical expiry first, then the fallback reasons in the order
        gateway-protocol.md gives)."""
        return self.read_at(fingerprint_hash, past_expiry=True)

    def read_at(self, fingerprint_hash: str, *, past_expiry: bool) -> tuple[str, str | None]:
        """The same, asked before (``past_expiry`` False) or after its ``expiring``
        expiry (fallback reasons in the order of gateway-protocol.md section 8)."""
        expiring = self.expiring if past_expiry else None
        if self.expired or expiring == "logical":
            return "failure", "EXPIRED"
        if self.certification != "certified":
            return "fallback", "NOT_CERTIFIED"
        if not self.artifact or (self.late and expiring == "artifact"):
            return "fallback", "NO_ARTIFACT"
        if fingerprint_hash != self.fingerprint_hash:
            return "fallback", "FINGERPRINT_MISMATCH"
        if expiring in ("receipt", "artifact"):
            return "fallback", "ARTIFACT_EXPIRED"
        return "certified", None

    @property
    def read_as(self) -> tuple[str, str | None]:
        """Its history asked with the workload's fingerprint."""
        return self.read(workload_fp_hash())

    @property
    def sig(self) -> Sig:
        return ("P", self.seq, self.certification, self.key, self.digest, len(self.items))


@dataclass
class World:
    """One possible history of a story."""

    promoted: dict[str, Promo] = field(default_factory=dict)  # response id -> promotion
    keys: dict[str, Promo] = field(default_factory=dict)  # idempotency key -> promotion
    head: int = 0  # of the story's Conversation
    head_items: tuple[tuple[str, str, str], ...] = ()
    head_calls: tuple[tuple[str, str | None], ...] = ()
    # Other Conversations a story's event names (a response id raced elsewhere):
    # conversation id -> (head, items, calls).
    other_heads: dict[str, tuple] = field(default_factory=dict)
    effects: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # id -> key, call, out
    attempts: dict[str, int] = field(default_factory=dict)  # effect id -> attempt
    conflicted: set[str] = field(default_factory=set)  # effect ids recorded with two outputs
    # (tenant, response id) -> (idempotency key, request digest, partition) of the
    # request that bound it, promoted or not.
    rid_claims: dict[tuple[str, str], tuple[str, str, str]] = field(default_factory=dict)
    owners: dict[str, str] = field(default_factory=dict)  # Conversation -> its tenant
    cancelled: set[str] = field(default_factory=set)  # idempotency keys
    decided: dict[int, frozenset[Sig]] = field(default_factory=dict)  # event index -> outcomes
    orphans: set[str] = field(default_factory=set)  # effect ids that must be published orphaned
    # Claims that never get an outcome: orphaned, each record must say
    # ``effect_completed`` false.
    no_outcome: set[str] = field(default_factory=set)
    used: set[str] = field(default_factory=set)  # effect ids of promoted turns: never undone
    # Effect id -> the digest its outcome was recorded with, where it is not the one in
    # ``effects`` (a contended claim: its holder's item; ``ClaimedRun.recorded_digest``).
    recorded: dict[str, str] = field(default_factory=dict)

    def fork(self) -> World:
        return copy.deepcopy(self)


@dataclass
class Expectation:
    """All the worlds of one story (one unless it raced)."""

    story: Story
    worlds: list[World]
    dead_letters: list[RawRecord]


def expect(story: Story) -> Expectation:
    if story.kind == "garbage":
        return Expectation(story, [World()], [e for e in story.events if isinstance(e, RawRecord)])
    worlds = [World()]
    for step in story.steps:
        orders = [step.sends + step.race]
        if step.race:
            orders = [step.sends[:-1] + p for p in
                      itertools.permutations((step.sends[-1], *step.race))]
        nxt = []
        for world in worlds:
            for order in orders:
                w = world.fork() if len(orders) > 1 else world
                for index in order:
                    _apply(w, story, index)
                nxt.append(w)
        worlds = nxt
    return Expectation(story, worlds, [])


def _apply(w: World, story: Story, index: int) -> None:
    ev = story.events[index]
    if isinstance(ev, ClaimedRun):
        # Claimed before its turn: an effect of its request (gateway-protocol.md section
        # 8), with the recorded output, or (``expired``) with none: attempt 1 vanished
        # and attempt 2 was refused (LEASE_EXPIRED), so it never has an outcome.
        if ev.role == "expired":
            w.effects.setdefault(ev.effect_id, (ev.idempotency_key, ev.call_id, None))
            w.attempts.setdefault(ev.effect_id, 1)
            w.no_outcome.add(ev.effect_id)
            return
        w.effects.setdefault(ev.effect_id, (ev.idempotency_key, ev.call_id, ev.output_digest))
        if ev.recorded_digest != ev.output_digest:
            # What the completion recorded (a contended holder's own item), which an
            # orphan record names; the turn carries it re-keyed (``effects``: compared
            # with the turn's items, ids aside, as the processor does).
            w.recorded.setdefault(ev.effect_id, ev.recorded_digest)
        w.attempts.setdefault(ev.effect_id, ev.attempt)
        return
    if isinstance(ev, ToolEffect):
        # Deduplicated by effect id: the first record wins; another output under the
        # same id is a conflict (the tool ran twice and answered differently).
        recorded = w.effects.setdefault(ev.effect_id, (ev.idempotency_key, ev.call_id,
                                                       ev.output.content_digest))
        first = ev.effect_id not in w.attempts
        w.attempts.setdefault(ev.effect_id, ev.attempt)
        promo = w.keys.get(ev.idempotency_key)
        if recorded[2] != ev.output.content_digest:
            w.conflicted.add(ev.effect_id)
            # Another execution: in no history unless a promoted turn carries this
            # very output under its call; else published EFFECT_CONFLICT at once.
            if recorded[2] is not None and (
                    promo is None or (ev.call_id, ev.output.content_digest) not in promo.outputs):
                w.orphans.add(ev.effect_id)
        if first and promo is not None and ev.effect_id not in promo.effect_ids:
            # Recorded after its request's promotion (gateway-protocol.md section 6,
            # ``ToolEffect``): used if the promoted turn carries its output under its
            # call, else published orphaned (ATTEMPT_SUPERSEDED).
            if (ev.call_id, ev.output.content_digest) in promo.outputs:
                w.used.add(ev.effect_id)
            else:
                w.orphans.add(ev.effect_id)
    elif isinstance(ev, TurnCancelled):
        if ev.idempotency_key not in w.keys:  # a cancel after completion changes nothing
            w.cancelled.add(ev.idempotency_key)
    elif isinstance(ev, TurnCompleted):
        if index in w.decided:  # the same event again: its outcome never flips
            return
        w.decided[index] = _decide(w, story, ev)
        _mark_timed(w, story, index, ev)


def _mark_timed(w: World, story: Story, index: int, ev: TurnCompleted) -> None:
    """A turn whose expiry the producer stamps at its send (``Story.timed``): its
    promotion carries what expires."""
    timed = story.timed.get(index)
    promo = w.promoted.get(ev.response_id)
    if timed is None or promo is None or promo.key != ev.idempotency_key:
        return
    promo = replace(promo, expiring=timed[0])
    w.promoted[ev.response_id] = promo
    w.keys[ev.idempotency_key] = promo


def _listed(ev: TurnCompleted) -> tuple[str, ...]:
    """The effect ids a turn lists: ``tool_effect_ids`` with every subturn's
    ``effect_ids`` (the union is used, gateway-protocol.md section 6)."""
    ids = list(ev.tool_effect_ids)
    for sub in ev.subturns:
        ids += [e for e in sub.effect_ids if e not in ids]
    return tuple(ids)


def _pair_key(item) -> tuple[str, str | None]:
    """(type, pairing key) of an item: a call's or output's ``call_id``, an approval
    request's ``id``, an approval response's ``approval_request_id`` (from its content:
    the record has no field for it)."""
    if item.type == APPROVAL_REQUEST:
        return item.type, item.item_id
    if item.type == APPROVAL_RESPONSE:
        try:
            named = json.loads(item.content).get("approval_request_id")
        except (ValueError, AttributeError):
            named = None
        return item.type, named if isinstance(named, str) else None
    return item.type, item.call_id


def _decide(w: World, story: Story, ev: TurnCompleted) -> frozenset[Sig]:
    # A turn of status completed or incomplete binds its response id to its request as
    # soon as a worker starts on it, whatever its outcome, and for good
    # (gateway-protocol.md, "A response_id is bound once per tenant").
    claimant = (ev.idempotency_key, ev.request_digest, _partition(ev))
    holder = w.rid_claims.setdefault((ev.tenant_id, ev.response_id), claimant) \
        if ev.status in ("completed", "incomplete") else None
    owner = w.owners.get(ev.conversation_id) if ev.conversation_id else None
    if owner is not None and owner != ev.tenant_id:
        # A Conversation is its first promoted turn's tenant's: checked first of all
        # (gateway-protocol.md section 7). The workload's other tenant has no key,
        # response or effect of the story's: nothing else applies.
        return _reject("TENANT_MISMATCH")
    bound = w.keys.get(ev.idempotency_key)
    if bound is not None and bound.digest == ev.request_digest:
        if bound.response_id == ev.response_id:
            return frozenset({bound.sig})  # a retry: the original outcome again
        return _reject("DUPLICATE", bound.response_id)
    reasons = _invalid(w, ev)
    if reasons:
        if "CANCELLED" in reasons:
            _orphan_all(w, ev.idempotency_key)
        elif bound is None:
            _orphan_attempt(w, ev)
        return frozenset(("R", r, None) for r in reasons)
    # The write's answers (gateway-protocol.md section 7). A breach of pairing is an
    # event check and comes first, but only where the turn goes; the workload never
    # sends both, so either is accepted.
    write = set()
    elsewhere = False  # the response id is bound to another request, not promoted here
    if bound is not None:
        write.add("IDEMPOTENCY_KEY_REUSED")
    elif holder is not None and holder != claimant:
        # A response id is never bound twice. Promoted in this partition, the write
        # finds it whatever the head; else only the claim a turn takes before its write
        # refuses it, so a turn that does not extend the head is answered by the head
        # alone (gateway-protocol.md section 7).
        if ev.response_id in w.promoted and holder[2] == claimant[2]:
            write.add("CONFLICT")
        else:
            elsewhere = True
    if ev.conversation_id is not None:
        head, prior, prior_calls = _conversation(w, story, ev.conversation_id)
        if ev.expected_head_seq < head:
            return _reject_any(w, ev, write or {"CONFLICT"})
        if ev.expected_head_seq > head:
            return _reject_any(w, ev, write or {"OUT_OF_ORDER"})
        seq = head + 1
    elif ev.previous_response_id is None:
        seq, prior, prior_calls = 1, (), ()
    elif ev.previous_response_id in w.promoted and ev.tenant_id == story.tenant:
        parent = w.promoted[ev.previous_response_id]
        seq, prior, prior_calls = parent.seq + 1, parent.items, parent.calls
    elif ev.previous_response_id in w.promoted:
        # Another tenant's child of the story's promoted response: not in that tenant's
        # partition, and the response's owner is the story's tenant (gateway-protocol.md
        # section 6, ``previous_response_id``; the other tenant has nothing else here).
        return _reject_any(w, ev, write or {"TENANT_MISMATCH"})
    else:
        return _reject_any(w, ev, write or {"PARENT_NOT_PROMOTED", *(
            {"CONFLICT"} if elsewhere else ())})
    if elsewhere:
        write.add("CONFLICT")
    turn_items = (*ev.input_items, *ev.output_items)
    calls = prior_calls + tuple(_pair_key(i) for i in turn_items)
    if _unpaired(calls):
        write.add("UNPAIRED_TOOL_CALL")
    if write:
        return _reject_any(w, ev, write)
    items = prior + tuple((i.item_id, i.type, i.content_digest) for i in turn_items)
    # A call answered by a listed effect carries no other effect (gateway-protocol.md
    # section 6): what a late effect is judged by (``Promo.outputs``).
    answered = {w.effects[e][1] for e in _listed(ev) if e in w.effects}
    certified = ev.status == "completed" and not ev.effective_config.truncated
    artifact = certified and ev.token_artifact is not None and ev.boundary_proof is not None
    promo = Promo(ev.response_id, ev.idempotency_key, ev.request_digest, seq, items,
                  "certified" if certified else "logical_only", artifact,
                  ev.conversation_id, ev.previous_response_id, ev.fingerprint_hash, calls,
                  frozenset(_listed(ev)),
                  frozenset((i.call_id, i.content_digest) for i in turn_items
                            if i.type == "function_call_output"
                            and i.call_id not in answered),
                  ev.expires_at is not None and ev.expires_at <= ev.produced_at,
                  certificate=certificate_of(_dump(ev.token_artifact),
                                             _dump(ev.boundary_proof), ev.router_receipt))
    w.promoted[ev.response_id] = promo
    w.keys[ev.idempotency_key] = promo
    if ev.conversation_id is not None:
        w.owners.setdefault(ev.conversation_id, ev.tenant_id)
    if ev.conversation_id == story.key:
        w.head, w.head_items, w.head_calls = seq, items, calls
    elif ev.conversation_id is not None:
        w.other_heads[ev.conversation_id] = (seq, items, calls)
    used = set(_listed(ev))
    w.used |= used
    w.orphans |= {eid for eid, (key, _, _) in w.effects.items()
                  if key == ev.idempotency_key and eid not in used}
    return frozenset({promo.sig})


ARTIFACT_FIELDS = ("artifact_id", "token_hash", "token_count", "safe_append_boundary",
                   "fingerprint_hash")
PROOF_FIELDS = ("prefix_hash", "prefix_count", "append_hash", "append_count", "combined_hash",
                "combined_count", "boundary_kind", "fingerprint_hash")


def certificate_of(artifact: dict | None, proof: dict | None, receipt: object) -> tuple:
    """The parts of a turn's token artifact and boundary proof a certified answer's
    ``checkpoint`` must repeat (CONTRACT 1.3, 1.5; gateway-protocol.md section 8: "objects
    with the fields of the records of section 6"), and whether it has a router receipt.
    Expiries are left out (the API spells them otherwise, and each process that builds
    the workload stamps its own)."""
    def pick(record: dict | None, names: tuple[str, ...]) -> tuple | None:
        return None if record is None else tuple(record.get(n) for n in names)
    return pick(artifact, ARTIFACT_FIELDS), pick(proof, PROOF_FIELDS), receipt is not None


def _dump(record) -> dict | None:
    return None if record is None else record.model_dump(mode="json")


def _partition(ev: TurnCompleted) -> str:
    """Its partition key (CONTRACT 2): the Conversation, else the chain's first response."""
    return ev.conversation_id or ev.chain_root_id or ev.response_id


def _conversation(w: World, story: Story, conversation_id: str) -> tuple:
    if conversation_id == story.key:
        return w.head, w.head_items, w.head_calls
    return w.other_heads.get(conversation_id, (0, (), ()))


def _unpaired(calls: tuple[tuple[str, str | None], ...]) -> bool:
    """The pairing rules of CONTRACT 4 over a whole history (contracts.md section 7), for
    every call type: call ids unique across all call types; an output follows its own
    still open call, of its type (a ``custom_tool_call_output`` never answers a
    ``function_call``); an approval response names a still open request (request ids
    unique); open calls and requests are followed only by calls, outputs, requests and
    responses (so they stay open only at the end); a reasoning item is followed by
    another item."""
    seen: set[str | None] = set()
    open_calls: dict[str | None, str] = {}  # call id -> its call type
    requests: set[str | None] = set()
    open_requests: set[str | None] = set()
    for n, (kind, call_id) in enumerate(calls):
        if kind in CALL_TYPES:
            if call_id in seen:
                return True
            seen.add(call_id)
            open_calls[call_id] = kind
        elif kind in OUTPUT_TYPES:
            if open_calls.get(call_id) != kind[: -len("_output")]:
                return True
            del open_calls[call_id]
        elif kind == APPROVAL_REQUEST:
            if call_id in requests:
                return True
            requests.add(call_id)
            open_requests.add(call_id)
        elif kind == APPROVAL_RESPONSE:
            if call_id not in open_requests:
                return True
            open_requests.discard(call_id)
        elif open_calls or open_requests:
            return True
        if kind == "reasoning" and n == len(calls) - 1:
            return True
    return False


def _invalid(w: World, ev: TurnCompleted) -> set[str]:
    """Every rule the turn itself breaks (any of them is an acceptable reason)."""
    reasons = set()
    if ev.status in NEVER_PROMOTED:
        reasons.add("NOT_PROMOTABLE_STATUS")
    items = (*ev.input_items, *ev.output_items)
    fp = ev.fingerprint
    if any(i.format_version != 1 for i in items) or fp.fingerprint_version != 1 \
            or fp.item_format_version != 1:
        reasons.add("UNSUPPORTED_FORMAT")
    if any(i.type not in KNOWN_TYPES for i in items):
        reasons.add("UNKNOWN_ITEM_TYPE")
    if any(hashlib.sha256(i.content).hexdigest() != i.content_digest for i in items):
        reasons.add("CORRUPT")
    if ev.fingerprint_hash != _own_fp_hash(fp):
        # Recomputed by ratchet, by the docs' recipe (gateway-protocol.md section 4): a
        # turn whose hash is not the recipe's is CORRUPT (a product recipe that drifted
        # agrees with its own library, not with this).
        reasons.add("CORRUPT")
    revision = (fp.model_weights_revision or "").strip().lower()
    if not revision or revision in MUTABLE_REVISIONS:
        reasons.add("INCOMPLETE_FINGERPRINT")
    if _proof_broken(ev):
        reasons.add("INVALID_BOUNDARY_PROOF")
    if ev.idempotency_key in w.cancelled:
        reasons.add("CANCELLED")
    recorded = {eid: v for eid, v in w.effects.items() if v[0] == ev.idempotency_key}
    if any(eid not in recorded for eid in _listed(ev)):
        reasons.add("MISSING_TOOL_EFFECT")
    # A listed effect recorded twice with different outputs, or answered with another
    # output than its recorded one: the tool ran again (gateway-protocol.md section 6).
    if any(eid in w.conflicted for eid in _listed(ev)):
        reasons.add("DUPLICATE_TOOL_EFFECT")
    outputs = {call: out for eid, (_, call, out) in recorded.items() if eid in _listed(ev)}
    for item in items:
        if item.type == "function_call_output" and item.call_id in outputs \
                and outputs[item.call_id] != item.content_digest:
            reasons.add("DUPLICATE_TOOL_EFFECT")
    return reasons


_FP_HASHES: dict = {}


def _own_fp_hash(fingerprint) -> str:
    if fingerprint not in _FP_HASHES:
        _FP_HASHES[fingerprint] = recipes.fingerprint_hash(fingerprint)
    return _FP_HASHES[fingerprint]


def _proof_broken(ev: TurnCompleted) -> bool:
    """CONTRACT 1.5: a proof binds the turn's fingerprint and agrees with the artifact."""
    proof, artifact = ev.boundary_proof, ev.token_artifact
    if proof is None:
        return False
    own = _own_fp_hash(ev.fingerprint)  # the turn's hash as the docs compute it
    if artifact is None or own != proof.fingerprint_hash or own != artifact.fingerprint_hash:
        return True
    return not (proof.prefix_count + proof.append_count == proof.combined_count
                == artifact.token_count and proof.combined_hash == artifact.token_hash)


def _orphan_all(w: World, key: str) -> None:
    w.orphans |= {eid for eid, (k, _, _) in w.effects.items() if k == key}


def _orphan_attempt(w: World, ev: TurnCompleted) -> None:
    """A rejected attempt of a request not promoted: the effects it used or recorded
    are published orphaned (a later attempt may still use them: not final)."""
    w.orphans |= {eid for eid, (k, _, _) in w.effects.items() if k == ev.idempotency_key
                  and (eid in _listed(ev) or w.attempts.get(eid) == ev.attempt)}


def _reject_any(w: World, ev: TurnCompleted, reasons: set[str]) -> frozenset[Sig]:
    if ev.idempotency_key not in w.keys:
        _orphan_attempt(w, ev)
    return frozenset(("R", r, None) for r in reasons)


def _reject(reason: str, existing: str | None = None) -> frozenset[Sig]:
    return frozenset({("R", reason, existing)})
