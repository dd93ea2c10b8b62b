"""Execution fingerprint: everything that changes the rendered tokens (CONTRACT 1.2).

Two turns may reuse each other's tokens only if their fingerprints are equal, so the
fingerprint must (a) contain every input of the renderer, (b) be computed the same way
by every gateway, and (c) never carry a secret, because it is stored and published.

* ``build_fingerprint(...)`` takes what a gateway has at hand (raw instructions text,
  raw tools list, raw chat template, raw ``cache_salt``, template args as a dict or
  JSON text) and keeps only digests and canonical JSON.
* ``fingerprint_hash(fp)`` is sha256 hex over ``canonical_fingerprint(fp)``: canonical
  JSON (sorted keys, no whitespace, explicit nulls, UTF-8) of ALL components.
* ``missing_components(fp)`` lists what makes a fingerprint INCOMPLETE_FINGERPRINT.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from schemas.canonical import canonical_digest, canonical_json, canonical_json_text, sha256_hex
from schemas.models import CURRENT_FINGERPRINT_VERSION, Fingerprint

# Components without which two renders cannot be told apart. The rest are legitimately
# absent for some deployments (no LoRA, no salt, no reasoning/tool parser, no media).
REQUIRED_COMPONENTS = (
    "model_name",
    "model_weights_revision",
    "tokenizer_name",
    "tokenizer_revision",
    "renderer_name",
    "renderer_version",
    "chat_template_digest",
    "chat_template_args",
    "reasoning_flags",
    "instructions_digest",
    "tools_digest",
    "block_hash_format",
    "router_key_format",
    "block_size",
    "item_format_version",
)
# Git/hub refs that move: a weights "revision" like these names no fixed weights.
MUTABLE_REVISIONS = frozenset({"main", "master", "latest", "head", "default", "stable"})

# Keys removed from tool definitions before digesting: transport credentials that never
# reach the model (e.g. MCP ``headers`` / ``authorization``). Matched case-insensitively
# anywhere in a tool EXCEPT inside ``parameters`` (the JSON Schema the model sees, where
# a property called ``api_token`` is model-visible text, not a secret).
SECRET_KEYS = frozenset(
    {
        "headers",
        "authorization",
        "api_key",
        "apikey",
        "password",
        "secret",
        "token",
        "access_token",
        "refresh_token",
        "client_secret",
        "credentials",
        "cookie",
        "bearer",
    }
)
SECRET_SUFFIXES = ("_secret", "_password", "_api_key", "_token", "_credentials")
_MODEL_VISIBLE_KEYS = frozenset({"parameters"})
# Domain separation: a cache_salt digest can never collide with another sha256 we store.
_CACHE_SALT_DOMAIN = b"ratchet/cache_salt/v1\x00"

JsonInput = Mapping[str, Any] | Sequence[Any] | str | None


def _as_json_value(raw: JsonInput, empty: Any) -> Any:
    """Accept a parsed value or JSON text (any formatting); None means ``empty``."""
    if raw is None:
        return empty
    if isinstance(raw, str):
        return json.loads(raw)
    return raw


def is_secret_key(key: str) -> bool:
    lowered = key.lower()
    return lowered in SECRET_KEYS or lowered.endswith(SECRET_SUFFIXES)


def sanitize_tools(tools: Any) -> Any:
    """A copy of ``tools`` without transport secrets (see ``SECRET_KEYS``)."""
    if isinstance(tools, Mapping):
        return {
            key: value if key in _MODEL_VISIBLE_KEYS else sanitize_tools(value)
            for key, value in tools.items()
            if not is_secret_key(key)
        }
    if isinstance(tools, list | tuple):
        return [sanitize_tools(tool) for tool in tools]
    return tools


def digest_instructions(instructions: str | None) -> str:
    """sha256 hex of the effective instructions text (no instructions = empty text).

    Not normalized: whitespace in instructions reaches the tokens.
    """
    return sha256_hex((instructions or "").encode("utf-8"))


def digest_tools(tools: JsonInput) -> str:
    """sha256 hex of the canonical JSON of the sanitized tools list."""
    return canonical_digest(sanitize_tools(_as_json_value(tools, [])))


def digest_chat_template(template: str) -> str:
    return sha256_hex(template.encode("utf-8"))


def digest_cache_salt(cache_salt: str | None) -> str | None:
    """The identity of a ``cache_salt``, never the salt itself (None when unsalted)."""
    if cache_salt is None:
        return None
    return sha256_hex(_CACHE_SALT_DOMAIN + cache_salt.encode("utf-8"))


def build_fingerprint(
    *,
    model_name: str | None,
    model_weights_revision: str | None,
    tokenizer_name: str | None,
    tokenizer_revision: str | None,
    renderer_name: str | None,
    renderer_version: str | None,
    block_hash_format: str | None,
    router_key_format: str | None,
    block_size: int | None,
    chat_template: str | None = None,
    chat_template_digest: str | None = None,
    chat_template_args: JsonInput = None,
    reasoning_parser: str | None = None,
    reasoning_flags: JsonInput = None,
    tool_parser: str | None = None,
    instructions: str | None = None,
    tools: JsonInput = None,
    lora_name: str | None = None,
    lora_revision: str | None = None,
    multimodal_input_digests: Sequence[str] = (),
    cache_salt: str | None = None,
    item_format_version: int | None = 1,
) -> Fingerprint:
    """The fingerprint of one rendering, from the raw inputs a gateway holds.

    Pass the chat template either as text (``chat_template``) or already digested
    (``chat_template_digest``). ``tools``, ``chat_template_args`` and
    ``reasoning_flags`` may be parsed values or JSON text. ``cache_salt`` is digested
    here and dropped. Missing required inputs are kept as null: validation, not this
    builder, decides (INCOMPLETE_FINGERPRINT), so a bad gateway gets a typed rejection.
    """
    if chat_template is not None and chat_template_digest is not None:
        raise ValueError("pass chat_template or chat_template_digest, not both")
    if chat_template is not None:
        chat_template_digest = digest_chat_template(chat_template)
    return Fingerprint(
        fingerprint_version=CURRENT_FINGERPRINT_VERSION,
        model_name=model_name,
        model_weights_revision=model_weights_revision,
        tokenizer_name=tokenizer_name,
        tokenizer_revision=tokenizer_revision,
        renderer_name=renderer_name,
        renderer_version=renderer_version,
        chat_template_digest=chat_template_digest,
        chat_template_args=canonical_json_text(_as_json_value(chat_template_args, {})),
        reasoning_parser=reasoning_parser,
        reasoning_flags=canonical_json_text(_as_json_value(reasoning_flags, {})),
        tool_parser=tool_parser,
        instructions_digest=digest_instructions(instructions),
        tools_digest=digest_tools(tools),
        lora_name=lora_name,
        lora_revision=lora_revision,
        multimodal_input_digests=tuple(multimodal_input_digests),
        cache_salt_digest=digest_cache_salt(cache_salt),
        block_hash_format=block_hash_format,
        router_key_format=router_key_format,
        block_size=block_size,
        item_format_version=item_format_version,
    )


def canonical_fingerprint(fingerprint: Fingerprint) -> bytes:
    """Canonical JSON of every component, nulls included (the bytes that get hashed)."""
    return canonical_json(fingerprint.model_dump())


def fingerprint_hash(fingerprint: Fingerprint) -> str:
    """sha256 hex of ``canonical_fingerprint``.

    Remembered with ``missing_components`` by ``fingerprint_checks`` (below), keyed by
    the fingerprint's class, its field values and the classes of its numbers: gateways
    send the same few fingerprints millions of times, which makes verification nearly
    free. (It was an lru by the model's value, which gave a fingerprint built without
    validation holding ``True`` the hash of one holding ``1``: equal and hashed alike
    in Python, other canonical JSON; session 47.) ``fingerprint_hash.__wrapped__``
    computes afresh.
    """
    return fingerprint_checks(fingerprint)[0]


def missing_components(fingerprint: Fingerprint) -> tuple[str, ...]:
    """Why ``fingerprint`` is not a complete identity (empty tuple when it is).

    Remembered like ``fingerprint_hash``; ``missing_components.__wrapped__`` computes
    afresh.
    """
    return fingerprint_checks(fingerprint)[1]


def _hash_afresh(fingerprint: Fingerprint) -> str:
    return sha256_hex(canonical_fingerprint(fingerprint))


def _missing_afresh(fingerprint: Fingerprint) -> tuple[str, ...]:
    missing = [name for name in REQUIRED_COMPONENTS if _absent(getattr(fingerprint, name))]
    revision = fingerprint.model_weights_revision
    if revision and revision.strip().lower() in MUTABLE_REVISIONS:
        missing.append(f"model_weights_revision (mutable ref {revision!r})")
    if fingerprint.lora_name and _absent(fingerprint.lora_revision):
        missing.append("lora_revision")
    if fingerprint.block_size is not None and fingerprint.block_size <= 0:
        missing.append("block_size (must be > 0)")
    return tuple(missing)


# ``fingerprint_checks``' memory: the fingerprint's class and fields -> its answers.
_CHECKS: dict[tuple[Any, ...], tuple[str, tuple[str, ...]]] = {}
_CHECKS_MAX = 4096


def fingerprint_checks(fingerprint: Fingerprint) -> tuple[str, tuple[str, ...]]:
    """``(fingerprint_hash(fp), missing_components(fp))``, what validation asks of every
    turn's fingerprint.

    Remembered by the fingerprint's class and its field values in ``__dict__``'s order,
    which is the fields' order for every instance of a class (validation,
    ``model_construct`` and ``model_copy`` keep it; ``tests/unit/test_fingerprint.py``
    checks; no extra attributes: ``extra="forbid"``), compared as pydantic's ``__eq__``
    compares them, and the classes of its numeric fields. Hashing that tuple is C,
    where lru caches by the model call its Python ``__hash__`` and ``__eq__`` (12
    calls a turn; the two asks 1.6-1.9 against 4.7-6.9 us). At most ``_CHECKS_MAX``
    entries, all dropped when full (gateways send a few fingerprints); a race between
    threads can only store an answer twice, each the pure function's of its key."""
    fields = fingerprint.__dict__
    # A model built without validation (``model_copy(update=...)``, ``model_construct``)
    # may hold ``True`` or ``1.0`` where validation makes ``1``: equal, hashed alike,
    # other canonical JSON (``true``, ``1.0``). The classes of the numeric fields (every
    # field but text and the tuple: tests/unit/test_fingerprint.py) tell them apart (a
    # review, session 47: the int's hash was given to the bool).
    key = (type(fingerprint), *fields.values(), fields["fingerprint_version"].__class__,
           fields["block_size"].__class__, fields["item_format_version"].__class__)
    found = _CHECKS.get(key)
    if found is None:
        found = (_hash_afresh(fingerprint), _missing_afresh(fingerprint))
        if len(_CHECKS) >= _CHECKS_MAX:
            _CHECKS.clear()
        _CHECKS[key] = found
    return found


# As the lru caches these were: ``cache_clear`` forgets, ``__wrapped__`` computes afresh.
fingerprint_checks.cache_clear = _CHECKS.clear  # type: ignore[attr-defined]
fingerprint_hash.cache_clear = _CHECKS.clear  # type: ignore[attr-defined]
missing_components.cache_clear = _CHECKS.clear  # type: ignore[attr-defined]
fingerprint_hash.__wrapped__ = _hash_afresh  # type: ignore[attr-defined]
missing_components.__wrapped__ = _missing_afresh  # type: ignore[attr-defined]


def _absent(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())
