"""The promotion processor's durable ledger (effects, cancellations, decisions, status)."""
