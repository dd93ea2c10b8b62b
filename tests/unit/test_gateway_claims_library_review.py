"""The gateway library's claimed effects: three ways one call ran twice or got stuck
(found by an outside review of effect claims, session 25).

docs/service.md, section 3: ``run`` executes the function only on ``CLAIMED``, records
the outcome (an exception is recorded as ``failed`` and re-raised); retry by calling
``run`` again, and the tool is not run again. docs/gateway-protocol.md, section 8: a
holder whose lease was taken over answers its call with the claim's recorded result;
re-send the same token to repeat a call whose answer was lost.

1. A tool whose return value cannot be an output item (``bytes``, a lone surrogate
   from ``os.fsdecode``) raised after it ran, with nothing recorded: the retry was
   CLAIMED again (same token) and ran the tool a second time.
2. A holder whose lease was taken over got an untyped 409 from its completion, and
   every retry re-sent the same refused completion: it never got the recorded result.
3. A claim re-sent after its lease ran out (its first answer lost) was CLAIMED with the
   lease already over, while another attempt took it over: both ran at once.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ratchet.domain.claims import EffectPolicy
from services.api.claims import claims_router
from services.gateway.claims import (
    ClaimTakenOver,
    EffectClaims,
    EffectOutcomeUnknown,
    EffectOutputUnrecordable,
    StillInProgress,
)
from services.gateway.errors import RehydrationUnavailable
from services.gateway.events import TurnIdentity
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions
from services.store.memory import MemoryCheckpointStore

CALL1 = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "send_email",
         "arguments": "{\"to\": \"bob\"}"}
CALL2 = {**CALL1, "id": "fc_2", "call_id": "c2"}


class Server:
    """The real claims routes on a memory ledger, in process, with a clock the test
    moves and an answer it can lose."""

    def __init__(self) -> None:
        self.now_ms = 1_800_000_000_000
        self.ledger = MemoryLedger()
        app = FastAPI()
        app.include_router(claims_router(self.ledger,
                                         MemoryCheckpointStore(StoreOptions()),
                                         lambda: self.now_ms))
        self.http = TestClient(app)
        self.lose_next_answer = False

    def forward(self, request: httpx.Request) -> httpx.Response:
        """One claims call, answered by the routes (its answer lost when asked)."""
        resp = self.http.post(request.url.path, content=request.content,
                              headers={"content-type": "application/json"})
        if self.lose_next_answer:
            self.lose_next_answer = False
            raise httpx.ReadTimeout("answer lost", request=request)
        return httpx.Response(resp.status_code, content=resp.content,
                              headers={"content-type": "application/json"})

    def claims(self, attempt: int, *, lease_ms: int = 2_000, max_wait_s: float = 60.0,
               policy: EffectPolicy = EffectPolicy.AT_MOST_ONCE) -> EffectClaims:
        identity = TurnIdentity(tenant_id="t1", response_id=f"r{attempt}",
                                conversation_id="conv_1", expected_head_seq=0)
        return EffectClaims("http://claims.test", identity, idempotency_key="k1",
                            attempt=attempt, lease_ms=lease_ms, max_wait_s=max_wait_s,
                            default_policy=policy, transport=httpx.MockTransport(self.forward))


@pytest.mark.parametrize("result", ["sent: caf\udce9", b"sent"])
def test_a_tool_whose_output_cannot_be_recorded_runs_once(result):
    server = Server()
    claims = server.claims(1)
    runs = []

    def send_email():
        runs.append(1)  # the side effect
        return result

    with claims.effect(CALL1, subturn_index=0) as effect, \
            pytest.raises(EffectOutputUnrecordable):
        effect.run(send_email)
    with claims.effect(CALL1, subturn_index=0) as effect:  # the documented retry
        failed = effect.run(send_email)
    assert len(runs) == 1
    # The outcome recorded is a failure naming why, the same for every attempt.
    stored = server.ledger.claims_for("t1", "k1")[0]
    assert (stored.completed, stored.status) == (True, "failed")
    assert b"cannot be recorded" in failed.content and failed == stored.output.model_copy(
        update={"item_id": failed.item_id})


def test_a_holder_taken_over_gets_a_typed_error_then_the_recorded_result():
    server = Server()
    a = server.claims(1, lease_ms=100, policy=EffectPolicy.AT_LEAST_ONCE)
    b = server.claims(2, lease_ms=100, policy=EffectPolicy.AT_LEAST_ONCE)

    def slow_send():
        # A's lease runs out while the tool runs; B takes over, runs and completes.
        server.now_ms += 1_000
        with b.effect(CALL2, subturn_index=0) as eb:
            eb.run(lambda: "sent by B")
        return "sent by A"

    with a.effect(CALL1, subturn_index=0) as ea, pytest.raises(ClaimTakenOver) as raised:
        ea.run(slow_send)
    assert raised.value.retryable
    with a.effect(CALL1, subturn_index=0) as ea:
        out = ea.run(lambda: pytest.fail("the claim is completed: nothing runs again"))
    assert b"sent by B" in out.content and out.call_id == "c1"


def test_a_claim_resent_after_its_lease_ran_out_never_runs_beside_a_taker():
    server = Server()
    a = server.claims(1, policy=EffectPolicy.AT_LEAST_ONCE, max_wait_s=0.05)
    b = server.claims(2, policy=EffectPolicy.AT_LEAST_ONCE, max_wait_s=0.05)
    running, overlaps = [], []

    def send(who):
        def run():
            if running:
                overlaps.append((running[-1], who))
            running.append(who)
            if who == "A":  # while A runs, another attempt asks for the same effect
                with b.effect(CALL2, subturn_index=0) as eb, pytest.raises(StillInProgress):
                    eb.run(send("B"))  # A holds it, its lease renewed
            running.remove(who)
            return f"sent by {who}"
        return run

    server.lose_next_answer = True  # A's claim lands; its answer is lost
    with a.effect(CALL1, subturn_index=0) as ea, pytest.raises(RehydrationUnavailable):
        ea.run(send("A"))
    server.now_ms += 5_000  # the retry comes after the lease (2 s) ran out
    with a.effect(CALL1, subturn_index=0) as ea:
        assert b"sent by A" in ea.run(send("A")).content
    assert overlaps == []


# A second review of these fixes (session 25) found two more ways to run a tool twice.


@pytest.mark.parametrize("text", [
    "x" * (9 * 1024 * 1024),  # a str above the API's 8 MiB of content
    "\x00\x01\x1b" * (512 * 1024),  # control characters: 6 bytes each as JSON content
], ids=["9MiB", "1.5MiB-control-chars"])
def test_a_tool_output_the_api_refuses_is_recorded_failed_and_never_runs_twice(text):
    """A valid str the API refuses (422: above what a claim stores) was kept and
    re-sent by every ``run`` (422 again): the claim stayed open until the next attempt
    took it over and ran the tool again."""
    server = Server()
    a = server.claims(1, policy=EffectPolicy.AT_LEAST_ONCE)
    runs = []

    def fetch_page():
        runs.append(1)  # the side effect
        return text

    with a.effect(CALL1, subturn_index=0) as effect, \
            pytest.raises(EffectOutputUnrecordable, match="refused"):
        effect.run(fetch_page)
    with a.effect(CALL1, subturn_index=0) as effect:  # the holder's retry
        assert b"refused" in effect.run(fetch_page).content
    stored = server.ledger.claims_for("t1", "k1")[0]
    assert (stored.completed, stored.status) == (True, "failed")
    server.now_ms += 5_000  # the request's next attempt, after the lease
    b = server.claims(2, policy=EffectPolicy.AT_LEAST_ONCE)
    with b.effect(CALL2, subturn_index=0) as effect:
        effect.run(fetch_page)  # COMPLETED: the recorded failure, not a second run
    assert len(runs) == 1


class ToolTimeout(BaseException):
    """As gevent's Timeout: a BaseException, which ``except Exception`` lets through."""


@pytest.mark.parametrize("interrupt", [ToolTimeout, asyncio.CancelledError, KeyboardInterrupt])
def test_a_tool_interrupted_by_a_base_exception_is_never_run_again(interrupt):
    """Only an ``Exception`` was recorded: a tool interrupted after its side effect left
    the claim open under the effect's token, and the retry (rule 5: the same token)
    was CLAIMED and ran it again. Its outcome is unknown: the retry says so, typed."""
    server = Server()
    claims = server.claims(1)
    runs = []

    def send_email():
        runs.append(1)  # the side effect happened
        raise interrupt()

    with claims.effect(CALL1, subturn_index=0) as effect, pytest.raises(interrupt):
        effect.run(send_email)
    with claims.effect(CALL1, subturn_index=0) as effect, \
            pytest.raises(EffectOutcomeUnknown, match="interrupted"):
        effect.run(send_email)
    assert len(runs) == 1
