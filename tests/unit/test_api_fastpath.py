"""``HistoryFastPath``: the history GETs it answers itself are answered exactly as FastAPI
answers them (status, headers, body), and everything else reaches FastAPI untouched."""

from __future__ import annotations

import asyncio
from urllib.parse import quote

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from schemas.items import message
from services.api.app import create_app
from services.api.fastpath import HistoryFastPath
from services.store.base import StoreUnavailable
from tests.unit.test_api_http import FP, OTHER_FP, Stack, uid


class CountingApp:
    """The FastAPI app, counting the requests that reach it."""

    def __init__(self, app) -> None:
        self.app, self.calls = app, 0

    async def __call__(self, scope, receive, send) -> None:
        self.calls += 1
        await self.app(scope, receive, send)


def call(app, path: str, query: bytes, headers: list[tuple[bytes, bytes]] = (),
         method: str = "GET") -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """One request straight through ASGI: (status, headers, body)."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "root_path": "", "query_string": query, "headers": [(b"host", b"t"), *headers],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], sorted(start["headers"]), body


class ServiceStack(Stack):
    """The unit stack, keeping its service for the apps built here."""

    def client_of(self, service):
        self.service = service
        return super().client_of(service)


def promoted() -> tuple[ServiceStack, str, str, str]:
    """A stack holding a 2-turn Conversation: (stack, tenant, conversation, last id)."""
    stack = ServiceStack()
    tenant, conv = uid("tenant"), uid("conv")
    stack.promote(tenant, conv, 0, (message("hello", item_id=uid("msg")),))
    rid = stack.promote(tenant, conv, 1, (message("hi", role="assistant", item_id=uid("msg")),))
    return stack, tenant, conv, rid


def test_a_plain_history_get_is_answered_by_the_fast_path_alone():
    stack, tenant, conv, rid = promoted()
    fast = HistoryFastPath(counted := CountingApp(create_app(stack.service, lambda: True)),
                           stack.service)
    plain = create_app(stack.service, lambda: True)
    for path, query in (
        (f"/v1/responses/{rid}/history", f"tenant_id={tenant}&fingerprint_hash={FP}"),
        (f"/v1/responses/{rid}/history",
         f"tenant_id={tenant}&fingerprint_hash={FP}&wait_ms=5&partition_key={conv}"),
        (f"/v1/conversations/{conv}/history", f"tenant_id={tenant}&fingerprint_hash={FP}"),
        (f"/v1/responses/{rid}/history", f"tenant_id={tenant}&fingerprint_hash={OTHER_FP}"),
        (f"/v1/responses/{uid('resp')}/history", f"tenant_id={tenant}&fingerprint_hash={FP}"),
    ):
        answer = call(fast, path, query.encode())
        assert answer == call(plain, path, query.encode())
        assert answer[0] in (200, 404)
    assert counted.calls == 0


def test_a_cache_control_header_is_read_like_fastapi_reads_it():
    stack, tenant, conv, rid = promoted()
    fast = HistoryFastPath(counted := CountingApp(create_app(stack.service, lambda: True)),
                           stack.service)
    plain = create_app(stack.service, lambda: True)
    query = f"tenant_id={tenant}&fingerprint_hash={FP}".encode()
    for headers in ([(b"cache-control", b"no-cache")], [(b"Cache-Control", b"max-age=0, No-Store")],
                    [(b"cache-control", b"no-cache"), (b"cache-control", b"x")]):
        assert call(fast, f"/v1/responses/{rid}/history", query, headers) == call(
            plain, f"/v1/responses/{rid}/history", query, headers)
    assert counted.calls == 1  # the repeated header went to FastAPI


def test_other_routes_and_methods_reach_fastapi():
    stack, tenant, _, rid = promoted()
    fast = HistoryFastPath(counted := CountingApp(create_app(stack.service, lambda: True)),
                           stack.service)
    query = f"tenant_id={tenant}&fingerprint_hash={FP}".encode()
    assert call(fast, f"/v1/responses/{rid}/status", query)[0] == 200
    assert call(fast, f"/v1/responses/{rid}/history", query, method="POST")[0] == 405
    assert call(fast, "/openapi.json", b"")[0] == 200
    assert counted.calls == 3


def test_a_store_failure_is_the_same_typed_503():
    stack, tenant, conv, rid = promoted()

    async def down(*_args, **_kwargs):
        raise StoreUnavailable("store read_history: down", retryable=True)

    stack.store.read_history_async = down
    fast = HistoryFastPath(create_app(stack.service, lambda: True), stack.service)
    plain = create_app(stack.service, lambda: True)
    path, query = f"/v1/conversations/{conv}/history", f"tenant_id={tenant}&fingerprint_hash={FP}"
    headers = [(b"cache-control", b"no-cache")]
    answer = call(fast, path, query.encode(), headers)
    assert answer == call(plain, path, query.encode(), headers)
    assert answer[0] == 503 and b'"UNAVAILABLE"' in answer[2]


_ODD = st.sampled_from(["", "0", "7", "10001", "007", "-1", "+5", "5.0", " 5",
                        "1e3", FP.upper(), FP[:-1], "a" * 200, "a" * 201, "conv\n", "x y",
                        "\u00e9"]) | st.text(alphabet="abcAZ09._:-/%+ \n&=", max_size=12)


@st.composite
def queries(draw, tenant: str, conv: str, kind: str) -> str:
    """Mostly valid parameters, each one sometimes missing or odd, sometimes repeated,
    sometimes with a parameter the route does not take."""
    good = {"tenant_id": st.sampled_from([tenant, uid("tenant")]),
            "fingerprint_hash": st.sampled_from([FP, OTHER_FP]),
            "wait_ms": st.sampled_from(["0", "1", "000"]),  # short: unknown ids wait
            "partition_key": st.sampled_from([conv, uid("conv")])}
    if kind == "conversations":  # the Conversation route takes the first two only
        good = dict(list(good.items())[:2])
    pairs = []
    for name, valid in good.items():
        how = draw(st.sampled_from(["valid"] * 12 + ["missing", "odd", "twice"]))
        if how == "missing":
            continue
        pairs.append((name, draw(valid) if how != "odd" else draw(_ODD)))
        if how == "twice":
            pairs.append((name, draw(valid | _ODD)))
    if draw(st.integers(0, 9)) == 0:
        pairs.append((draw(st.sampled_from(["other", "Tenant_id", "wait"])), draw(_ODD)))
    order = draw(st.permutations(pairs))
    return "&".join(f"{quote(n)}={quote(v)}" for n, v in order)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), kind=st.sampled_from(["responses", "conversations"]),
       path_id=st.sampled_from(["ID", "ID", "ID", "a" * 201, "x y", "id\n", "\u00e9"]))
def test_any_query_gets_the_answer_fastapi_gives(data, kind, path_id):
    """Whatever the parameters (missing, repeated, out of range, oddly spelled), the
    wrapped app and FastAPI alone answer with the same status, headers and body."""
    stack, tenant, conv, rid = PROMOTED
    target = {"responses": rid, "conversations": conv}[kind] if path_id == "ID" else path_id
    query = data.draw(queries(tenant, conv, kind))
    path = f"/v1/{kind}/{target}/history"
    delegated = FAST.app.calls
    assert call(FAST, path, query.encode()) == call(PLAIN, path, query.encode())
    event("answered by FastAPI" if FAST.app.calls > delegated else "answered by the fast path")


PROMOTED = promoted()
FAST = HistoryFastPath(CountingApp(create_app(PROMOTED[0].service, lambda: True)),
                       PROMOTED[0].service)
PLAIN = create_app(PROMOTED[0].service, lambda: True)
