"""The chaos harness's own recipes reproduce the published vectors (docs/vectors/), and
its cross-check catches a product recipe that drifted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ratchet.chaos import recipes
from ratchet.chaos.workload import generate
from schemas.models import ToolEffect

VECTORS = Path(__file__).resolve().parents[2] / "docs" / "vectors"


def _load(name: str) -> dict:
    return json.loads((VECTORS / name).read_text())


def test_canonical_json_vectors() -> None:
    for case in _load("canonical-json.json")["cases"]:
        value = json.loads(case["input_json"])
        got = recipes.canonical(value)
        assert got.hex() == case["canonical_hex"], case["name"]
        assert recipes.sha256_hex(got) == case["sha256"], case["name"]


def test_fingerprint_hash_vectors() -> None:
    cases = _load("fingerprints.json")["cases"]
    assert cases
    for case in cases:
        assert len(case["fingerprint"]) == len(recipes.FINGERPRINT_FIELDS) == 22
        assert recipes.canonical(case["fingerprint"]).decode() == case["canonical"]
        assert recipes.fingerprint_hash(case["fingerprint"]) == case["fingerprint_hash"]


def test_effect_id_vectors() -> None:
    vec = _load("effect-ids.json")
    for case in vec["effect_ids"]:
        assert recipes.effect_id(case["idempotency_key"], case["subturn_index"],
                                 case["call_id"]) == case["effect_id"]
    for case in vec["claimed_effect_ids"]:
        assert recipes.claimed_effect_id(case["idempotency_key"], case["subturn_index"],
                                         case["tool_name"], case["occurrence"]) \
            == case["effect_id"]


def test_item_digest_vectors() -> None:
    cases = [c for c in _load("items.json")["cases"] if "id" in c["object"]]
    assert cases
    for case in cases:
        assert recipes.canonical(case["object"]).decode() == case["content"]
        assert recipes.item_digest(case["object"]) == case["content_digest"]


def test_tool_name() -> None:
    assert recipes.tool_name({"type": "function_call", "name": "get_weather"}) == "get_weather"
    assert recipes.tool_name({"type": "local_shell_call"}) == "local_shell"


def test_the_workload_agrees_with_the_recipes() -> None:
    """The product's gateway library, as the workload uses it, computes the documented
    digests: no cross-check finding on a typical seed."""
    w = generate(3, 300, "t")
    assert recipes.cross_check(e for s in w.stories for e in s.events) == []


def test_cross_check_catches_a_drifted_recipe() -> None:
    w = generate(3, 300, "t")
    events = [e for s in w.stories for e in s.events]
    turn = next(e for e in events if hasattr(e, "fingerprint"))
    wrong = turn.model_copy(update={"fingerprint_hash": "0" * 64})
    assert recipes.cross_check([wrong])
    effect = next(e for e in events if isinstance(e, ToolEffect))
    # An effect id that ignores the call id (the recipe of another call of the request).
    drifted = effect.model_copy(update={"effect_id": recipes.effect_id(
        effect.idempotency_key, effect.subturn_index, "call")})
    assert recipes.cross_check([drifted])


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_canonical_refuses_non_finite(bad: float) -> None:
    with pytest.raises(ValueError):
        recipes.canonical({"x": bad})


def test_the_oracle_expects_corrupt_when_the_library_hash_drifts() -> None:
    """C5-style drift (a component left out of the product's hash, in the library and
    the processor alike): the turn's ``fingerprint_hash`` is not the recipe's, so the
    oracle expects ``CORRUPT`` alone (its proof, bound by the workload to the recipe's
    hash, is fine): the product's own answer then differs from the oracle's."""
    import random

    from ratchet.chaos.oracle import expect
    from ratchet.chaos.story import Story, StoryGateway

    story = Story(0, "rec", "conversation", "ten-rec", "conv-rec", "gateway")
    gw = StoryGateway(story, random.Random(0))
    turn = gw.turn(gw.identity(gw.rid(), 0), gw.key(), "hi")
    fields = {n: getattr(turn.fingerprint, n) for n in recipes.FINGERPRINT_FIELDS
              if n != "model_weights_revision"}
    drifted = recipes.sha256_hex(recipes.canonical(
        {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}))
    story.add("drifted", turn.model_copy(update={"fingerprint_hash": drifted}))
    (world,) = expect(story).worlds
    assert world.decided[0] == {("R", "CORRUPT", None)}
