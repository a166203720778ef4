"""Parsing helpers shared by the run config readers: YAML/JSON text, command lines, flag values.

Nothing here executes anything: YAML and JSON go through the bounded readers of
:mod:`vramlens._untrusted` (PyYAML's safe loader, aliases checked before expansion), command lines through
``shlex`` (a tokenizer, not a shell).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from vramlens.errors import InputError

__all__ = ["Arguments", "as_bool", "as_int", "environment", "parse_command", "parse_document", "split_command"]

#: A command-line file with more tokens than this is not a command line.
MAX_TOKENS: Final = 20_000
_TRUE: Final = frozenset({"true", "yes", "1", "on"})
_FALSE: Final = frozenset({"false", "no", "0", "off", "none", "null", ""})


def parse_document(text: str, origin: str, *, json_first: bool) -> Any:
    """A YAML or JSON document (JSON is YAML too, but JSON errors read better from ``json``), read
    with the bounded readers of :mod:`vramlens._untrusted` (no alias bombs, no deep nesting)."""
    from vramlens._untrusted import load_json, load_yaml

    if json_first:
        return load_json(text, name=origin)
    return load_yaml(text, name=origin)


def split_command(text: str, origin: str) -> list[str]:
    """The tokens of a command line as a POSIX shell would split them (continuation lines joined,
    ``#`` comments dropped); nothing is expanded or run."""
    joined = text.replace("\\\r\n", " ").replace("\\\n", " ")
    try:
        lexer = shlex.shlex(joined, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        tokens = []
        for token in lexer:
            tokens.append(token)
            if len(tokens) > MAX_TOKENS:
                raise InputError(f"{origin}: more than {MAX_TOKENS} words; not a command line")
    except ValueError as exc:
        raise InputError(f"{origin}: cannot split the command line: {exc}") from None
    return tokens


#: Words that end one shell command (``split_command`` keeps them as tokens).
SEPARATORS: Final = frozenset({";", "&&", "||", "|", "&"})


def _assignment(token: str) -> tuple[str, str] | None:
    name, equals, value = token.partition("=")
    if equals and name and (name[0].isalpha() or name[0] == "_") and name.replace("_", "").isalnum():
        return name, value
    return None


def environment(tokens: list[str]) -> dict[str, str]:
    """The environment variables a command line sets: ``NAME=value`` words in front of a command
    (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True torchrun ...``) and ``export NAME=value``;
    the last assignment wins. Nothing is expanded (``$VAR`` stays as written)."""
    found: dict[str, str] = {}
    leading = True
    exporting = False
    for token in tokens:
        if token in SEPARATORS:
            leading, exporting = True, False
            continue
        pair = _assignment(token)
        if pair is not None and (leading or exporting):
            found[pair[0]] = pair[1]
            continue
        if token == "export" and leading:
            exporting = True
            continue
        leading = exporting = False
    return found


@dataclass
class Arguments:
    """``--name value`` options of one program (names with ``-`` as ``_``, last one wins) and its positionals."""

    program: list[str] = field(default_factory=list)
    positionals: list[str] = field(default_factory=list)
    options: dict[str, list[str]] = field(default_factory=dict)
    spelled: dict[str, str] = field(default_factory=dict)
    """How each option was written (``--per_device_train_batch_size``), for notes."""

    def has(self, name: str) -> bool:
        return name in self.options

    def value(self, name: str) -> str | None:
        """The option's single value (None for a bare flag or an absent option)."""
        values = self.options.get(name)
        return values[0] if values else None


def _is_option(token: str) -> bool:
    if not token.startswith("-") or token in ("-", "--"):
        return False
    try:
        float(token)
    except ValueError:
        return True
    return False


def parse_command(tokens: list[str], *, short: Mapping[str, str] | None = None) -> Arguments:
    """Options and positionals of a token list: ``--a b c`` gives ``a = [b, c]``, ``--a=b`` gives
    ``a = [b]``, ``--flag`` alone gives ``flag = []``; ``short`` maps ``-tp`` style aliases."""
    args = Arguments()
    current: str | None = None
    for token in tokens:
        if _is_option(token):
            raw, _, inline = token.partition("=")
            name = raw.lstrip("-").replace("-", "_")
            if short and raw in short:
                name = short[raw]
            args.options[name] = []
            args.spelled[name] = raw
            current = name
            if inline or "=" in token:
                args.options[name].append(inline)
                current = None
        elif current is not None:
            args.options[current].append(token)
        else:
            args.positionals.append(token)
    return args


def as_bool(key: str, values: list[str] | None) -> bool:
    """An HfArgumentParser-style boolean: a bare ``--flag`` is true, else ``true/false/yes/no/1/0``."""
    if not values:
        return True
    text = values[0].strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise InputError(f"{key}: must be true or false, got {values[0]!r}")


def truthy(value: Any) -> bool:
    """A YAML value read as a switch (``true``, ``"true"``, ``1``); None and empty are false."""
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    if isinstance(value, (int, float)):
        return value != 0
    if isinstance(value, str):
        return value.strip().lower() in _TRUE
    return bool(value)


def as_int(key: str, value: Any) -> int:
    """An integer from YAML/JSON or a command line (``1e9`` style floats that are whole are accepted)."""
    if isinstance(value, bool):
        raise InputError(f"{key}: must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        if text.lstrip("-").isdigit() and len(text) < 30:
            return int(text)
        try:
            number = float(text)
        except ValueError:
            number = float("nan")
        if number.is_integer() and abs(number) < 2**63:
            return int(number)
    raise InputError(f"{key}: must be an integer, got {value!r}"[:200])


def or_empty(value: Any) -> Any:
    """``{}`` for a key that is absent or null (YAML's empty value), else the value as written
    (a wrong type is left for the reader to refuse by name)."""
    return {} if value is None else value
