"""A Prometheus metric's child for some label values, looked up once.

``metric.labels(*values)`` takes the metric's lock and builds and checks a key on every
call: ~4 us, paid several times per request or event on the hot paths. The child for
given values never changes, so it is looked up once and kept (label values are bounded
by design: endpoints, outcomes, reason codes). Created on first use, as with
``labels``."""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def child(metric: Any, *values: str) -> Any:
    """``metric.labels(*values)``, the same object every time."""
    return metric.labels(*values)
