"""Fast makers of frozen, slotted dataclasses for code that makes one per estimate.

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``; the functions
here set the same slots through their descriptors, in a function written once per class (only the
class's own field names reach its source). The object is the one ``__init__`` would make: same
class, same field values, no ``__post_init__`` (a class with one is refused), every field given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any, TypeVar

__all__ = ["maker", "replacer"]

T = TypeVar("T")


def _names(cls: type) -> list[str]:
    if hasattr(cls, "__post_init__") or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__}: only a slotted dataclass without __post_init__")
    names = [field.name for field in fields(cls)]
    if not all(name.isidentifier() for name in names):  # pragma: no cover - dataclass fields always are
        raise TypeError(f"{cls.__name__}: field names must be identifiers")
    return names


def _function(cls: type, source: list[str], names: list[str]) -> Callable[..., Any]:
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    namespace.update({f"_set_{name}": cls.__dict__[name].__set__ for name in names})
    exec(
        compile("\n".join(source), f"<{cls.__name__} maker>", "exec"), namespace
    )  # only the class's field names are in the source
    return namespace["make"]  # type: ignore[no-any-return]


def maker(cls: type[T]) -> Callable[..., T]:
    """``make(*, field=value, ...)``: an instance of ``cls`` with every field given by keyword."""
    names = _names(cls)
    source = [f"def make(*, {', '.join(names)}):", "    made = _new(_cls)"]
    source += [f"    _set_{name}(made, {name})" for name in names]
    source.append("    return made")
    return _function(cls, source, names)


def replacer(cls: type[T], *changed: str) -> Callable[..., T]:
    """``replace(old, *values)``: a copy of ``old`` (an instance of ``cls``) with the fields ``changed``
    set to ``values`` in that order (``dataclasses.replace`` without ``__init__``'s checks)."""
    names = _names(cls)
    if not set(changed) <= set(names):
        raise TypeError(f"{cls.__name__}: no field {sorted(set(changed) - set(names))}")
    source = [f"def make(old, {', '.join(changed)}):", "    made = _new(_cls)"]
    source += [f"    _set_{name}(made, {name if name in changed else f'old.{name}'})" for name in names]
    source.append("    return made")
    return _function(cls, source, names)
