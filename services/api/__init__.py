"""The rehydration service: HTTP adapter around the pure rehydration domain.

``app.create_app`` builds the FastAPI application from injected ports (store reader,
status lookup, promotion waiters) so unit tests run it on the in-memory store and
``server.run`` wires the Cassandra store, the Kafka notifier and the verified-history
cache (``cache.py``: revalidated on every hit by one stamp query) for production.
"""
