"""Calling a store hook where a ``StopIteration`` out of it would be misread.

A ``StopIteration`` means "no more" to every generator, iterator and coroutine it passes
through, and an asyncio future refuses to hold one: ``asyncio.to_thread`` of a hook that
raises it never completes (the loop logs a ``TypeError`` and the caller waits for ever).
Each boundary the store's hooks are called across goes through one of these three
functions, which raise ``StrayStopIteration`` in its place: the same typed failure
whether the call was blocking, awaited or in a thread. The store's blocking calls that
reach hooks (``base.py``: each delegating to a part; the history reads wrap their hooks
and clock themselves) go through ``call_hook`` too,
so that none lets a bare ``StopIteration`` out to a caller iterating (a ``map`` over
store calls would end short, with no error) or to a thread's future (the worker's
``run_in_executor``: it would never complete)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from services.store.errors import StrayStopIteration

T = TypeVar("T")


def call_hook(hook: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``hook(*args, **kwargs)``, a ``StopIteration`` out of it raised as
    ``StrayStopIteration``."""
    try:
        return hook(*args, **kwargs)
    except StopIteration as stop:
        raise stray_stop(hook, stop) from stop


async def await_hook(hook: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """``await hook(*args)``, with a ``StopIteration`` out of it raised as
    ``StrayStopIteration``: one raised by the call itself (a plain callable), or one
    that left a coroutine (which Python turned into a bare ``RuntimeError`` caused by it)."""
    try:
        return await hook(*args, **kwargs)
    except StopIteration as stop:
        raise stray_stop(hook, stop) from stop
    except RuntimeError as error:
        if type(error) is RuntimeError and isinstance(error.__cause__, StopIteration):
            raise stray_stop(hook, error.__cause__) from error.__cause__
        raise


async def in_thread(hook: Callable[..., T], *args: Any) -> T:
    """``asyncio.to_thread(hook, *args)`` that completes whatever the hook raises (a
    ``StopIteration`` cannot be set on the future that brings the answer back)."""
    return await asyncio.to_thread(call_hook, hook, *args)


def stray_stop(hook: Callable[..., Any], stop: StopIteration) -> StrayStopIteration:
    """The failure to raise, from ``stop``, for ``hook``'s ``StopIteration``."""
    name = getattr(hook, "__qualname__", None) or repr(hook)
    return StrayStopIteration(f"the store's hook {name} raised StopIteration ({stop!r}): "
                              "a bug in the hook, not an answer")
