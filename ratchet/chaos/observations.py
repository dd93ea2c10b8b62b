"""What a chaos run observed on the public surfaces: outcome records, HTTP answers,
requests left without an answer, and the violations the checker finds in them.

The observer (``ratchet/chaos/observe.py``) fills ``Observations``; the checker
(``ratchet/chaos/checker.py``) judges them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ratchet.chaos.oracle import Sig

# Orphan reasons that tell the gateway to compensate (docs/gateway-protocol.md, "When to
# compensate"): an effect a promoted turn used must never carry one.
FINAL_ORPHAN_REASONS = frozenset({"ATTEMPT_SUPERSEDED", "TURN_CANCELLED", "EFFECT_CONFLICT"})
# The fingerprint hash some histories are asked with besides the workload's: a model
# nobody deployed.
OTHER_FINGERPRINT = "f" * 64
# A History field the observer did not record (a History built by hand, in tests):
# ``history_of`` records every one of them from every answer.
UNSEEN = "unseen"


@dataclass(frozen=True)
class Promoted:
    tenant: str
    response_id: str
    conversation_id: str | None
    previous_response_id: str | None
    seq: int
    certification: str
    key: str
    digest: str
    item_count: int
    at_ms: int  # when the record was appended to its topic

    @property
    def sig(self) -> Sig:
        return ("P", self.seq, self.certification, self.key, self.digest, self.item_count)


@dataclass(frozen=True)
class Rejected:
    tenant: str
    response_id: str
    reason: str | None
    existing_response_id: str | None
    at_ms: int

    @property
    def sig(self) -> Sig:
        existing = self.existing_response_id if self.reason == "DUPLICATE" else None
        return ("R", self.reason, existing)


@dataclass(frozen=True)
class History:
    """One HTTP history answer: outcome, reason, the items in order as (item_id, type,
    sha256 recomputed from the returned content), the response it names and its
    ``head_seq``, and ``faults``: what the answer contradicts in itself (an item's
    digest field that is not its content's, a checkpoint of another seq or
    fingerprint, a certified answer without an artifact)."""

    outcome: str
    reason: str | None
    items: tuple[tuple[str, str, str], ...]
    response_id: str | None = None
    head_seq: int | None = None
    faults: tuple[str, ...] = ()
    # The Conversation's head beside ``head_seq`` (null in chain mode), and of a
    # certified answer what its checkpoint carries (``oracle.certificate_of``); UNSEEN
    # when not recorded (``history_of`` records both from every answer).
    conversation_head_seq: int | None | str = UNSEEN
    certificate: tuple | None | str = UNSEEN


@dataclass(frozen=True)
class Lost:
    """A request to the API that got no answer (a connection refused or reset, a 5xx,
    an answer the client could not trust) after its retries: which endpoint (``what``:
    history, conversation, foreign, other_fingerprint, wait), for whom, when (epoch ms:
    asked, given up) and the last error."""

    what: str
    tenant: str
    ident: str
    asked_ms: int
    ended_ms: int
    error: str


@dataclass(frozen=True)
class Wait:
    """One ``wait_ms`` answer, failures included, and when (epoch ms) it was asked."""

    tenant: str
    response_id: str
    history: History
    asked_ms: int


@dataclass
class Observations:
    promoted: list[Promoted] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    orphaned: set[tuple[str, str]] = field(default_factory=set)  # (tenant, effect id)
    # Orphans published with a reason in FINAL_ORPHAN_REASONS, but EFFECT_CONFLICT.
    final_orphans: set[tuple[str, str]] = field(default_factory=set)
    # EFFECT_CONFLICT orphans (tenant, effect id, output digest): each names one
    # execution of the effect id by its output, which may be another than the one a
    # promoted turn used (the tool ran again after the promotion).
    conflict_orphans: set[tuple[str, str, str]] = field(default_factory=set)
    # Orphans published with ``effect_completed`` true (an outcome was recorded).
    completed_orphans: set[tuple[str, str]] = field(default_factory=set)
    # Claims answered otherwise than the claims API's rules, as the producer saw them
    # (tenant, effect id, what was answered): ``ratchet/chaos/claims.py``.
    claim_answers_wrong: list[tuple[str, str, str]] = field(default_factory=list)
    dead_letters: set[tuple[bytes | None, bytes | None]] = field(default_factory=set)
    histories: dict[tuple[str, str], History] = field(default_factory=dict)  # (tenant, rid)
    conversations: dict[tuple[str, str], History] = field(default_factory=dict)
    waits: list[Wait] = field(default_factory=list)
    # Histories asked with a tenant that never sent the response: (tenant asked, rid).
    foreign: dict[tuple[str, str], History] = field(default_factory=dict)
    # Histories asked with another fingerprint than the workload's (OTHER_FINGERPRINT):
    # a fingerprint change invalidates reuse, never the history (CONTRACT 5).
    other_fingerprint: dict[tuple[str, str], History] = field(default_factory=dict)
    # Requests that got no answer (``Lost``), and when faults were injected (epoch ms,
    # start and end of each, from the runner): a lost answer outside every window is
    # ``answer_missing``.
    lost: list[Lost] = field(default_factory=list)
    fault_windows: list[tuple[int, int]] = field(default_factory=list)
    # What ``fetch_histories`` asked, per endpoint (the keys of ``histories``,
    # ``conversations``, ``foreign``, ``other_fingerprint``): each needs an answer or a
    # ``Lost``.
    asked: dict[str, set[tuple[str, str]]] = field(default_factory=dict)
    # Every EffectOrphaned record: (tenant, effect id) -> [(reason, effect_completed,
    # output_digest), ...] in the order read.
    orphan_records: dict[tuple[str, str], list[tuple[str, bool | None, str | None]]] = field(
        default_factory=dict)
    # ``/status`` of every response sent, asked by its sender after the run:
    # (tenant, rid) -> (state, reason, seq).
    statuses: dict[tuple[str, str], tuple[str, str | None, int | None]] = field(
        default_factory=dict)
    # The damage phase (ratchet/chaos/damage.py): what was damaged (``Damage``) and every
    # answer after it (``DamageRead``).
    damages: list = field(default_factory=list)
    damage_reads: list = field(default_factory=list)
    # Turns sent on top of the damaged histories (``damage.Continuation``).
    continuations: list = field(default_factory=list)
    # Reads as another tenant of the workload (ratchet/chaos/crosstenant.py,
    # ``CrossRead``), and per (endpoint, tenant) the answer to an id nobody used:
    # (HTTP status, normalized body).
    cross_reads: list = field(default_factory=list)
    cross_baseline: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Violation:
    kind: str
    story: str
    detail: str

    def as_dict(self) -> dict:
        return asdict(self)
