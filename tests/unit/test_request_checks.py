"""The store's own refusal of a request whose item content does not match its digest
(``validate_request``, services/store/request_checks.py): the first such item is named,
whatever its place, with the C speedups and with their Python twin (session 46: the
digests are checked by ``first_digest_mismatch`` in one call, not ``Item.digest_ok``
per item)."""

from __future__ import annotations

import pytest

from ratchet.domain import history
from services.store.errors import InvalidPromotion
from services.store.request_checks import validate_request
from tests.contract.store_support import conversation_turn, item


@pytest.fixture(params=["c", "python"])
def speedups(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setattr(history, "SPEEDUPS", None)
    elif history.SPEEDUPS is None:
        pytest.fail("ratchet._speedups is not built")
    return request.param


def _damaged(good, how: str):
    if how == "digest":
        return good.model_copy(update={"content_digest": "0" * 64})
    if how == "content":
        return good.model_copy(update={"content": good.content + b" "})
    return good.model_copy(update={"content_digest": good.content_digest.upper()})


@pytest.mark.parametrize("how", ["digest", "content", "uppercase"])
@pytest.mark.parametrize("n", [1, 2, 5])
def test_the_first_item_whose_content_does_not_match_is_named(speedups, n, how):
    for first_bad in range(n):
        items = [item(f"t{i}") for i in range(n)]
        for bad in range(first_bad, n, 2):
            items[bad] = _damaged(items[bad], how)
        request = conversation_turn("t", "conv", 0, items=tuple(items))
        with pytest.raises(InvalidPromotion) as refused:
            validate_request(request)
        assert str(refused.value) == (f"item {items[first_bad].item_id} content does not "
                                      "match its digest")


@pytest.mark.parametrize("n", [0, 1, 3])
def test_matching_items_pass(speedups, n):
    validate_request(conversation_turn("t", "conv", 0, n_items=n))
