"""``schemas.ids.unservable_id`` reads a model's ids with one getter per class
(``_ids_reader``, docs/decisions.md "The worker's Python calls per promoted turn
cut"): it must answer exactly what the name-by-name reading answers, for every kind of
gateway event and every id field, first offending field first."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ratchet.samples import make_tool_effect, make_turn, make_turn_cancelled
from schemas import ids
from schemas.models import TurnCompleted

TURN = make_turn(conversation_id="conv_1", expected_head_seq=0)
EVENTS = {
    "conversation turn": TURN,
    "chain turn": make_turn(conversation_id=None, chain_root_id="resp_root",
                            previous_response_id="resp_root", expected_head_seq=None),
    "tool effect": make_tool_effect("call_1", idempotency_key=TURN.idempotency_key),
    "cancellation": make_turn_cancelled(TURN),
}
BAD = ("", "a b", ".", "..", "x" * 201, "\u00e9", "ok\n")


def _by_name(event):
    """The same event as a plain object: ``unservable_id`` reads it name by name."""
    return SimpleNamespace(**{name: getattr(event, name) for name in type(event).model_fields})


@pytest.mark.parametrize("kind", sorted(EVENTS))
def test_a_models_ids_are_judged_as_read_name_by_name(kind):
    event = EVENTS[kind]
    assert ids._ids_reader(type(event)) is not None  # the getter, not the fallback
    assert ids.unservable_id(event) is None
    assert ids.unservable_id(_by_name(event)) is None
    judged = 0
    for name in ids.SERVED_ID_FIELDS + ids.KEY_ID_FIELDS:
        if name not in type(event).model_fields:
            continue
        for bad in BAD:
            changed = event.model_copy(update={name: bad})
            found = ids.unservable_id(changed)
            assert found is not None and found.startswith(f"{name} ")
            assert found == ids.unservable_id(_by_name(changed))
            judged += 1
    assert judged >= 6 * len(BAD)


def test_the_first_offending_field_is_named():
    turn = EVENTS["conversation turn"].model_copy(
        update={"idempotency_key": "a b", "tenant_id": "c d", "event_id": "e f"})
    assert ids.unservable_id(turn).startswith("tenant_id 'c d'")
    assert ids.unservable_id(_by_name(turn)).startswith("tenant_id 'c d'")


def test_a_class_that_fixes_no_attributes_is_read_name_by_name():
    assert ids._ids_reader(SimpleNamespace) is None

    class Open(TurnCompleted, extra="allow"):
        pass

    assert ids._ids_reader(Open) is None


def test_a_model_missing_an_attribute_is_judged_as_read_name_by_name():
    """A model built without validation (pydantic's ``model_construct``) may lack a
    field; a property may raise ``AttributeError``. Read name by name, such a name is
    absent (``getattr``'s default); the class's getter raised ``AttributeError`` out
    of ``unservable_id`` (a gateway's ``send``, the processor's identity check): no
    answer, not even for another id that is wrong (an outside review, session 46)."""
    cancelled = EVENTS["cancellation"]
    kind = type(cancelled)
    fields = {name: getattr(cancelled, name) for name in kind.model_fields}
    without_tenant = {name: value for name, value in fields.items() if name != "tenant_id"}
    partial = kind.model_construct(**without_tenant)
    assert not hasattr(partial, "tenant_id")
    assert ids.unservable_id(partial) is None
    assert ids.unservable_id(_present(partial)) is None
    bad = kind.model_construct(**{**without_tenant, "response_id": "a b"})
    found = ids.unservable_id(bad)
    assert found is not None and found.startswith("response_id 'a b'")
    assert found == ids.unservable_id(_present(bad))

    class Raising(kind):
        @property
        def effect_id(self):  # an id name the event has no field for
            raise AttributeError("no effect for this event")

    assert ids._ids_reader(Raising) is not None  # the getter reads the property
    raising = Raising(**{**fields, "event_id": "e f"})
    assert ids.unservable_id(raising).startswith("event_id 'e f'")
    assert ids.unservable_id(Raising(**fields)) is None


def _present(event):
    """``event``'s fields that it has, as a plain object (read name by name)."""
    return SimpleNamespace(**{name: getattr(event, name) for name in type(event).model_fields
                              if hasattr(event, name)})
def test_an_answer_remembered_is_the_events_own():
    """The last frozen event's answer is remembered (session 46, ``_last``): asked
    again, each event still gets its own answer, whatever was asked in between."""
    good = EVENTS["conversation turn"]
    bad = good.model_copy(update={"response_id": "a b"})
    worse = good.model_copy(update={"tenant_id": "c d"})
    fresh = {id(e): ids.unservable_id(_by_name(e)) for e in (good, bad, worse)}
    assert fresh[id(good)] is None and fresh[id(bad)] and fresh[id(worse)]
    for event in (good, good, bad, bad, good, worse, bad, worse, worse, good):
        assert ids.unservable_id(event) == fresh[id(event)]
        assert ids._last[0] is event  # remembered: frozen


def test_an_object_that_is_not_frozen_is_judged_every_time():
    open_event = _by_name(EVENTS["conversation turn"])
    assert ids.unservable_id(open_event) is None
    open_event.response_id = "a b"  # the same object, changed
    assert ids.unservable_id(open_event).startswith("response_id 'a b'")

    class Thawed(TurnCompleted, frozen=False):
        pass

    thawed = Thawed(**dict(EVENTS["conversation turn"]))
    assert ids.unservable_id(thawed) is None
    thawed.response_id = "a b"
    assert ids.unservable_id(thawed).startswith("response_id 'a b'")
    assert ids._last[0] is not thawed
