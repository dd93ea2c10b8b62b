"""Judging one answer against the oracle: a history answer, a ``/status`` answer, a
response's outcome records, and how each is worded in a violation's detail.
"""

from __future__ import annotations

from ratchet.chaos.observations import UNSEEN, History
from ratchet.chaos.oracle import Promo, Sig, World


def status_problem(promo: Promo | None, wanted: set[Sig],
                    got: tuple[str, str | None, int | None] | None) -> str | None:
    """``/status`` of a response against the oracle (docs/gateway-protocol.md section 8):
    ``promoted`` with its seq when the oracle promoted it; otherwise never ``promoted``,
    and ``rejected`` with one of the reasons the oracle allows for it. ``unknown`` only
    for a response the oracle may reject ``CORRUPT`` (an event whose identity cannot be
    trusted records no status under it). Not asked, or no answer: ``checker._unanswered``."""
    if got is None:
        return None
    state, reason, seq = got
    if promo is not None:
        if state != "promoted" or seq != promo.seq:
            return f"status {state} {reason or ''} seq {seq}; promoted at seq {promo.seq}"
        return None
    reasons = {sig[1] for sig in wanted if sig[0] == "R"}
    if state == "promoted":
        return f"status promoted (seq {seq}); never promoted (expected {sorted(reasons)})"
    if state == "rejected" and reason not in reasons:
        return f"status rejected {reason}; expected one of {sorted(reasons)}"
    if state == "unknown" and "CORRUPT" not in reasons:
        return f"status unknown; a rejection was recorded ({sorted(reasons)})"
    if state not in ("rejected", "unknown"):
        return f"status {state!r}: not a state of the contract"
    return None


def final_heads(story, w: World) -> dict[str, int]:
    """The head of every Conversation the story's turns were promoted on, at the end."""
    heads = {c: h[0] for c, h in w.other_heads.items()}
    if story.kind == "conversation":
        heads[story.key] = w.head
    return heads


def head_range(promo: Promo | None, heads: dict[str, int]) -> tuple[int, int] | None:
    """The ``conversation_head_seq`` a history answer of ``promo`` must report, as a
    range (the final fetch: exactly the final head); None in chain mode (null)."""
    if promo is None or promo.conversation_id is None:
        return None
    final = heads.get(promo.conversation_id, promo.seq)
    return final, final


def answer_problem(promo: Promo | None, rid: str, got: History | None,
                    fingerprint_hash: str | None = None, *, heads: tuple[int, int] | None
                    | str = UNSEEN, sent: bool = True) -> str | None:
    """What is wrong with ``got``, the history answer for ``rid`` (promoted as ``promo``,
    or never promoted: None) asked with ``fingerprint_hash`` (default: the workload's)
    by a tenant that sent it (``sent``) or not; None if it is right. ``heads``: the
    range its ``conversation_head_seq`` must lie in, None for null (chain mode), UNSEEN
    not to check it."""
    if got is None:
        return "no answer"
    if promo is None:
        # Rejected: the ledger recorded the rejection for this tenant, NOT_PROMOTED (409);
        # NOT_FOUND (404) is for an id this tenant never sent (gateway-protocol.md
        # section 8, the table of outcomes).
        want = "NOT_PROMOTED" if sent else "NOT_FOUND"
        if (got.outcome, got.reason) == ("failure", want):
            return None
        return f"{history_text(got)}, but it was never promoted (expected {want})"
    outcome, reason = promo.read_as if fingerprint_hash is None else promo.read(fingerprint_hash)
    wrong = []
    if (got.outcome, got.reason) != (outcome, reason):
        wrong.append(f"{history_text(got)} != {outcome}{'/' + reason if reason else ''}")
    elif got.outcome != "failure" and got.items != promo.items:
        wrong.append(f"{len(got.items)} items != the {len(promo.items)} promoted, in order")
    if got.outcome != "failure" and (got.response_id, got.head_seq) != (rid, promo.seq):
        wrong.append(f"names {got.response_id} at head_seq {got.head_seq}, expected "
                     f"{rid} at {promo.seq}")
    if got.outcome != "failure":
        wrong += fields_problems(promo, got, outcome, heads)
    wrong += list(got.faults)
    return "; ".join(wrong) or None


def fields_problems(promo: Promo, got: History, expected: str,
                     heads: tuple[int, int] | None | str) -> list[str]:
    """A history answer's fields beside its items: ``conversation_head_seq`` (the
    Conversation's head, null in chain mode) and, certified, the checkpoint's artifact,
    boundary proof and receipt against the promoted turn's (gateway-protocol.md section
    8, "History body")."""
    wrong = []
    chs = got.conversation_head_seq
    if chs != UNSEEN and heads != UNSEEN:
        if heads is None and chs is not None:
            wrong.append(f"conversation_head_seq {chs} in chain mode (null expected)")
        elif heads is not None and not (isinstance(chs, int)
                                        and heads[0] <= chs <= heads[1]):
            want = heads[0] if heads[0] == heads[1] else f"{heads[0]}..{heads[1]}"
            wrong.append(f"conversation_head_seq {chs}, expected {want}")
    if got.outcome == expected == "certified" and got.certificate != UNSEEN \
            and got.certificate != promo.certificate:
        wrong.append(f"checkpoint carries {certificate_text(got.certificate)}, the promoted turn "
                     f"{certificate_text(promo.certificate)}")
    return wrong


def certificate_text(cert) -> str:
    if not isinstance(cert, tuple):
        return repr(cert)
    artifact, proof, receipt = cert
    art = "no artifact" if artifact is None else (
        f"artifact {artifact[0]} ({artifact[2]} tokens, hash {str(artifact[1])[:12]})")
    return (f"{art}, {'no proof' if proof is None else 'proof ' + str(proof[4])[:12]}, "
            f"{'a' if receipt else 'no'} receipt")


def classify(acceptable: frozenset[Sig], seen: set[Sig]) -> str:
    wanted_promotion = any(s[0] == "P" for s in acceptable)
    seen_promotion = any(s[0] == "P" for s in seen)
    if wanted_promotion:
        return "promotion_mismatch" if seen_promotion else "valid_turn_rejected"
    return "promotion_should_not_exist" if seen_promotion and not any(
        s[0] == "R" for s in seen) else "wrong_reason"


def sigs_text(sigs) -> str:
    parts = []
    for s in sorted(sigs, key=str):
        if s[0] == "P":
            parts.append(f"promoted(seq={s[1]}, {s[2]}, items={s[5]})")
        else:
            parts.append(f"rejected({s[1]}{', original=' + s[2] if s[2] else ''})")
    return " | ".join(parts) or "nothing"


def history_text(h: History | None) -> str:
    if h is None:
        return "no answer"
    return f"{h.outcome}{'/' + h.reason if h.reason else ''} with {len(h.items)} items"
