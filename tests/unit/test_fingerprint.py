"""Execution fingerprint: canonical, sensitive to every component, free of secrets."""

from __future__ import annotations

import json
import random
import string
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratchet.domain.fingerprint import (
    REQUIRED_COMPONENTS,
    build_fingerprint,
    canonical_fingerprint,
    digest_cache_salt,
    fingerprint_checks,
    fingerprint_hash,
    missing_components,
    sanitize_tools,
)
from schemas.models import Fingerprint

BASE: dict[str, Any] = {
    "model_name": "openai/gpt-oss-20b",
    "model_weights_revision": "6cee5e81ee83917806bbde320786a8fb61efebee",
    "tokenizer_name": "openai/gpt-oss-20b",
    "tokenizer_revision": "6cee5e81ee83917806bbde320786a8fb61efebee",
    "renderer_name": "harmony",
    "renderer_version": "0.0.4",
    "chat_template": "{{ messages }}",
    "chat_template_args": {"enable_thinking": True, "x": [1, 2]},
    "reasoning_parser": "openai_gptoss",
    "reasoning_flags": {"effort": "high"},
    "tool_parser": "openai",
    "instructions": "Be brief.",
    "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
    "lora_name": None,
    "lora_revision": None,
    "multimodal_input_digests": (),
    "cache_salt": None,
    "block_hash_format": "sha256-cbor-v1",
    "router_key_format": "prefix-blocks-v1",
    "block_size": 16,
    "item_format_version": 1,
}

json_scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.text(string.ascii_lowercase, min_size=1, max_size=6), children, max_size=4
        )
    ),
    max_leaves=8,
)
json_objects = st.dictionaries(
    st.text(string.ascii_lowercase, min_size=1, max_size=6), json_values, max_size=5
)
secrets = st.text(string.ascii_letters + string.digits, min_size=12, max_size=24).map(
    lambda s: "SECRET-" + s
)


def shuffled(value: Any, rng: random.Random) -> Any:
    """Same JSON value, different key insertion order at every level."""
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {k: shuffled(value[k], rng) for k in keys}
    if isinstance(value, list):
        return [shuffled(v, rng) for v in value]
    return value


def fp(**changes: Any) -> Fingerprint:
    return build_fingerprint(**{**BASE, **changes})


# The machine is shared: never fail on generation speed, only on properties.
RELAXED = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@RELAXED
@given(
    args=json_objects,
    flags=json_objects,
    tools=st.lists(json_objects, max_size=3),
    seed=st.integers(0, 2**32),
    indent=st.sampled_from([None, 0, 2, "\t"]),
)
def test_key_order_and_formatting_never_change_the_hash(args, flags, tools, seed, indent) -> None:
    rng = random.Random(seed)
    plain = fp(chat_template_args=args, reasoning_flags=flags, tools=tools)
    reordered = fp(
        chat_template_args=shuffled(args, rng),
        reasoning_flags=json.dumps(shuffled(flags, rng), indent=indent),  # JSON text input
        tools=json.dumps(shuffled(tools, rng), indent=indent, sort_keys=False),
    )
    assert fingerprint_hash(plain) == fingerprint_hash(reordered)
    assert canonical_fingerprint(plain) == canonical_fingerprint(reordered)


# One changed raw input per fingerprint component (every component is covered: see below).
CHANGES: dict[str, dict[str, Any]] = {
    "model_name": {"model_name": "other/model"},
    "model_weights_revision": {"model_weights_revision": "0" * 40},
    "tokenizer_name": {"tokenizer_name": "other/tok"},
    "tokenizer_revision": {"tokenizer_revision": "1" * 40},
    "renderer_name": {"renderer_name": "jinja"},
    "renderer_version": {"renderer_version": "0.0.5"},
    "chat_template_digest": {"chat_template": "{{ messages }} "},
    "chat_template_args": {"chat_template_args": {"enable_thinking": False, "x": [1, 2]}},
    "reasoning_parser": {"reasoning_parser": None},
    "reasoning_flags": {"reasoning_flags": {"effort": "low"}},
    "tool_parser": {"tool_parser": "hermes"},
    "instructions_digest": {"instructions": "Be brief. "},
    "tools_digest": {
        "tools": [{"type": "function", "name": "g", "parameters": {"type": "object"}}]
    },
    "lora_name": {"lora_name": "adapter", "lora_revision": "r1"},
    "lora_revision": {"lora_revision": "r2"},
    "multimodal_input_digests": {"multimodal_input_digests": ("a" * 64,)},
    "cache_salt_digest": {"cache_salt": "tenant-salt"},
    "block_hash_format": {"block_hash_format": "xxh3-v1"},
    "router_key_format": {"router_key_format": "prefix-blocks-v2"},
    "block_size": {"block_size": 32},
    "item_format_version": {"item_format_version": 2},
}


def test_every_component_has_a_change_case() -> None:
    assert set(CHANGES) | {"fingerprint_version"} == set(Fingerprint.model_fields)


@pytest.mark.parametrize("component", sorted(CHANGES))
def test_changing_any_single_component_changes_the_hash(component: str) -> None:
    changed = fp(**CHANGES[component])
    assert getattr(changed, component) != getattr(fp(), component)
    assert fingerprint_hash(changed) != fingerprint_hash(fp())
    assert fingerprint_checks(changed) != fingerprint_checks(fp())


@pytest.mark.parametrize("component", [*sorted(CHANGES), *REQUIRED_COMPONENTS, "version"])
def test_validation_checks_answer_as_the_uncached_functions(component: str) -> None:
    """``fingerprint_checks`` (what validation asks, remembered by the fields) answers
    each fingerprint as computing afresh does: changed one component at a time, a
    required one removed, the version bumped; equal fingerprints share an answer."""
    fingerprint_checks.cache_clear()
    if component == "version":
        changed = fp().model_copy(update={"fingerprint_version": 2})
    elif component in CHANGES and component not in REQUIRED_COMPONENTS:
        changed = fp(**CHANGES[component])
    else:
        changed = fp().model_copy(update={component: None})
    for _ in range(2):  # computed, then remembered
        for each in (fp(), changed):
            assert fingerprint_checks(each) == (fingerprint_hash.__wrapped__(each),
                                                missing_components.__wrapped__(each))


def test_every_way_of_building_a_fingerprint_keeps_its_fields_in_order() -> None:
    """``fingerprint_checks`` keys by the values in ``__dict__``'s order: it must be the
    fields' order however the model was built (validated, constructed, copied with an
    update of a later field first)."""
    fields = list(Fingerprint.model_fields)
    built = fp()
    for each in (built, Fingerprint.model_validate(built.model_dump()),
                 Fingerprint.model_construct(**dict(reversed(built.model_dump().items()))),
                 Fingerprint.model_construct(model_name="m"),
                 built.model_copy(update={"item_format_version": 3, "model_name": "x"})):
        assert list(each.__dict__) == fields


NUMBERS = ("fingerprint_version", "block_size", "item_format_version")


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")  # the odd values' dump
@pytest.mark.parametrize("field", NUMBERS)
@pytest.mark.parametrize("other", [True, 1.0], ids=["bool", "float"])
def test_validation_checks_tell_a_number_from_an_equal_value_of_another_type(
        field: str, other: Any) -> None:
    """``1 == True == 1.0`` (and hash alike), but their canonical JSON differs (``1``,
    ``true``, ``1.0``). A model built without validation (``model_copy(update=...)``,
    ``model_construct``) can hold either: ``fingerprint_checks`` answers each as
    computing afresh does, whichever was asked first (a review, session 47: it gave
    the int's hash to the bool)."""
    one = fp().model_copy(update={field: 1})
    odd = fp().model_copy(update={field: other})
    assert fingerprint_hash.__wrapped__(one) != fingerprint_hash.__wrapped__(odd)
    for first, then in ((one, odd), (odd, one)):
        fingerprint_checks.cache_clear()
        for each in (first, then):
            assert fingerprint_checks(each)[0] == fingerprint_hash.__wrapped__(each), each


def test_the_numbers_are_every_field_neither_text_nor_a_tuple() -> None:
    """``fingerprint_checks`` keys by the classes of these fields' values too (the test
    above): a new numeric field must be among them."""
    numeric = {name for name, field in Fingerprint.model_fields.items()
               if field.annotation not in (str | None, tuple[str, ...])}
    assert numeric == set(NUMBERS)


def test_fingerprint_version_is_part_of_the_hash() -> None:
    bumped = fp().model_copy(update={"fingerprint_version": 2})
    assert fingerprint_hash(bumped) != fingerprint_hash(fp())


@RELAXED
@given(salt=secrets)
def test_any_cache_salt_change_changes_the_hash(salt: str) -> None:
    assert fingerprint_hash(fp(cache_salt=salt)) != fingerprint_hash(fp(cache_salt=salt + "x"))


@RELAXED
@given(salt=secrets, header=secrets, api_key=secrets, token=secrets)
def test_secrets_never_reach_the_encoding_or_the_model(salt, header, api_key, token) -> None:
    tools = [
        {
            "type": "mcp",
            "server_label": "deepwiki",
            "headers": {"Authorization": f"Bearer {header}"},
            "authorization": token,
            "connector": {"client_secret": api_key, "Api_Key": api_key},
            "parameters": {"properties": {"api_token": {"type": "string"}}},
        }
    ]
    fingerprint = fp(tools=tools, cache_salt=salt)
    visible = canonical_fingerprint(fingerprint).decode() + repr(fingerprint.model_dump())
    visible += fingerprint.model_dump_json()
    for secret in (salt, header, api_key, token):
        assert secret not in visible
    assert fingerprint.cache_salt_digest == digest_cache_salt(salt)


def test_secrets_do_not_change_the_tools_digest() -> None:
    tool = {"type": "mcp", "server_label": "x", "headers": {"Authorization": "Bearer a"}}
    rotated = {"type": "mcp", "server_label": "x", "headers": {"Authorization": "Bearer b"}}
    assert fp(tools=[tool]).tools_digest == fp(tools=[rotated]).tools_digest


def test_model_visible_parameter_names_are_kept() -> None:
    """A tool parameter called ``api_token`` is schema text the model sees, not a secret."""
    tool = {"type": "function", "name": "f", "parameters": {"properties": {"api_token": {}}}}
    assert sanitize_tools([tool]) == [tool]
    other = {"type": "function", "name": "f", "parameters": {"properties": {}}}
    assert fp(tools=[tool]).tools_digest != fp(tools=[other]).tools_digest


def test_canonical_encoding_has_explicit_nulls_sorted_keys_no_whitespace() -> None:
    encoded = canonical_fingerprint(fp()).decode("utf-8")
    decoded = json.loads(encoded)
    assert set(decoded) == set(Fingerprint.model_fields)
    assert decoded["lora_name"] is None and '"lora_name":null' in encoded
    assert list(decoded) == sorted(decoded)
    assert " " not in encoded.replace("Be brief.", "") and "\n" not in encoded


def test_complete_fingerprint_has_no_missing_components() -> None:
    assert missing_components(fp()) == ()


@pytest.mark.parametrize("component", REQUIRED_COMPONENTS)
def test_each_required_component_is_required(component: str) -> None:
    broken = fp().model_copy(update={component: None})
    assert component in missing_components(broken)


def test_hash_is_cached_by_value_not_identity() -> None:
    a, b = fp(), fp()
    assert a is not b and fingerprint_hash(a) == fingerprint_hash(b)
    assert fingerprint_hash(a) == fingerprint_hash.__wrapped__(a)


@pytest.mark.parametrize("key", ["x_api_key", "github_token", "db_password", "oauth_secret",
                                 "aws_credentials", "X_API_KEY"])
def test_secret_suffixed_keys_are_sanitized(key: str) -> None:
    """Keys ending in a secret suffix (``SECRET_SUFFIXES``) are transport secrets: they
    never reach the tools digest, whatever their case. Found by a mutation review: the
    suffix rule could be dropped with every test passing (the other tests name whole
    secret keys only)."""
    tool = {"type": "mcp", "server_label": "x", "connector": {key: "s3cr3t", "url": "u"}}
    assert sanitize_tools([tool]) == [{"type": "mcp", "server_label": "x",
                                       "connector": {"url": "u"}}]
    rotated = {"type": "mcp", "server_label": "x", "connector": {key: "other", "url": "u"}}
    assert fp(tools=[tool]).tools_digest == fp(tools=[rotated]).tools_digest


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")  # the odd values' dump
@pytest.mark.parametrize("field", NUMBERS)
@pytest.mark.parametrize("other", [True, 1.0], ids=["bool", "float"])
def test_the_hash_tells_a_number_from_an_equal_value_of_another_type(
        field: str, other: Any) -> None:
    """``fingerprint_hash`` and ``missing_components`` (what the gateway library, the
    samples and the chaos run ask) answer as computing afresh does whichever of ``1`` and
    ``True`` / ``1.0`` was asked first: they were lru caches by the model's value, equal
    for the two (session 47)."""
    one = fp().model_copy(update={field: 1})
    odd = fp().model_copy(update={field: other})
    for first, then in ((one, odd), (odd, one)):
        fingerprint_hash.cache_clear()
        for each in (first, then):
            assert fingerprint_hash(each) == fingerprint_hash.__wrapped__(each), each
            assert missing_components(each) == missing_components.__wrapped__(each), each
