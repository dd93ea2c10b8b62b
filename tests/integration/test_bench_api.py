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
