"""ratchet: never-wrong continuation checkpoints for Responses-API gateways."""

__version__ = "0.1.0"
