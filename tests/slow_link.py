"""A slow Cassandra, made deterministic: a TCP proxy in front of the real one that
delivers each of its answers late. Used by the tests of a connect under a busy node
(tests/unit/test_migrate.py, tests/unit/test_cassandra_connect_timeout.py)."""

from __future__ import annotations


class SlowLink:
    """A TCP proxy in front of the real Cassandra that delivers each of its answers
    ``delay_s`` late (in order; a round trip's latency, not a throughput cap): a server
    slow to answer, made deterministic."""

    def __init__(self, host: str, port: int, delay_s: float) -> None:
        import socket
        import threading

        self._target, self._delay_s = (host, port), delay_s
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self._target)
            self._sockets += [client, server]
            threading.Thread(target=self._pipe, args=(client, server, 0.0), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, self._delay_s),
                             daemon=True).start()

    @staticmethod
    def _pipe(src, dst, delay_s: float) -> None:
        import queue
        import threading
        import time

        late: queue.Queue = queue.Queue()

        def deliver() -> None:
            while (item := late.get()) is not None:
                due, chunk = item
                time.sleep(max(0.0, due - time.monotonic()))
                try:
                    dst.sendall(chunk)
                except OSError:
                    return

        threading.Thread(target=deliver, daemon=True).start()
        while True:
            try:
                chunk = src.recv(65536)
            except OSError:
                chunk = b""
            late.put((time.monotonic() + delay_s, chunk) if chunk else None)
            if not chunk:
                return

    def close(self) -> None:
        for s in self._sockets:
            s.close()
