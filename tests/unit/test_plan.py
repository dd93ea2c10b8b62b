"""The store's pure planner (ratchet/domain/plan.py): one request over one view gives an
outcome or a plan; hints give only plans, and only the plan a fresh view would give."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from ratchet.domain.history import Head, PromotionMode, items_digest, lineage_digest
from ratchet.domain.plan import (
    AheadOfHead,
    Conflict,
    CorruptPartition,
    Duplicate,
    IdempotencyRecord,
    KeyReused,
    ParentMissing,
    Plan,
    PromotionView,
    ResponseExists,
    build_checkpoint,
    check_view_filing,
    plan_from_hints,
    plan_promotion,
)
from tests.contract.store_support import T0, chain_turn, conversation_turn


def checkpoint_of(request, plan: Plan):
    return build_checkpoint(request, plan, T0, logical_retention_s=0)


def backing(head: Head):
    """The head turn's own row: what a view reads beside the head cells."""
    first = conversation_turn("t", "conv", 0, n_items=1, response_id=head.response_id)
    row = checkpoint_of(first, plan_promotion(first, PromotionView(None)))
    return replace(row, seq=head.seq, last_item_seq=head.item_count,
                   lineage_digest=head.lineage_digest)


def viewing(head: Head, *args, **kwargs) -> PromotionView:
    """A view of ``head`` read with its backing row."""
    return PromotionView(head, *args, head_backing=backing(head), **kwargs)


def test_a_new_conversation_starts_at_seq_one():
    request = conversation_turn("t", "conv", 0, n_items=3)
    plan = plan_promotion(request, PromotionView(head=None))
    digest = lineage_digest(None, items_digest(request.items))
    assert plan == Plan(seq=1, parent_response_id=None, first_item_seq=1, expected_head=None,
                        new_head=Head(1, request.response_id, 3, digest), lineage_digest=digest)
    assert checkpoint_of(request, plan).lineage_digest == digest


def test_the_lineage_digest_chains_from_the_head_or_stays_absent_after_a_legacy_one():
    request = conversation_turn("t", "conv", 2, n_items=2)
    linked = plan_promotion(request, viewing(Head(2, "resp_2", 5, "ab" * 32)))
    assert linked.lineage_digest == lineage_digest("ab" * 32, items_digest(request.items))
    assert linked.new_head.lineage_digest == linked.lineage_digest
    # A head promoted before lineage digests existed: nothing to chain from, so none
    # (an unlinked lineage is read in full, never extended; history.py).
    legacy = plan_promotion(request, viewing(Head(2, "resp_2", 5)))
    assert legacy.lineage_digest is None and legacy.new_head.lineage_digest is None


def test_the_next_turn_extends_the_head_it_expects():
    head = Head(2, "resp_2", 5)
    request = conversation_turn("t", "conv", 2, n_items=2)
    plan = plan_promotion(request, viewing(head))
    assert (plan.seq, plan.parent_response_id, plan.first_item_seq) == (3, "resp_2", 6)
    assert plan.expected_head == head and plan.new_head == Head(3, request.response_id, 7)
    assert plan.lineage_digest is None  # the hinted head carries none


def test_a_head_behind_or_ahead_of_the_expected_one_is_an_outcome():
    head = Head(2, "resp_2", 5)
    assert plan_promotion(conversation_turn("t", "c", 1), viewing(head)) == Conflict(2)
    assert plan_promotion(conversation_turn("t", "c", 3), viewing(head)) == AheadOfHead(2)


def test_the_idempotency_record_decides_before_the_head():
    request = conversation_turn("t", "conv", 0)
    original = checkpoint_of(request, plan_promotion(request, PromotionView(None)))
    same = IdempotencyRecord(request.idempotency_key, request.request_digest, "resp_o")
    other = IdempotencyRecord(request.idempotency_key, "another digest", "resp_o")
    head = Head(9, "resp_9", 9)  # would be a Conflict: the key answers first

    assert plan_promotion(request, PromotionView(head, same, original)) == Duplicate(original)
    assert plan_promotion(request, PromotionView(head, other)) == KeyReused("another digest",
                                                                            "resp_o")
    with pytest.raises(CorruptPartition):  # a key pointing at no checkpoint
        plan_promotion(request, PromotionView(head, same, original=None))
    assert plan_promotion(request, PromotionView(head, existing=original)) == ResponseExists(
        original)


def test_a_chain_extends_its_parent_or_finds_it_missing():
    root = chain_turn("t", "resp_r", "resp_r", None, n_items=2)
    root_plan = plan_promotion(root, PromotionView(None))
    assert root_plan == Plan(seq=1, parent_response_id=None, first_item_seq=1,
                             lineage_digest=lineage_digest(None, items_digest(root.items)))
    parent = checkpoint_of(root, root_plan)

    child = chain_turn("t", "resp_r", "resp_c", "resp_r", n_items=3)
    plan = plan_promotion(child, PromotionView(None, parent=parent))
    assert (plan.seq, plan.parent_response_id, plan.first_item_seq, plan.parent) == (
        2, "resp_r", 3, parent)
    assert plan.lineage_digest == lineage_digest(parent.lineage_digest, items_digest(child.items))
    assert plan_promotion(child, PromotionView(None)) == ParentMissing("resp_r")


def test_hints_give_the_plan_a_fresh_view_would_give_never_an_outcome():
    head = Head(2, "resp_2", 5)
    request = conversation_turn("t", "conv", 2)
    assert plan_from_hints(request, head, None) == plan_promotion(request, viewing(head))
    # A hint that predicts an outcome (Conflict) or no hint at all: read and decide.
    assert plan_from_hints(conversation_turn("t", "conv", 1), head, None) is None
    assert plan_from_hints(request, None, None) is None
    # A new conversation or a chain root needs no hint.
    first = conversation_turn("t", "conv", 0)
    assert plan_from_hints(first, None, None) == plan_promotion(first, PromotionView(None))


def test_a_parent_hint_of_another_partition_or_response_is_not_used():
    root = chain_turn("t", "resp_r", "resp_r", None)
    parent = checkpoint_of(root, plan_promotion(root, PromotionView(None)))
    child = chain_turn("t", "resp_r", "resp_c", "resp_r")
    assert plan_from_hints(child, None, parent) == plan_promotion(
        child, PromotionView(None, parent=parent))
    elsewhere = chain_turn("t", "another_root", "resp_c", "resp_r")
    assert plan_from_hints(elsewhere, None, parent) is None
    orphan = chain_turn("t", "resp_r", "resp_c", "resp_x")
    assert plan_from_hints(orphan, None, parent) is None


def test_the_checkpoint_a_plan_persists():
    request = conversation_turn("t", "conv", 0, n_items=3)
    plan = plan_promotion(request, PromotionView(None))
    checkpoint = build_checkpoint(request, plan, T0, logical_retention_s=60)
    assert checkpoint.mode is PromotionMode.CONVERSATION
    assert (checkpoint.seq, checkpoint.first_item_seq, checkpoint.last_item_seq) == (1, 1, 3)
    assert checkpoint.items_digest == items_digest(request.items)
    assert checkpoint.logical_expires_at == T0 + timedelta(seconds=60)
    assert build_checkpoint(request, plan, T0, 0).logical_expires_at is None


@pytest.mark.parametrize("cells", [
    {"item_count": 4}, {"lineage_digest": "00"}, {"response_id": "resp_x"}, {"seq": 3},
])
def test_a_head_its_row_does_not_back_is_corrupt_never_built_on(cells):
    """The head cells are a copy of the head turn's own values, written in one batch;
    the next turn's item seqs and lineage digest are built from them. Cells their row
    does not back (an outside review: a damaged ``head_item_count`` or
    ``head_lineage_digest`` was built on, and the Conversation then read as corrupt)
    are ``CorruptPartition``, whatever the turn expects."""
    head = Head(2, "resp_2", 5, "ab" * 32)
    damaged = replace(head, **cells)
    for expected in (1, 2, 3):
        request = conversation_turn("t", "conv", expected)
        with pytest.raises(CorruptPartition):
            plan_promotion(request, PromotionView(damaged, head_backing=backing(head)))
    with pytest.raises(CorruptPartition):  # no row at all behind the head
        plan_promotion(conversation_turn("t", "conv", 2), PromotionView(head))


def test_a_lost_head_of_a_begun_conversation_is_corrupt_not_a_new_one():
    """Head cells lost while the Conversation's turns stand: a turn expecting 0 must
    not start the Conversation again over them (an outside review: it was promoted at
    seq 1 beside the old seq 1, and every read was corrupt from then on)."""
    request = conversation_turn("t", "conv", 0)
    with pytest.raises(CorruptPartition):
        plan_promotion(request, PromotionView(None, conversation_begun=True))
    assert isinstance(plan_promotion(request, PromotionView(None)), Plan)
    chain = chain_turn("t", "conv", "resp_r", None)  # a chain of the same key has no head
    assert isinstance(plan_promotion(chain, PromotionView(None, conversation_begun=True)), Plan)


def test_logical_expiry_is_the_earlier_of_the_gateways_and_the_retention():
    """CONTRACT 5: logical expiry honours ``TurnCompleted.expires_at``, capped by the
    server's retention. Found by a mutation review: the later of the two (``max``) passed
    every test (no test gave both)."""
    request = conversation_turn("t", "conv", 0)
    plan = plan_promotion(request, PromotionView(None))
    soon, late = T0 + timedelta(seconds=30), T0 + timedelta(seconds=120)
    assert build_checkpoint(replace(request, expires_at=soon), plan, T0,
                            logical_retention_s=60).logical_expires_at == soon
    assert build_checkpoint(replace(request, expires_at=late), plan, T0,
                            logical_retention_s=60).logical_expires_at == T0 + timedelta(seconds=60)
    assert build_checkpoint(replace(request, expires_at=late), plan, T0,
                            logical_retention_s=0).logical_expires_at == late


def test_a_chain_turn_never_extends_a_conversation_turn():
    """A chain turn whose partition holds a Conversation turn under its parent's id (a
    chain root id equal to a Conversation id) finds no chain parent: ``ParentMissing``,
    never a child of the Conversation turn (the read would find a lineage of two modes).
    Found by a mutation review: the parent's mode was unchecked by every test."""
    first = conversation_turn("t", "shared", 0, response_id="resp_conv")
    conversation_row = checkpoint_of(first, plan_promotion(first, PromotionView(None)))
    child = chain_turn("t", "shared", "resp_c", "resp_conv")
    assert plan_promotion(child, PromotionView(None, parent=conversation_row)) == \
        ParentMissing("resp_conv")


def test_a_chain_parent_the_view_shows_is_a_conversation_row_is_corrupt():
    """A Conversation row whose ``mode`` cell reads ``chain`` (damage), as a chain turn's
    parent: ``CorruptPartition`` where the view tells (the head names it, or its links
    disagree: a chain row's parent is its ``previous_response_id``), and a hint of it
    gives no plan (the view decides). A chain parent with agreeing links that no head
    names still plans (a root: both links None). Session 48."""
    first = conversation_turn("t", "shared", 0, response_id="resp_1")
    row_1 = checkpoint_of(first, plan_promotion(first, PromotionView(None)))
    head_1 = Head(1, "resp_1", row_1.last_item_seq, row_1.lineage_digest)
    second = conversation_turn("t", "shared", 1, response_id="resp_2")
    row_2 = checkpoint_of(second, plan_promotion(second, viewing(head_1)))
    head_2 = Head(2, "resp_2", row_2.last_item_seq, row_2.lineage_digest)
    assert (row_2.parent_response_id, row_2.previous_response_id) == ("resp_1", None)
    flipped_1, flipped_2 = (replace(row, mode=PromotionMode.CHAIN) for row in (row_1, row_2))
    for parent, head in ((flipped_1, head_1), (flipped_2, head_2), (flipped_2, None)):
        child = chain_turn("t", "shared", "resp_c", parent.response_id)
        with pytest.raises(CorruptPartition):
            plan_promotion(child, PromotionView(head, parent=parent))
        assert plan_from_hints(child, head, parent) is None
    # The first turn of two, its cells a chain root's, no head naming it: a root outside
    # its own partition (a chain's first response is its key; session 49, planned before).
    child = chain_turn("t", "shared", "resp_c", "resp_1")
    with pytest.raises(CorruptPartition):
        plan_promotion(child, PromotionView(head_2, parent=flipped_1))
    assert plan_from_hints(child, head_2, flipped_1) is None
    # Left to a read (``_check_chain``): that turn with the Conversation's own id as its
    # response id, under that id a root's cells exactly.
    own = conversation_turn("t", "shared", 0, response_id="shared")
    own_row = replace(checkpoint_of(own, plan_promotion(own, PromotionView(None))),
                      mode=PromotionMode.CHAIN)
    child = chain_turn("t", "shared", "resp_c", "shared")
    assert isinstance(plan_promotion(child, PromotionView(head_2, parent=own_row)), Plan)


def test_a_root_off_its_key_is_refused_only_where_the_view_shows_a_conversation():
    """A chain root filed under another key before the processor refused one (a gateway
    naming its chain's partition as the first response's ``chain_root_id``): with no
    Conversation in the view (no head, no marker) it is the root it reads as and a turn
    on it plans (the reads verify it; session 49 raised ``CorruptPartition`` here, rrevj).
    With a head or the Conversation's marker, the damaged Conversation row it is
    refused. A hint never shows the marker: no plan from it, the view decides."""
    old = chain_turn("t", "elsewhere", "resp_root", None)
    root = checkpoint_of(old, plan_promotion(old, PromotionView(None)))
    assert (root.response_id, root.partition_key) == ("resp_root", "elsewhere")
    child = chain_turn("t", "elsewhere", "resp_c", "resp_root")
    planned = plan_promotion(child, PromotionView(None, parent=root))
    assert isinstance(planned, Plan) and (planned.seq, planned.parent_response_id) == (
        2, "resp_root")
    head = Head(3, "resp_3", 6, None)
    for view in (PromotionView(head, parent=root),
                 PromotionView(None, parent=root, conversation_begun=True)):
        with pytest.raises(CorruptPartition):
            plan_promotion(child, view)
    assert plan_from_hints(child, None, root) is None


def test_a_view_row_filed_under_another_response_id_is_corrupt():
    """Each checkpoint row of a view (the original of the key, the response id's own, the
    chain parent) must name the id it was read for; one naming another is damage
    (session 50: a redelivery was ``Duplicate`` of the other id's record, a turn on it
    was planned on a parent by the wrong id). Rows filed right pass."""
    root = chain_turn("t", "root", "root", None)
    root_row = checkpoint_of(root, plan_promotion(root, PromotionView(None)))
    turn = chain_turn("t", "root", "resp_1", "root")
    row = checkpoint_of(turn, plan_promotion(turn, PromotionView(None, parent=root_row)))
    record = IdempotencyRecord(turn.idempotency_key, turn.request_digest, "resp_1")
    child = chain_turn("t", "root", "resp_2", "resp_1")
    other = replace(row, response_id="resp_9")
    for request, view in ((turn, PromotionView(None, idempotency=record, original=row)),
                          (turn, PromotionView(None, existing=row)),
                          (child, PromotionView(None, parent=row))):
        check_view_filing(request, view)
        misfiled = PromotionView(**{**view.__dict__, **{
            name: other for name in ("original", "existing", "parent")
            if getattr(view, name) is not None}})
        with pytest.raises(CorruptPartition, match="row filed under resp_1 names resp_9"):
            check_view_filing(request, misfiled)


@pytest.mark.parametrize("mode", ["conversation", "chain"])
def test_a_promotion_digests_its_items_once(monkeypatch, mode):
    """The plan's lineage digest and the checkpoint's items digest are made of one
    items digest, computed once per request (session 43: it was computed twice)."""
    import ratchet.domain.plan as plan_module

    calls = []

    def counted(items):
        calls.append(1)
        return items_digest(items)

    monkeypatch.setattr(plan_module, "items_digest", counted)
    request = (conversation_turn("t", "conv", 0, n_items=3) if mode == "conversation"
               else chain_turn("t", "root", "root", None, n_items=3))
    checkpoint = checkpoint_of(request, plan_promotion(request, PromotionView(head=None)))
    assert len(calls) == 1
    assert checkpoint.items_digest == items_digest(request.items)
    assert checkpoint.lineage_digest == lineage_digest(None, items_digest(request.items))
