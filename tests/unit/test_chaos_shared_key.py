"""The chaos workload's shared keys: a Conversation whose id is a chain's first response id.

docs/store.md, "Two histories in one partition": one tenant's Conversation ``X`` and its
chain whose first response is ``X`` share one Kafka key and one store partition and stay
two histories. The workload draws such pairs (``workload.shared_key_partner``), seeded
and the same in every process, the chain's stories before or after the Conversation's;
the oracle expects each story's outcomes as if the other were not there, and the checker
reports an answer of one history given for the other. (Before session 46 the ids carried
``conv-`` and ``resp-`` and never met: the memory-store mutant of session 45 passed
``test_chaos_oracle_agrees``; docs/decisions.md, "Two histories in one partition under
damage and in the chaos run".)
"""

from __future__ import annotations

import dataclasses

import pytest

from ratchet.chaos import damage
from ratchet.chaos.checker import check
from ratchet.chaos.oracle import expect
from ratchet.chaos.workload import generate, shared_key_partner
from schemas.models import TurnCompleted
from tests.unit.test_chaos_checker import answer, faithful


@pytest.fixture(scope="module")
def workload():
    return generate(seed=47, turns=1500, tag="unit")


@pytest.fixture(scope="module")
def expectations(workload):
    return [expect(s) for s in workload.stories]


def test_pairs_are_drawn_seeded_and_the_same_in_every_process(workload):
    again = generate(seed=47, turns=1500, tag="unit")
    assert [(c.sid, ch.sid) for c, ch in workload.shared_keys] == [
        (c.sid, ch.sid) for c, ch in again.shared_keys]
    assert len(workload.shared_keys) >= 8
    # A partner is found from the seed and the index alone (what each producer and the
    # oracle regenerate), and the chain's stories come before or after the Conversation's.
    for conversation, chain in workload.shared_keys:
        assert shared_key_partner(47, conversation.index) == chain.index
    after = [chain.index > conversation.index for conversation, chain in workload.shared_keys]
    assert any(after) and not all(after)
    # Another seed draws other pairs.
    other = generate(seed=46, turns=1500, tag="unit").shared_keys
    assert {c.index for c, _ in other} != {c.index for c, _ in workload.shared_keys}


def test_a_pair_is_one_tenant_and_one_key_and_each_chain_has_one_partner(workload):
    chains = [chain.sid for _, chain in workload.shared_keys]
    assert len(chains) == len(set(chains))
    conversation_ids = [s.key for s in workload.stories if s.kind == "conversation"]
    assert len(conversation_ids) == len(set(conversation_ids))
    for conversation, chain in workload.shared_keys:
        assert conversation.tenant == chain.tenant
        turns = [e for e in chain.events if isinstance(e, TurnCompleted)]
        # The chain's first response is its key, and that is the Conversation's id.
        assert turns[0].response_id == chain.key == conversation.key
        assert turns[0].previous_response_id is None
        first = next(e for e in conversation.events if isinstance(e, TurnCompleted))
        assert (first.conversation_id, first.expected_head_seq) == (conversation.key, 0)


def test_the_oracle_expects_two_histories(workload, expectations):
    """Each story of a pair is expected as if alone: the Conversation's first turn is
    promoted at seq 1 and so is the chain's first response, each history holds its own
    story's items only."""
    by_sid = {e.story.sid: e for e in expectations}
    for conversation, chain in workload.shared_keys:
        conv_world, chain_world = by_sid[conversation.sid].worlds[0], by_sid[chain.sid].worlds[0]
        root = chain_world.promoted.get(chain.key)
        first = next((p for p in conv_world.promoted.values() if p.seq == 1), None)
        assert root is not None and root.seq == 1 and root.conversation_id is None
        assert first is not None and first.conversation_id == conversation.key
        chain_items = {i for p in chain_world.promoted.values() for i in p.items}
        assert not chain_items & {i for p in conv_world.promoted.values() for i in p.items}


def _pair_with_histories(workload, expectations):
    by_sid = {e.story.sid: e for e in expectations}
    for conversation, chain in workload.shared_keys:
        cw, chw = by_sid[conversation.sid].worlds[0], by_sid[chain.sid].worlds[0]
        if cw.head and chain.key in chw.promoted and len(by_sid[chain.sid].worlds) == 1 \
                and len(by_sid[conversation.sid].worlds) == 1:
            head = next(p for p in cw.promoted.values()
                        if p.conversation_id == conversation.key and p.seq == cw.head)
            return conversation, chain, head, chw.promoted[chain.key]
    raise AssertionError("no pair with both histories promoted")


def test_the_checker_reports_one_history_answered_for_the_other(workload, expectations):
    """A store that merged the two (or an API that mixed them): the chain's first
    response answered with the Conversation's history, or the Conversation's with the
    chain's, is a ``history_mismatch``."""
    conversation, chain, head, root = _pair_with_histories(workload, expectations)
    assert check(expectations, faithful(expectations)) == []
    obs = faithful(expectations)
    obs.histories[(chain.tenant, chain.key)] = dataclasses.replace(
        answer(head), response_id=chain.key)
    assert {v.kind for v in check(expectations, obs)} == {"history_mismatch"}
    obs = faithful(expectations)
    obs.conversations[(conversation.tenant, conversation.key)] = answer(root)
    assert {v.kind for v in check(expectations, obs)} == {"history_mismatch"}


def test_the_damage_plan_damages_shared_partitions_first():
    """Up to two of each mode (where the oracle is sure of the story): the other
    history of the partition is then read again beside the damage."""
    expectations = [expect(s) for s in generate(seed=47, turns=400, tag="unit").stories]
    shared = damage._shared_partitions(expectations)
    stories = {e.story.sid: e.story for e in expectations}
    plan = damage.plan(expectations, 47)
    hit = [d for d in plan if (d.tenant, stories[d.sid].key) in shared]
    assert {d.conversation for d in hit} == {True, False}
    assert len(hit) == 2 * damage.SHARED_FIRST
