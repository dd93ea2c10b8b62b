"""validate_turn: one minimal event per reason, one valid event per certification level."""

from __future__ import annotations

import pytest

from ratchet.domain.validation import (
    EMPTY_PAIRING,
    EVALUATION_ORDER,
    OffLineage,
    PairingState,
    Rejected,
    Unpaired,
    Valid,
    check_pairing,
    pairing_state_of,
    validate_off_lineage,
    validate_turn,
)
from ratchet.samples import (
    HOUR_MS,
    NOW_MS,
    REJECTING_TURNS,
    make_artifact_and_proof,
    make_fingerprint,
    make_tool_loop_turn,
    make_turn,
    tampered,
)
from schemas.canonical import sha256_hex
from schemas.ids import SERVED_ID_FIELDS
from schemas.items import (
    function_call,
    function_call_output,
    make_item,
    mcp_call,
    message,
    reasoning,
)
from schemas.models import (
    Certification,
    EffectiveConfig,
    RejectionReason,
    RouterReceipt,
    TurnStatus,
)


def rejected_reason(turn, now_ms: int = NOW_MS, **kw) -> RejectionReason | None:
    outcome = validate_turn(turn, now_ms, **kw)
    return outcome.reason if isinstance(outcome, Rejected) else None


def call(cid: str):
    return function_call(cid, "get_weather", {"city": "Paris"}, item_id=f"fc_{cid}")


def out(cid: str):
    return function_call_output(cid, "sunny", item_id=f"fco_{cid}")


def say(text: str = "ok", role: str = "assistant"):
    return message(text, role=role, item_id=f"msg_{text}_{role}")


def think(text: str = "hmm"):
    return reasoning(text, item_id=f"rs_{text}")


# --- one reason each ----------------------------------------------------------------


def test_every_stateless_reason_has_a_minimal_event() -> None:
    assert set(REJECTING_TURNS) == set(EVALUATION_ORDER)


@pytest.mark.parametrize("reason", EVALUATION_ORDER, ids=lambda r: r.value)
def test_minimal_event_triggers_exactly_its_reason(reason: RejectionReason) -> None:
    assert rejected_reason(REJECTING_TURNS[reason]()) is reason


@pytest.mark.parametrize(
    "status", [TurnStatus.FAILED, TurnStatus.CANCELLED, TurnStatus.IN_PROGRESS, TurnStatus.QUEUED]
)
def test_non_promotable_statuses(status: TurnStatus) -> None:
    assert rejected_reason(make_turn(status=status)) is RejectionReason.NOT_PROMOTABLE_STATUS


def test_status_is_checked_before_integrity() -> None:
    turn = make_turn(status="failed", items=[tampered(say())])
    assert rejected_reason(turn) is RejectionReason.NOT_PROMOTABLE_STATUS


def test_format_is_checked_before_type_and_digest() -> None:
    weird = make_item("future_item", {}, item_id="x1", format_version=2)
    assert rejected_reason(make_turn(items=[tampered(weird)])) is RejectionReason.UNSUPPORTED_FORMAT


def test_unknown_fingerprint_item_format_version_is_unsupported_format() -> None:
    """The fingerprint's ``item_format_version`` this build cannot read is
    ``UNSUPPORTED_FORMAT`` (before the fingerprint hash is checked). Found by a mutation
    review: the check could be dropped with every test passing."""
    fingerprint = make_fingerprint(item_format_version=2)
    turn = make_turn(fingerprint=fingerprint)
    assert turn.fingerprint.item_format_version == 2
    assert rejected_reason(turn) is RejectionReason.UNSUPPORTED_FORMAT


def test_unknown_fingerprint_version_is_unsupported_format() -> None:
    fingerprint = make_fingerprint().model_copy(update={"fingerprint_version": 2})
    assert rejected_reason(make_turn(fingerprint=fingerprint)) is RejectionReason.UNSUPPORTED_FORMAT


# --- CORRUPT ------------------------------------------------------------------------------


def test_wrong_fingerprint_hash_is_corrupt() -> None:
    assert rejected_reason(make_turn(fingerprint_hash="0" * 64)) is RejectionReason.CORRUPT


def test_tampered_input_item_is_corrupt() -> None:
    turn = make_turn(input_items=[tampered(say("q", "user"))])
    assert rejected_reason(turn) is RejectionReason.CORRUPT


def test_effective_config_disagreeing_with_fingerprint_is_corrupt() -> None:
    config = EffectiveConfig(
        instructions_digest="1" * 64,
        tools_digest=make_fingerprint().tools_digest or "",
        truncation="disabled",
        truncated=False,
    )
    assert rejected_reason(make_turn(effective_config=config)) is RejectionReason.CORRUPT


# --- INCOMPLETE_FINGERPRINT ---------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        {"model_weights_revision": None},
        {"model_weights_revision": "main"},
        {"tokenizer_revision": ""},
        {"block_size": None},
        {"renderer_version": None},
        {"lora_name": "my-lora"},  # a LoRA without a revision
        # Found by a mutation review: each of these passed with its check weakened.
        {"block_size": 0},  # must be > 0
        {"tokenizer_name": "   "},  # whitespace only is absent
        {"model_weights_revision": "Main"},  # a mutable ref whatever its case
        {"model_weights_revision": " latest "},  # ... and its surrounding blanks
    ],
    ids=str,
)
def test_incomplete_fingerprints(overrides: dict) -> None:
    turn = make_turn(fingerprint=make_fingerprint(**overrides))
    assert rejected_reason(turn) is RejectionReason.INCOMPLETE_FINGERPRINT


def test_model_alias_alone_is_not_an_identity() -> None:
    fingerprint = make_fingerprint(model_name="gpt-oss", model_weights_revision=None)
    assert (
        rejected_reason(make_turn(fingerprint=fingerprint))
        is RejectionReason.INCOMPLETE_FINGERPRINT
    )


# --- pairing --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "items",
    [
        [call("a"), out("a"), say()],
        [think(), call("a"), call("b"), out("b"), out("a"), think("2"), say()],
        [say(), call("a")],  # client tool: open call at the end
        [call("a"), call("b"), out("a")],  # one answered by the gateway, one by the client
    ],
    ids=["simple", "parallel", "client-tool", "mixed"],
)
def test_legal_pairings(items) -> None:
    assert isinstance(check_pairing(items), PairingState)


@pytest.mark.parametrize(
    "items",
    [
        [out("a")],  # output without call
        [out("a"), call("a")],  # output before its call
        [call("a"), out("a"), out("a")],  # answered twice
        [call("a"), out("a"), call("a"), out("a")],  # call_id reused
        [call("a"), say()],  # open call not at the end
        [say(), think()],  # reasoning at the end
        [make_item("function_call", {}, item_id="fc_none")],  # no call_id (CORRUPT first)
    ],
    ids=[
        "orphan-output",
        "output-first",
        "answered-twice",
        "reused-id",
        "open-mid",
        "trailing-reasoning",
        "no-call-id",
    ],
)
def test_illegal_pairings(items) -> None:
    assert isinstance(check_pairing(items), Unpaired)


def test_pairing_continues_across_the_history() -> None:
    history = [say("q", "user"), call("a")]
    state = pairing_state_of(history)
    assert state == PairingState(frozenset({"a"}), (("a", "function_call"),))
    # the next turn answers the client tool first
    assert isinstance(check_pairing([out("a"), say()], state), PairingState)
    # ...or does not, and the open call is no longer at the end
    assert isinstance(check_pairing([say("again", "user")], state), Unpaired)
    # a call_id from an earlier turn cannot be reused
    assert isinstance(check_pairing([call("a")], PairingState(frozenset({"a"}))), Unpaired)


def test_validate_turn_uses_the_prior_pairing_state() -> None:
    turn = make_turn(input_items=[out("a")], items=[say()])
    assert rejected_reason(turn) is RejectionReason.UNPAIRED_TOOL_CALL
    prior = PairingState(frozenset({"a"}), (("a", "function_call"),))
    outcome = validate_turn(turn, NOW_MS, prior=prior)
    assert isinstance(outcome, Valid)
    assert outcome.pairing == PairingState(frozenset({"a"}), ())


def test_input_then_output_order() -> None:
    turn = make_turn(input_items=[say("q", "user"), call("a")], items=[out("a"), say()])
    assert isinstance(validate_turn(turn, NOW_MS), Valid)


# --- boundary proof -----------------------------------------------------------------------


def _proof_turn(proof_changes=None, artifact_changes=None, **kw):
    base = make_turn(**kw)
    artifact = base.token_artifact.model_copy(update=artifact_changes or {})
    proof = base.boundary_proof.model_copy(update=proof_changes or {})
    return make_turn(
        token_artifact=artifact, boundary_proof=proof, fingerprint_hash=base.fingerprint_hash, **kw
    )


@pytest.mark.parametrize(
    ("proof_changes", "artifact_changes"),
    [
        ({"fingerprint_hash": "e" * 64}, None),
        (None, {"fingerprint_hash": "e" * 64}),
        ({"prefix_count": 1}, None),  # prefix + append != combined
        ({"combined_count": 999, "prefix_count": 919}, None),  # != artifact token_count
        ({"combined_hash": "d" * 64}, None),
        (None, {"safe_append_boundary": 10_000}),
        ({"prefix_count": 1, "expires_at": NOW_MS - 1}, None),  # expired AND broken
    ],
    ids=[
        "proof-fp",
        "artifact-fp",
        "sum",
        "artifact-count",
        "artifact-hash",
        "boundary",
        "expired-and-broken",
    ],
)
def test_invalid_boundary_proofs(proof_changes, artifact_changes) -> None:
    turn = _proof_turn(proof_changes, artifact_changes)
    assert rejected_reason(turn) is RejectionReason.INVALID_BOUNDARY_PROOF


def test_proof_without_artifact_is_invalid() -> None:
    turn = make_turn()
    assert (
        rejected_reason(
            make_turn(
                boundary_proof=turn.boundary_proof,
                token_artifact=None,
                fingerprint_hash=turn.fingerprint_hash,
            )
        )
        is RejectionReason.INVALID_BOUNDARY_PROOF
    )


# --- router receipt (session 52) ----------------------------------------------------------


def _receipt(**changes) -> RouterReceipt:
    """A receipt that binds to ``make_turn``'s turn (its router key format, covering the
    artifact's 200 tokens), changed."""
    fields = {"receipt_id": "rcpt_1", "router_key_format": make_fingerprint().router_key_format,
              "covered_tokens": 200, "expires_at": NOW_MS + HOUR_MS, "issuer": "router-0"}
    return RouterReceipt(**{**fields, **changes})


@pytest.mark.parametrize("covered", [0, 64, 200])
def test_a_receipt_that_binds_to_its_turn_is_kept(covered) -> None:
    assert reusable(make_turn(router_receipt=_receipt(covered_tokens=covered)))


@pytest.mark.parametrize("changes", [
    {"router_key_format": "another-router-key-format"},
    {"router_key_format": ""},
    {"covered_tokens": 201},  # one more than the artifact's token_count
    {"covered_tokens": 10**9},
    {"covered_tokens": -1},
    {"receipt_id": ""},
    {"issuer": ""},
    {"covered_tokens": -1, "expires_at": NOW_MS - 1},  # expired AND broken
], ids=["key-format", "empty-key-format", "one-over", "far-over", "negative", "no-id",
        "no-issuer", "expired-and-broken"])
@pytest.mark.parametrize("status", [TurnStatus.COMPLETED, TurnStatus.INCOMPLETE])
def test_a_receipt_that_does_not_bind_to_its_turn_is_invalid(changes, status) -> None:
    """CONTRACT 1: a checkpoint binds the fingerprint (the router key format is one of
    its components) and the artifact; none proves another. A receipt naming another
    router key format, or covering tokens the artifact does not have, would be handed
    back as part of a certified checkpoint: refused like a proof that does not bind
    (also for a turn that ends up logical_only: a broken receipt means a broken
    gateway), on and off the lineage. Before session 52 each was promoted and kept."""
    turn = make_turn(router_receipt=_receipt(**changes), status=status)
    assert rejected_reason(turn) is RejectionReason.INVALID_BOUNDARY_PROOF
    off = validate_off_lineage(turn, NOW_MS)
    assert isinstance(off, Rejected) and off.reason is RejectionReason.INVALID_BOUNDARY_PROOF


def test_a_receipt_without_an_artifact_is_invalid() -> None:
    """Like a proof without an artifact: a receipt covers the artifact's tokens, and
    there are none to cover."""
    turn = make_turn(certified=False, router_receipt=_receipt(covered_tokens=0))
    assert rejected_reason(turn) is RejectionReason.INVALID_BOUNDARY_PROOF


def test_an_expired_receipt_that_binds_is_not_a_rejection() -> None:
    """Expiry decides reuse, never promotion (section 4 of docs/gateway-protocol.md)."""
    turn = make_turn(router_receipt=_receipt(expires_at=NOW_MS - 1))
    assert certification(turn) is Certification.CERTIFIED


# --- certification ------------------------------------------------------------------------


def certification(turn, now_ms: int = NOW_MS) -> Certification:
    outcome = validate_turn(turn, now_ms)
    assert isinstance(outcome, Valid), outcome
    return outcome.certification


def reusable(turn, now_ms: int = NOW_MS) -> bool:
    outcome = validate_turn(turn, now_ms)
    assert isinstance(outcome, Valid), outcome
    return outcome.artifact_reusable


def test_completed_with_artifact_and_proof_is_certified() -> None:
    assert certification(make_turn()) is Certification.CERTIFIED


def test_tool_loop_turn_is_certified() -> None:
    turn, effects = make_tool_loop_turn(rounds=3, total_items=20)
    assert len(turn.items) == 20 and len(effects) == 3
    assert certification(turn) is Certification.CERTIFIED


def test_incomplete_is_logical_only() -> None:
    assert certification(make_turn(status="incomplete")) is Certification.LOGICAL_ONLY


def test_truncated_is_logical_only() -> None:
    fingerprint = make_fingerprint()
    config = EffectiveConfig(
        instructions_digest=fingerprint.instructions_digest,
        tools_digest=fingerprint.tools_digest,
        truncation="auto",
        truncated=True,
    )
    assert certification(make_turn(effective_config=config)) is Certification.LOGICAL_ONLY


# A completed turn without a usable artifact is a certified logical history without a
# reusable artifact (rehydration falls back NO_ARTIFACT), not logical_only (CONTRACT 5).


def test_completed_with_artifact_and_proof_has_a_reusable_artifact() -> None:
    assert reusable(make_turn())


def test_no_artifact_is_certified_without_a_reusable_artifact() -> None:
    turn = make_turn(certified=False)
    assert certification(turn) is Certification.CERTIFIED and not reusable(turn)


def test_artifact_without_proof_is_certified_without_a_reusable_artifact() -> None:
    turn = make_turn()
    without_proof = make_turn(
        boundary_proof=None,
        token_artifact=turn.token_artifact,
        fingerprint_hash=turn.fingerprint_hash,
    )
    assert (
        certification(without_proof) is Certification.CERTIFIED and not reusable(without_proof)
    )


def test_expired_artifact_is_certified_without_a_reusable_artifact() -> None:
    artifact, proof = make_artifact_and_proof(make_turn().fingerprint_hash)
    artifact = artifact.model_copy(update={"expires_at": NOW_MS - 1})
    proof = proof.model_copy(update={"expires_at": NOW_MS + HOUR_MS})
    turn = make_turn(token_artifact=artifact, boundary_proof=proof)
    assert certification(turn) is Certification.CERTIFIED and not reusable(turn)


@pytest.mark.parametrize("expires_at", [NOW_MS, NOW_MS - 1, NOW_MS - 30 * 24 * HOUR_MS])
def test_a_proof_expired_before_processing_costs_the_reuse_not_the_promotion(expires_at):
    """A backlog (a worker down longer than the proofs' lifetime) must not reject the
    turns it holds: whether a turn is promoted never depends on how soon the worker got
    to it. A consistent proof that has expired (``expires_at <= now``) leaves the turn
    certified without a reusable artifact (reads fall back ``NO_ARTIFACT``), as an
    expired artifact does. It was ``INVALID_BOUNDARY_PROOF`` before session 43."""
    turn = _proof_turn({"expires_at": expires_at}, None)
    assert certification(turn) is Certification.CERTIFIED and not reusable(turn)
    assert reusable(turn, now_ms=expires_at - 1)
    assert isinstance(validate_off_lineage(turn, NOW_MS), OffLineage)
    assert not validate_off_lineage(turn, NOW_MS).artifact_reusable


def test_artifact_expiring_now_is_not_reusable() -> None:
    """An artifact is reusable only while ``expires_at > now`` (the proof's and the
    read's boundary alike: ``expires_at <= now`` is expired). Found by a mutation review:
    ``>=`` passed every test."""
    artifact, proof = make_artifact_and_proof(make_turn().fingerprint_hash)
    artifact = artifact.model_copy(update={"expires_at": NOW_MS})
    turn = make_turn(token_artifact=artifact, boundary_proof=proof)
    assert certification(turn) is Certification.CERTIFIED and not reusable(turn)
    assert reusable(turn, now_ms=NOW_MS - 1)


def test_chain_mode_turn_is_valid() -> None:
    turn = make_turn(
        conversation_id=None,
        chain_root_id="resp_root",
        expected_head_seq=None,
        previous_response_id="resp_root",
    )
    assert certification(turn) is Certification.CERTIFIED
    assert turn.partition_key == "resp_root"


def test_results_are_frozen() -> None:
    outcome = validate_turn(make_turn(), NOW_MS)
    with pytest.raises(AttributeError):
        outcome.certification = Certification.LOGICAL_ONLY  # type: ignore[misc]
    assert PairingState() == EMPTY_PAIRING


# --- CORRUPT: ids the API cannot serve, mode, item ids, duplicate JSON keys (session 18) ---


def rejection(turn, now_ms: int = NOW_MS) -> Rejected:
    outcome = validate_turn(turn, now_ms)
    assert isinstance(outcome, Rejected), outcome
    return outcome


def raw_item(content: bytes, *, item_type: str = "message", item_id: str = "msg_raw",
             role: str | None = "assistant"):
    """An item whose content bytes are exactly ``content`` (with their true digest)."""
    return make_item(item_type, {}, item_id=item_id, role=role).model_copy(
        update={"content": content, "content_digest": sha256_hex(content)})


CHAIN = dict(conversation_id=None, expected_head_seq=None)
UNSERVABLE_IDS = {
    # field: turn fields carrying an id the API's pattern refuses there
    "response_id": dict(response_id="dl 8-x"),
    "tenant_id": dict(tenant_id="tenant/1"),
    "conversation_id": dict(conversation_id="conv 1"),
    "chain_root_id": dict(**CHAIN, chain_root_id="root\n"),
    "previous_response_id": dict(**CHAIN, chain_root_id="resp_root",
                                 previous_response_id="resp_" + "x" * 200),
}


@pytest.mark.parametrize("field", UNSERVABLE_IDS)
def test_an_id_the_api_cannot_serve_is_corrupt(field) -> None:
    found = rejection(make_turn(**UNSERVABLE_IDS[field]))
    assert found.reason is RejectionReason.CORRUPT
    assert found.detail.startswith(f"{field} ") and "id pattern" in found.detail


def test_every_id_the_api_serves_is_checked() -> None:
    assert set(UNSERVABLE_IDS) == set(SERVED_ID_FIELDS)


def test_ids_at_the_edge_of_the_pattern_are_valid() -> None:
    longest = "r" * 200
    turn = make_turn(response_id=longest, tenant_id="t.a:b-c_D9", conversation_id="c" * 200)
    assert isinstance(validate_turn(turn, NOW_MS), Valid)


@pytest.mark.parametrize("dots", [".", ".."])
def test_a_dot_segment_id_is_corrupt(dots) -> None:
    # HTTP clients remove "." and ".." path segments (RFC 3986 5.2.4): httpx sends
    # /v1/responses/../history as /v1/history, so such a history could never be read
    # (found by an outside review of the HTTP surface, 2026-12-04).
    found = rejection(make_turn(response_id=dots))
    assert found.reason is RejectionReason.CORRUPT and found.detail.startswith("response_id ")
    assert rejection(make_turn(conversation_id=dots)).reason is RejectionReason.CORRUPT


@pytest.mark.parametrize("near", ["...", ".a", "..a", "a.", "a..b", "." + "x" * 199,
                                  ".." + "x" * 198])
def test_ids_with_dots_that_are_not_dot_segments_are_valid(near) -> None:
    assert isinstance(validate_turn(make_turn(response_id=near), NOW_MS), Valid)


def test_conversation_turn_with_previous_response_id_is_corrupt() -> None:
    found = rejection(make_turn(previous_response_id="resp_other"))
    assert found.reason is RejectionReason.CORRUPT
    assert "previous_response_id" in found.detail and "must be null" in found.detail


def test_two_items_with_one_item_id_are_corrupt() -> None:
    # Two mcp_calls sharing an id: only one of them would be compared with its effect.
    first = mcp_call("docs", "search", {"q": "a"}, "found a", item_id="mcp_1")
    second = mcp_call("docs", "search", {"q": "b"}, "found b", item_id="mcp_1")
    found = rejection(make_turn(items=[first, second]))
    assert found.reason is RejectionReason.CORRUPT
    assert "mcp_1" in found.detail and "not unique" in found.detail


def test_an_item_id_repeated_across_input_and_output_is_corrupt() -> None:
    turn = make_turn(input_items=[say("q", "user")],
                     items=[message("a", role="assistant", item_id="msg_q_user")])
    assert rejection(turn).reason is RejectionReason.CORRUPT


@pytest.mark.parametrize("content", [
    b'{"type":"hologram_call","id":"msg_raw","type":"message","role":"assistant",'
    b'"content":"hi"}',
    b'{"content":[{"type":"output_text","text":"a","text":"b"}],"id":"msg_raw",'
    b'"role":"assistant","type":"message"}',
    b'{"content":[{"x":{"k":1,"k":1}}],"id":"msg_raw","role":"assistant","type":"message"}',
], ids=["top-level type", "nested", "deep, same value"])
def test_content_with_a_duplicate_key_is_corrupt(content) -> None:
    found = rejection(make_turn(items=[raw_item(content)]))
    assert found.reason is RejectionReason.CORRUPT
    assert "twice" in found.detail


def test_non_canonical_content_without_duplicate_keys_stays_valid() -> None:
    # Canonical form is not required (canonicalisers differ on numbers): only duplicates.
    content = (b'{ "type": "message", "id": "msg_raw", "role": "assistant",\n'
               b'  "content": [{"type": "output_text", "text": "x", "score": 1.0E3}] }')
    assert isinstance(validate_turn(make_turn(items=[raw_item(content)]), NOW_MS), Valid)


@pytest.mark.parametrize("number", [
    b"1e400", b"-1e400", b"1E+309", b"0.1e310", b"1" + b"0" * 400 + b".5",
], ids=["1e400", "-1e400", "1E+309", "0.1e310", "400 digits and a fraction"])
@pytest.mark.parametrize("spacing", ["canonical", "spaced"])
def test_content_with_a_number_beyond_a_double_is_corrupt(number, spacing) -> None:
    # Parsed, such a number is infinity: no canonical JSON, no digest. Never promoted.
    content = (b'{"content":[{"annotations":[],"score":' + number + b',"text":"x",'
               b'"type":"output_text"}],"id":"msg_raw","role":"assistant","type":"message"}')
    if spacing == "spaced":
        content = content.replace(b",", b", ")
    found = rejection(make_turn(items=[raw_item(content)]))
    assert found.reason is RejectionReason.CORRUPT
    assert "msg_raw" in found.detail and "beyond the range of a double" in found.detail
    # what a double (or an exact integer) holds stays valid, however it is spelt
    for held in (b"1.7976931348623157e308", b"-1.7976931348623157E+308", b"1e-400",
                 b"1" + b"0" * 400):
        valid = raw_item(content.replace(number, held))
        assert isinstance(validate_turn(make_turn(items=[valid]), NOW_MS), Valid), held
