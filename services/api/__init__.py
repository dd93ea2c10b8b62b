"""The rehydration service: HTTP adapter around the pure rehydration domain.

``app.create_app`` builds the FastAPI application from injected ports (store reader,
status lookup, promotion waiters) so unit tests run it on the in-memory store and
``server.run`` wires the Cassandra store and the Kafka notifier for production.
"""
