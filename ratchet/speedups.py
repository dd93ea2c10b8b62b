"""The C twins of a history read's per-item loops and of the strict Avro walk, when
built and allowed.

Why: a cold read of a 50-turn history spent ~1.2 ms of Python on its rows (decode the
items cells, hash every item, render the items array) beside a ~1.5 ms read
(docs/decisions.md, "Cold miss"). ``ratchet/_speedups.c`` does the same per-item work
in C. It also walks every consumed Avro body against the spec (``schemas/strict.py``)
in ~2 us, where telling whether the Python walk was needed cost ~0.1 ms.

How it stays safe: each C function has a Python twin that stays the reference and is
used when the C module is not built (no compiler at install time) or when
``RATCHET_SPEEDUPS=0``. ``tests/unit/test_speedups.py`` gives both the same valid and
damaged inputs and requires the same results and the same errors. Nothing in C
decides an outcome: it decodes, hashes, compares (an item's columns with its content's
fields, handing what it is not sure of to the Python twin) and writes bytes; the domain
decides.
"""

from __future__ import annotations

import os
from types import ModuleType

from ratchet.settings import SettingsError


def load() -> ModuleType | None:
    """``ratchet._speedups``, or None (not built, or ``RATCHET_SPEEDUPS=0``). Any other
    value than 0 or 1 is a ``SettingsError``, like every other setting's."""
    value = os.environ.get("RATCHET_SPEEDUPS", "1")
    if value not in ("0", "1"):
        raise SettingsError(f"RATCHET_SPEEDUPS must be 0 or 1, not {value!r}")
    if value == "0":
        return None
    try:
        from ratchet import _speedups
    except ImportError:
        return None
    return _speedups


SPEEDUPS = load()


def describe() -> str:
    """What the processes log at start: which twins this process runs."""
    if SPEEDUPS is not None:
        return "C (ratchet._speedups)"
    if os.environ.get("RATCHET_SPEEDUPS") == "0":
        return "Python (RATCHET_SPEEDUPS=0)"
    return "Python (ratchet._speedups is not built: slower history reads, the same answers)"
