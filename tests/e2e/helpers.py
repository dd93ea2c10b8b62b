"""Small helpers shared by the HTTP end-to-end tests."""

from __future__ import annotations

from services.demo.simulator import SimulatedGateway, assistant, uid, user
from services.gateway.client import Certified
from services.gateway.events import TurnIdentity

WAIT_MS = 10_000


def promoted_conversation(gw: SimulatedGateway, turns: int = 2, **turn_kwargs):
    """Promote ``turns`` turns in a new Conversation; returns (conversation_id, turns)."""
    conv = uid("conv")
    sent = []
    for head in range(turns):
        turn = gw.turn(
            TurnIdentity.conversation(gw.tenant_id, conv, uid("resp"), head),
            [user(f"question {head}")],
            [assistant(f"answer {head}")],
            **turn_kwargs,
        )
        gw.publish(turn)
        outcome = gw.rehydrate(turn.response_id, wait_ms=WAIT_MS)
        assert outcome.__class__.__name__ in ("Certified", "Fallback"), outcome
        sent.append(turn)
    return conv, sent


def all_item_ids(turns) -> list[str]:
    return [item.item_id for turn in turns for item in turn.items]


__all__ = ["Certified", "WAIT_MS", "all_item_ids", "promoted_conversation"]
