"""Lazy public names of a package (PEP 562): a table name -> module, imported on first access."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from typing import Any

__all__ = ["lazy_attribute"]


def lazy_attribute(namespace: dict[str, Any], table: Mapping[str, str], name: str) -> Any:
    """The value of ``name`` for a package's ``__getattr__``: imported from the module ``table``
    names for it and cached in the package's ``namespace`` (its ``globals()``); an
    :class:`AttributeError` for a name the table does not hold."""
    module_name = table.get(name)
    if module_name is None:
        raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
    value = getattr(import_module(module_name), name)
    namespace[name] = value
    return value
