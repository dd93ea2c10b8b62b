"""The pydantic models must say exactly what the ``.avsc`` files say.

For every record: same field names; same optionality (nullable union <-> ``X | None``);
a field has a default in Avro iff the model does not require it; same kind
(string/int/bool/bytes/timestamp/enum/record/array, recursively); enum symbols equal
to the StrEnum values.
"""

from __future__ import annotations

import types
import typing
from enum import StrEnum

import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from schemas import avsc
from schemas.models import ENUMS_BY_NAME, MODELS_BY_RECORD, EpochMillis

_AVRO_PRIMITIVE_KIND = {
    "string": "str",
    "int": "int",
    "long": "int",
    "boolean": "bool",
    "bytes": "bytes",
    "double": "float",
    "float": "float",
}
_EPOCH_MILLIS_METADATA = typing.get_args(EpochMillis)[1:]


def avro_kind(schema: typing.Any) -> tuple[bool, str]:
    """(nullable, kind) of an Avro type, kind being a readable signature."""
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        assert len(branches) == 1, f"only [null, X] unions are used: {schema}"
        return "null" in schema, avro_kind(branches[0])[1]
    if isinstance(schema, str):
        if schema in _AVRO_PRIMITIVE_KIND:
            return False, _AVRO_PRIMITIVE_KIND[schema]
        return avro_kind(avsc.definitions()[schema])
    kind = schema["type"]
    if schema.get("logicalType") == "timestamp-millis":
        return False, "timestamp"
    if kind == "array":
        return False, f"array[{avro_kind(schema['items'])[1]}]"
    if kind == "enum":
        return False, f"enum {schema['name']}{sorted(schema['symbols'])}"
    if kind == "record":
        return False, f"record {schema['name']}"
    if isinstance(kind, str) and kind in _AVRO_PRIMITIVE_KIND:
        return False, _AVRO_PRIMITIVE_KIND[kind]
    return avro_kind(kind)


def model_kind(
    annotation: typing.Any, metadata: typing.Sequence[typing.Any] = ()
) -> tuple[bool, str]:
    """(nullable, kind) of a model annotation, in the vocabulary of ``avro_kind``."""
    if typing.get_origin(annotation) is typing.Annotated:
        base, *extra = typing.get_args(annotation)
        return model_kind(base, extra)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        branches = [a for a in typing.get_args(annotation) if a is not type(None)]
        assert len(branches) == 1, annotation
        return True, model_kind(branches[0], metadata)[1]
    if typing.get_origin(annotation) is tuple:
        item, ellipsis = typing.get_args(annotation)
        assert ellipsis is Ellipsis, annotation
        return False, f"array[{model_kind(item)[1]}]"
    if isinstance(annotation, type) and issubclass(annotation, StrEnum):
        enum_name = next(n for n, e in ENUMS_BY_NAME.items() if e is annotation)
        return False, f"enum {enum_name}{sorted(m.value for m in annotation)}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        record = next(n for n, m in MODELS_BY_RECORD.items() if m is annotation)
        return False, f"record {record}"
    if annotation is int and any(m in _EPOCH_MILLIS_METADATA for m in metadata):
        return False, "timestamp"
    return False, annotation.__name__


def field_kind(info: FieldInfo) -> tuple[bool, str]:
    return model_kind(info.annotation, info.metadata)


@pytest.mark.parametrize("record", sorted(MODELS_BY_RECORD))
def test_model_matches_schema(record: str) -> None:
    schema = avsc.definitions()[avsc.full_name(record)]
    model = MODELS_BY_RECORD[record]
    avro_fields = {f["name"]: f for f in schema["fields"]}

    assert list(avro_fields) == list(model.model_fields), "field names or order differ"
    for name, info in model.model_fields.items():
        avro_field = avro_fields[name]
        assert field_kind(info) == avro_kind(avro_field["type"]), name
        assert ("default" in avro_field) == (not info.is_required()), f"{name}: default differs"


@pytest.mark.parametrize("enum_name", sorted(ENUMS_BY_NAME))
def test_enum_symbols_match(enum_name: str) -> None:
    schema = avsc.definitions()[avsc.full_name(enum_name)]
    assert schema["symbols"] == [m.value for m in ENUMS_BY_NAME[enum_name]]


def test_every_record_in_the_schemas_has_a_model() -> None:
    records = {
        name.rsplit(".", 1)[1]
        for name, schema in avsc.definitions().items()
        if schema["type"] == "record"
    }
    assert records == set(MODELS_BY_RECORD)


def test_every_field_and_record_is_documented() -> None:
    for name, schema in avsc.definitions().items():
        assert schema.get("doc"), name
        for field in schema.get("fields", ()):
            assert field.get("doc"), f"{name}.{field['name']}"


def test_rejection_reasons_are_exactly_the_contract_codes() -> None:
    contract = [
        "DUPLICATE",
        "IDEMPOTENCY_KEY_REUSED",
        "CONFLICT",
        "OUT_OF_ORDER",
        "PARENT_NOT_PROMOTED",
        "TENANT_MISMATCH",
        "NOT_PROMOTABLE_STATUS",
        "CANCELLED",
        "CORRUPT",
        "UNKNOWN_ITEM_TYPE",
        "UNSUPPORTED_FORMAT",
        "INCOMPLETE_FINGERPRINT",
        "UNPAIRED_TOOL_CALL",
        "MISSING_TOOL_EFFECT",
        "DUPLICATE_TOOL_EFFECT",
        "INVALID_BOUNDARY_PROOF",
    ]
    assert avsc.definitions()["io.ratchet.RejectionReason"]["symbols"] == contract
