"""The atomic promotion store: one interface (``base``), one module per backend."""
