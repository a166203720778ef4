"""Values read from files and requests someone else may have written: parsed, walked and shown
with bounds.

A small file can describe an enormous object: YAML aliases and pickle memo references share one
list between many places, so a 500-byte document can stand for 10**30 values ("billion laughs"),
and anything that walks it naively (``str``, ``==``, ``hash``, ``json.dumps``, a recursive
converter) runs out of time or memory. So every reader of untrusted data here:

* parses with :func:`load_json` / :func:`load_yaml` (one-line errors; JSON nesting, YAML
  aliases and merge keys bounded before anything is built from them), or checks what a
  restricted unpickler built with :func:`check_tree`, which visits each distinct container once
  and refuses cycles, nesting deeper than :data:`MAX_DEPTH` and trees whose *expanded* size
  (every shared reference counted as often as it is reachable) passes the reader's budget;
* turns values into text with :func:`brief` (a bounded ``repr``: a few items per container, a
  few levels, long strings and huge integers abridged) and :func:`abridge`, never ``str()`` or
  ``repr()`` of a value it did not check;
* escapes text for the terminal with :func:`terminal_text` (control characters such as ESC
  would otherwise let a file set the window title or rewrite the screen).
"""

from __future__ import annotations

import json
import math
import re
import reprlib
from operator import itemgetter
from typing import Any, Final, cast

from vramlens.errors import InputError, VramlensError

__all__ = [
    "MAX_DEPTH",
    "MAX_DOCUMENT_VALUES",
    "abridge",
    "as_text",
    "brief",
    "check_tree",
    "load_json",
    "load_yaml",
    "terminal_text",
]

#: Deepest nesting accepted in any document (real snapshots nest 8 levels, configs 4).
MAX_DEPTH: Final = 64
#: Values (expanded: a shared value counts once per place it appears) of a configuration
#: document: a workload, an RLHF setup, a matrix, a config.json (real ones hold a few hundred).
MAX_DOCUMENT_VALUES: Final = 200_000
#: Characters of a string kept by :func:`brief`.
_BRIEF_STRING: Final = 60
#: Integers with more bits than this are described, not printed (str() refuses 4,300+ digits).
_BRIEF_INT_BITS: Final = 256
_CONTAINER_TYPES: Final = frozenset({dict, list, tuple, set, frozenset})
#: Dict children :func:`check_tree` counts at once when it can (see ``_TreeCheck._bulk``).
_BULK: Final = 256
_FIRST, _SECOND = itemgetter(0), itemgetter(1)


def abridge(text: str, limit: int = 200) -> str:
    """``text`` when at most ``limit`` characters, else its start and end around a note of how
    many characters were left out (the note counts towards the limit only roughly)."""
    if len(text) <= limit:
        return text
    head = max(limit * 2 // 3, 1)
    tail = max(limit - head - 30, 0)
    end = text[len(text) - tail :] if tail else ""
    return f"{text[:head]}...[{len(text) - head - tail} characters left out]...{end}"


class _BriefRepr(reprlib.Repr):
    """reprlib's bounded repr, with huge integers and str subclasses handled."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = self.maxdeque = 4
        self.maxdict = 4
        self.maxstring = _BRIEF_STRING
        self.maxlong = 40
        self.maxother = _BRIEF_STRING

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > _BRIEF_INT_BITS:
            return f"<an integer of {x.bit_length()} bits>"
        return super().repr_int(x, level)

    def repr1(self, x: Any, level: int) -> str:
        if isinstance(x, bool) or x is None:
            return repr(x)
        if isinstance(x, int):
            return self.repr_int(int(x), level)
        if isinstance(x, str) and type(x) is not str:
            return self.repr_str(str(x), level)
        if isinstance(x, float):
            return repr(float(x))
        return super().repr1(x, level)


_BRIEF: Final = _BriefRepr()


def as_text(value: Any, limit: int = 1000) -> str:
    """A field that should hold a string, as text: a string abridged to ``limit`` characters,
    anything else as :func:`brief` (never ``str()`` of an unchecked container)."""
    return abridge(value, limit) if isinstance(value, str) else brief(value, limit)


def brief(value: Any, limit: int = 80) -> str:
    """A ``repr`` of ``value`` of at most about ``limit`` characters, whatever its size or
    depth (a few items per container, three levels), for messages about untrusted values."""
    try:
        text = _BRIEF.repr(value)
    except Exception:  # a value whose own repr fails: name its type only
        text = f"<{type(value).__name__}>"
    return abridge(text, limit)


#: Code points escaped by :func:`terminal_text`: C0 controls except tab and newline, DEL, C1
#: controls, and the bidirectional overrides and isolates (they reorder what the terminal shows).
_ESCAPED: Final = {
    **{code: f"\\x{code:02x}" for code in (*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0))},
    **{code: f"\\u{code:04x}" for code in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))},
}


def terminal_text(text: str) -> str:
    """``text`` with every control character written as an escape (``\\x1b``): a file's strings
    can then never move the cursor, set the window title or recolour the terminal."""
    return text.translate(_ESCAPED)


def _children(node: Any) -> tuple[list[Any], int]:
    """The containers among a container's items (a dict's values; its keys are hashable, so
    numbers, strings or flat tuples: counted as single values), and how many items it has."""
    if type(node) is dict:
        return [child for child in node.values() if type(child) in _CONTAINER_TYPES], 2 * len(node)
    return [child for child in node if type(child) in _CONTAINER_TYPES], len(node)


def check_tree(
    obj: Any,
    *,
    name: str,
    max_values: int,
    max_depth: int = MAX_DEPTH,
    error: type[VramlensError] = InputError,
) -> int:
    """The expanded number of values in ``obj`` (containers and leaves; a container reachable
    from several places counts once per place); raises ``error`` (one line naming ``name``)
    for a cycle, nesting deeper than ``max_depth``, or more than ``max_values`` values.

    Each distinct container is visited once (a memo by identity), so the check itself costs
    time linear in the distinct objects however large the expansion."""
    if type(obj) not in _CONTAINER_TYPES:
        return 1
    return _TreeCheck(name, max_values, max_depth, error).run(obj)


class _TreeCheck:
    """The walk of :func:`check_tree`: a depth-first walk with an explicit stack of frames
    ``[node, container children, next child, values so far, tallest child]``."""

    def __init__(self, name: str, max_values: int, max_depth: int, error: type[VramlensError]) -> None:
        self.name, self.max_values, self.max_depth, self.error = name, max_values, max_depth, error
        self.done: dict[int, tuple[int, int]] = {}  # id -> (expanded values, height)
        self.keep: list[Any] = []  # every visited container stays alive, so that its id stays unique
        self.on_path: set[int] = set()

    def fail(self, problem: str) -> VramlensError:
        return self.error(f"{self.name}: refused: {problem}")

    def run(self, obj: Any) -> int:
        path = [self._frame(obj, *_children(obj))]
        while path:
            frame = path[-1]
            pending = self._advance(frame)
            if len(path) + frame[4] > self.max_depth:
                raise self.fail(f"values nested deeper than {self.max_depth} levels")
            if pending is not None:
                path.append(self._frame(*pending))
                continue
            self.done[id(frame[0])] = (frame[3], frame[4] + 1)
            self.on_path.discard(id(frame[0]))
            path.pop()
        return self.done[id(obj)][0]

    def _frame(self, node: Any, children: list[Any], count: int) -> list[Any]:
        self.keep.append(node)
        self.on_path.add(id(node))
        return [node, children, 0, 1 + count, 0, 0]

    def _bulk(self, chunk: list[Any]) -> tuple[int, int] | None:
        """``(values added, tallest height)`` of a run of children that are all dicts whose
        container values are all known (a snapshot's trace entries and their shared frame
        lists), counted in C-level passes; None when the run needs the walk one by one (another
        type, or a value not yet visited: also every value on the current path, so a cycle is
        never missed). The same sums as the walk: each dict adds its ``2 * len`` keys and values
        and each known container value its expanded size less the one place already counted."""
        if set(map(type, chunk)) != {dict}:
            return None
        values = [value for entry in chunk for value in entry.values() if type(value) in _CONTAINER_TYPES]
        found = list(map(self.done.get, map(id, values)))
        if None in found:
            return None
        seen = cast("list[tuple[int, int]]", found)
        added = 2 * sum(map(len, chunk)) + sum(map(_FIRST, seen)) - len(seen)
        return added, 1 + max(map(_SECOND, seen), default=0)

    def _advance(self, frame: list[Any]) -> tuple[Any, list[Any], int] | None:
        """Add the frame's children that are known, or hold only known containers, to its
        counts; the first child that must be visited first (with its :func:`_children`), or
        None when all are counted.
        Runs of :data:`_BULK` dict children go through :meth:`_bulk` when they can; a run that
        cannot is walked one by one (``frame[5]``: where the next bulk attempt may start)."""
        children, done, on_path = frame[1], self.done, self.on_path
        index, total, tallest = frame[2], frame[3], frame[4]
        pending: tuple[Any, list[Any], int] | None = None
        while index < len(children):
            if index >= frame[5] and type(children[index]) is dict:
                chunk = children[index : index + _BULK]
                bulk = self._bulk(chunk)
                if bulk is None:
                    frame[5] = index + len(chunk)
                else:
                    index, total, tallest = index + len(chunk), total + bulk[0], max(tallest, bulk[1])
                    if total > self.max_values:
                        raise self._too_many()
                    continue
            child = children[index]
            seen = done.get(id(child))
            if seen is None:
                if id(child) in on_path:
                    raise self.fail("a value that contains itself (a cyclic reference)")
                grandchildren, count = _children(child)
                # all() over C-level maps stops at the first unknown grandchild (a trace's
                # 10**6 entries are not looked up here only to learn that the first is new)
                if not all(map(done.__contains__, map(id, grandchildren))):
                    pending = (child, grandchildren, count)
                    break
                known = list(map(done.__getitem__, map(id, grandchildren)))
                seen = (1 + count + sum(k[0] - 1 for k in known), 1 + max((k[1] for k in known), default=0))
                done[id(child)] = seen
                self.keep.append(child)
            index += 1
            total += seen[0] - 1
            tallest = max(tallest, seen[1])
            if total > self.max_values:
                raise self._too_many()
        frame[2], frame[3], frame[4] = index, total, tallest
        return pending

    def _too_many(self) -> VramlensError:
        return self.fail(
            f"shared references expand to more than {self.max_values:,} values "
            "(a 'billion laughs' document); vramlens reads plain data"
        )


class _NotFinite(ValueError):
    """A JSON number that is not finite (NaN, Infinity, 1e999)."""


def _no_constant(text: str) -> Any:
    raise _NotFinite(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(abridge(text, 40))
    return value


def load_json(
    data: bytes | str,
    *,
    name: str,
    error: type[VramlensError] = InputError,
    what: str = "JSON",
    max_values: int | None = MAX_DOCUMENT_VALUES,
    max_depth: int = MAX_DEPTH,
) -> Any:
    """The JSON document in ``data`` (UTF-8, optional BOM); malformed, too deep, too large or
    over-long numbers raise ``error`` with one line: ``{name}: invalid JSON at line L column
    C: problem``. NaN, Infinity and numbers too large for a float are refused (Python's json
    reads them; JSON has none). ``max_values=None`` bounds only the depth (for large records)."""
    try:
        text = data.decode("utf-8-sig") if isinstance(data, bytes) else data
    except UnicodeDecodeError:
        raise error(f"{name}: not UTF-8 text; expected {what}") from None
    try:
        document = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except _NotFinite as exc:
        raise error(f"{name}: invalid JSON: {exc} is not a finite number; JSON has no NaN or Infinity") from None
    except json.JSONDecodeError as exc:
        raise error(f"{name}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise error(f"{name}: invalid JSON: nested too deeply (more than {max_depth} levels)") from None
    except ValueError as exc:  # an integer of more than 4,300 digits
        raise error(f"{name}: invalid JSON: {abridge(str(exc).splitlines()[0], 120)}") from None
    check_tree(document, name=name, max_values=max_values or 2**62, max_depth=max_depth, error=error)
    return document


def load_yaml(
    text: str,
    *,
    name: str,
    error: type[VramlensError] = InputError,
    max_values: int = MAX_DOCUMENT_VALUES,
    max_depth: int = MAX_DEPTH,
) -> Any:
    """The YAML document in ``text``, read with PyYAML's safe loader (no tags that build
    objects); aliases and ``<<`` merge keys are expanded only after the node graph is checked
    (:func:`check_tree`'s bounds, on the nodes), so a document of aliases cannot blow up.
    Errors are one line: ``{name}: invalid YAML at line L column C: problem``."""
    import yaml

    if _flow_depth(text) > max_depth:  # PyYAML's scanner is quadratic in the nesting of [ and {
        raise error(f"{name}: invalid YAML: nested too deeply (more than {max_depth} levels)")
    loader = None
    try:
        loader = _bounded_loader(yaml)(text)
        loader.bounds = (name, max_values, max_depth, error)
        return loader.get_single_data()
    except VramlensError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        raise error(f"{name}: invalid YAML{where}: {abridge(str(exc.problem), 120)}") from None
    except RecursionError:
        raise error(f"{name}: invalid YAML: nested too deeply (more than {max_depth} levels)") from None
    except Exception as exc:  # yaml.YAMLError, or a value its constructors refuse (4,300+ digits)
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise error(f"{name}: invalid YAML: {abridge(first, 120)}") from None
    finally:
        if loader is not None:
            loader.dispose()


#: Quoted scalars and comments of a YAML text (their brackets do not nest anything).
_QUOTED: Final = re.compile(r"\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\n]|'')*'|#[^\n]*")
_NOT_BRACKET: Final = re.compile(r"[^\[\]{}]+")


def _flow_depth(text: str) -> int:
    """How deep ``[`` and ``{`` nest in a YAML text (quoted strings and comments left out)."""
    depth = deepest = 0
    for char in _NOT_BRACKET.sub("", _QUOTED.sub("", text)):
        depth = depth + 1 if char in "[{" else max(depth - 1, 0)
        deepest = max(deepest, depth)
    return deepest


_LOADERS: dict[str, Any] = {}


def _bounded_loader(yaml: Any) -> Any:
    """A ``yaml.SafeLoader`` subclass that checks the composed node graph before constructing
    (made once: PyYAML is imported lazily)."""
    if "loader" in _LOADERS:
        return _LOADERS["loader"]

    class BoundedLoader(yaml.SafeLoader):  # type: ignore[misc]
        bounds: tuple[str, int, int, type[VramlensError]]

        def construct_document(self, node: Any) -> Any:
            name, max_values, max_depth, error = self.bounds
            check_tree(_node_tree(node), name=name, max_values=max_values, max_depth=max_depth, error=error)
            return super().construct_document(node)

    _LOADERS["loader"] = BoundedLoader
    return BoundedLoader


def _node_tree(root: Any) -> Any:
    """The composed YAML node graph as nested lists (a scalar is its text; a mapping's
    children are its keys and values, merge keys included), one list per node, so that aliased
    nodes stay shared and the check sees the expansion PyYAML would build."""
    if isinstance(root.value, str):
        return root.value
    views: dict[int, list[Any]] = {id(root): []}
    pending = [root]
    while pending:
        node = pending.pop()
        target = views[id(node)]
        for item in node.value:
            for child in item if isinstance(item, tuple) else (item,):
                if isinstance(child.value, str):
                    target.append(child.value)
                    continue
                if id(child) not in views:
                    views[id(child)] = []
                    pending.append(child)
                target.append(views[id(child)])
    return views[id(root)]
