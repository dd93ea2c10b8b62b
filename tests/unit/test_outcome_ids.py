"""An outcome's ``event_id`` (``streams.outcomes.outcome_event_id``) is
``uuid.uuid5(namespace, source event id + "/" + kind)``, computed without ``uuid.UUID``
since session 46: the same string for every source id and kind, or a re-published
outcome would no longer be recognisably the same as one published before."""

from __future__ import annotations

import random
import uuid

from streams import outcomes


def test_an_outcome_id_is_the_uuid5_of_its_source_and_kind():
    rng = random.Random(46)
    kinds = ["promoted", "rejected", "orphaned/eff_1", "orphaned/eff_\u00e9/" + "d" * 64, ""]
    sources = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(2000)]
    sources += ["", "x", "\u4e2d\u6587", "a/b", "e" * 300]
    for source in sources:
        for kind in kinds:
            expected = str(uuid.uuid5(outcomes._OUTCOME_NS, f"{source}/{kind}"))
            assert outcomes.outcome_event_id(source, kind) == expected
