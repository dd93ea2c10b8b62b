"""The one eviction rule of the in-process caches (ratchet/lru.py)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from ratchet.lru import Lru


def test_the_least_recently_used_entry_goes_first():
    lru = Lru(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # a is now more recent than b
    lru.put("c", 3)
    assert (lru.get("a"), lru.get("b"), lru.get("c")) == (1, None, 3)
    assert len(lru) == 2


def test_rewriting_an_entry_refreshes_it_and_pop_forgets_it():
    lru = Lru(2)
    lru.put("a", 1)
    lru.put("b", 2)
    lru.put("a", 10)
    lru.put("c", 3)
    assert (lru.get("a"), lru.get("b")) == (10, None)
    lru.pop("a")
    lru.pop("missing")
    assert lru.get("a") is None and len(lru) == 1


def test_capacity_zero_keeps_nothing():
    lru = Lru(0)
    lru.put("a", 1)
    assert lru.get("a") is None and len(lru) == 0


def test_a_weighed_lru_evicts_until_the_total_weight_fits():
    lru = Lru(10, weigh=len)
    lru.put("a", "xxxx")
    lru.put("b", "yyyy")
    lru.put("a", "xx")  # rewriting re-weighs: 2 + 4
    assert lru.weight == 6
    lru.put("c", "zzzzzz")  # 12 > 10: the least recent (b) goes
    assert (lru.get("a"), lru.get("b"), lru.get("c")) == ("xx", None, "zzzzzz")
    assert lru.weight == 8
    lru.pop("c")
    assert lru.weight == 2 and len(lru) == 1


_ops = st.lists(st.tuples(st.sampled_from(["put", "get", "pop", "oldest"]),
                          st.integers(0, 6), st.integers(0, 3)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(st.integers(-1, 5), _ops)
def test_a_count_keeps_what_the_general_weighing_of_one_keeps(capacity, ops):
    """The default weigh (a count) takes a shortcut in ``put`` (no call per entry,
    session 46): it keeps, evicts and answers exactly as weighing each entry 1 does,
    and its weight is its length."""
    counted, weighed = Lru(capacity), Lru(capacity, weigh=lambda _value: 1)
    for op, key, value in ops:
        if op == "put":
            counted.put(key, value)
            weighed.put(key, value)
        elif op == "get":
            assert counted.get(key) == weighed.get(key)
        elif op == "pop":
            counted.pop(key)
            weighed.pop(key)
        else:
            assert counted.pop_oldest() == weighed.pop_oldest()
        assert list(counted._entries.items()) == list(weighed._entries.items())
        assert counted.weight == weighed.weight == len(counted)
