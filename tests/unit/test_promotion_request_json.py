"""The receipt and the proof a promotion request carries are written from their models'
``__dict__`` (``ratchet.domain.promotion._json_or_none``): that is their JSON dump only
while every field is a ``str`` or an ``int``. Pinned here, and the text compared with
the pydantic dump it replaced."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import Field, computed_field, field_serializer

from ratchet.domain.promotion import promotion_request
from ratchet.samples import make_turn
from schemas.canonical import canonical_json_text
from schemas.models import BoundaryProof, Certification, RouterReceipt

_EXTREMES = (0, -1, 2**31, 2**63 - 1, -(2**63))
_TEXTS = ("", "plain", 'quote " back\\slash', "línea\nnueva \u2028 \U0001f600", "\x00\x1f")


@pytest.mark.parametrize("model", [RouterReceipt, BoundaryProof])
def test_every_field_is_a_str_or_an_int(model):
    # EpochMillis is an int with a BeforeValidator: pydantic reports its annotation as int
    assert {name: field.annotation for name, field in model.model_fields.items()
            if field.annotation not in (str, int)} == {}
    assert model.model_config.get("extra") != "allow"  # no extra values in __dict__


def _receipt(text: str, number: int) -> RouterReceipt:
    return RouterReceipt(receipt_id=text, router_key_format=text + "k", covered_tokens=number,
                         expires_at=number, issuer=text)


def _proof(text: str, number: int) -> BoundaryProof:
    return BoundaryProof(prefix_hash=text, prefix_count=number, append_hash=text + "a",
                         append_count=-number, combined_hash=text, combined_count=number,
                         boundary_kind=text, fingerprint_hash=text, expires_at=number)


@pytest.mark.parametrize("number", _EXTREMES)
@pytest.mark.parametrize("text", _TEXTS)
def test_the_request_carries_the_dump_pydantic_would_give(text, number):
    receipt, proof = _receipt(text, number), _proof(text, number)
    turn = make_turn(router_receipt=receipt, boundary_proof=proof)
    request = promotion_request(turn, Certification.CERTIFIED)
    assert request.router_receipt == canonical_json_text(receipt.model_dump(mode="json"))
    assert request.boundary_proof == canonical_json_text(proof.model_dump(mode="json"))


def test_a_timestamp_read_as_a_datetime_is_written_as_its_millis():
    # A writer's timestamp-micros reaches the model as an aware datetime: kept as an int.
    moment = datetime(2026, 12, 7, 16, 30, 0, 123456, tzinfo=UTC)
    proof = BoundaryProof.model_validate({**_proof("p", 5).model_dump(), "expires_at": moment})
    turn = make_turn(boundary_proof=proof)
    written = promotion_request(turn, Certification.CERTIFIED).boundary_proof
    assert written == canonical_json_text(proof.model_dump(mode="json"))
    assert '"expires_at":1796661000123' in written


class _ReceiptWithComputed(RouterReceipt):
    @computed_field  # type: ignore[prop-decorator]
    @property
    def covered_twice(self) -> int:
        return 2 * self.covered_tokens


class _ReceiptWithSerializer(RouterReceipt):
    @field_serializer("issuer")
    def _issuer(self, issuer: str) -> str:
        return issuer.upper()


class _ProofWithExcluded(BoundaryProof):
    note: str = Field(default="internal", exclude=True)


@pytest.mark.parametrize("receipt, proof", [
    (_ReceiptWithComputed.model_validate(_receipt("r", 3).model_dump()), _proof("p", 4)),
    (_ReceiptWithSerializer.model_validate(_receipt("r", 3).model_dump()), _proof("p", 4)),
    (_receipt("r", 3), _ProofWithExcluded.model_validate(_proof("p", 4).model_dump())),
])
def test_a_subclass_instance_is_written_as_its_dump(receipt, proof):
    # TurnCompleted keeps a subclass instance as given (pydantic does not revalidate
    # it): its dump, not its __dict__, is what the request carried before session 50
    # (a computed field, a field serializer, an excluded field all differ).
    turn = make_turn(router_receipt=receipt, boundary_proof=proof)
    assert type(turn.router_receipt) is type(receipt)
    request = promotion_request(turn, Certification.CERTIFIED)
    assert request.router_receipt == canonical_json_text(receipt.model_dump(mode="json"))
    assert request.boundary_proof == canonical_json_text(proof.model_dump(mode="json"))
