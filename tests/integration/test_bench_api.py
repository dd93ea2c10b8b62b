"""``ratchet bench api`` runs end to end and times the answers it names: every HTTP line's
GET is checked ``certified`` as it is timed (``get`` in ratchet/bench/api.py), so a
setup whose turns answer anything else (a fallback: until session 36 its turns carried
no boundary proof, and every read answered ``NO_ARTIFACT``) fails here, not in an
operator's hands."""

from __future__ import annotations

import pytest

from ratchet.bench import api

pytestmark = pytest.mark.integration


def test_the_api_bench_times_certified_answers_on_every_line(settings):
    figures = api.run(settings, reads=3, turns=3, waits=2)
    by_name = {figure.name: figure for figure in figures}
    for name in (api.RESPONSE_HIT, api.COLD):
        assert by_name[name].samples == 3, by_name[name]
    assert all(figure.samples > 0 and figure.p50_ms > 0 for figure in figures)


def test_a_wait_answered_with_a_fallback_fails_the_bench(settings, monkeypatch):
    """The ``wait_ms`` line's answer is checked ``certified`` too. Its GET ran on a
    thread of its own, whose failed check the thread's exit swallowed: the answer was
    recorded first, so a wait answered with a fallback (or a 500) was timed as a wait
    (session 53's outside review). Here the turns promoted during the waits carry a
    proof without its expiry, which the API answers ``ARTIFACT_EXPIRED`` (a fallback):
    the bench must stop. The waits' turns are the ones built outside ``_promote``
    (called without ``chain_parent``)."""
    import dataclasses
    import json

    from schemas.canonical import canonical_json_text

    built = api._request

    def no_expiry_for_the_waits(*args, **kwargs):
        request = built(*args, **kwargs)
        if "chain_parent" in kwargs:  # _promote's: the timed reads' turns
            return request
        proof = json.loads(request.boundary_proof)
        del proof["expires_at"]
        return dataclasses.replace(request, boundary_proof=canonical_json_text(proof))

    monkeypatch.setattr(api, "_request", no_expiry_for_the_waits)
    with pytest.raises(AssertionError, match="fallback|ARTIFACT_EXPIRED"):
        api.run(settings, reads=1, turns=1, waits=1)
