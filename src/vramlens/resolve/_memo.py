"""Bounded memoization of derived quantities on a ModelSpec (for estimates run in bulk)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

from vramlens.model.spec import ModelSpec

__all__ = ["MEMO_LIMIT", "memo"]

T = TypeVar("T")

#: Entries kept per spec before the memo is cleared (planners try many workloads on one model).
MEMO_LIMIT = 4096


def memo(spec: ModelSpec, key: Hashable, compute: Callable[[], T]) -> T:
    """``compute()`` once per ``key`` for this spec. ``key`` is a frozen record of everything
    ``compute`` reads besides the spec (e.g. :class:`~vramlens.estimator.layout.LayoutInputs`); its
    class tells one memoized quantity from another."""
    cache = spec.derived_cache
    try:
        return cache[key]  # type: ignore[return-value]
    except KeyError:
        pass
    if len(cache) >= MEMO_LIMIT:
        cache.clear()
    value = compute()
    cache[key] = value
    return value
