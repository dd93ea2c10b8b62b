"""The atomic promotion store: one interface (``base``), one module per backend."""

from services.store.base import *  # noqa: F403
from services.store.base import __all__  # noqa: F401
