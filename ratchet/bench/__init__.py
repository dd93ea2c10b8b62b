"""Micro-benchmarks of ratchet's pure domain functions (``python -m ratchet.bench.<name>``)."""
