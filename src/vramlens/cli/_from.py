"""``--from FILE`` (and ``--from-format``): a run config people already have as the workload's base.

The file's keys are the base, ``-c`` cannot be combined with it, and flags override both; the
report's assumptions start with how the file was read (each mapping, marked where a flag
overrode it) and what in it vramlens does not model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from vramlens.errors import InputError
from vramlens.workload.sources._formats import FORMATS

if TYPE_CHECKING:
    from vramlens.workload.sources import SourcedWorkload

__all__ = ["WorkloadInputs", "from_options", "overridden_keys", "with_source"]


def from_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Adds ``--from FILE`` and ``--from-format NAME`` to a command."""
    func = click.option(
        "--from-format",
        "from_format",
        type=click.Choice(list(FORMATS)),
        default=None,
        help="Read --from as this format instead of recognising it by its content.",
    )(func)
    names = ", ".join(f.description for f in FORMATS.values())
    return click.option(
        "--from",
        "run_config",
        type=click.Path(dir_okay=False),
        default=None,
        metavar="FILE",
        help=f"A run config to start from ({names}); flags override it.",
    )(func)


def overridden_keys(overrides: Mapping[str, Any]) -> frozenset[str]:
    """Dotted workload keys a flag set (``batch``, ``parallel.gpus``)."""
    keys: set[str] = set()
    for key, value in overrides.items():
        if isinstance(value, Mapping):
            keys.update(f"{key}.{sub}" for sub in value)
        else:
            keys.add(key)
    return frozenset(keys)


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkloadInputs:
    """What a command's workload is built from: the base (``-c`` file or ``--from`` config), the
    flags' overrides and, for ``--from``, how the config was read."""

    base: dict[str, Any]
    overrides: dict[str, Any]
    source: SourcedWorkload | None = None

    def assumptions(self) -> tuple[str, ...]:
        """The source's lines for the report (empty without ``--from``)."""
        if self.source is None:
            return ()
        return self.source.assumptions(overridden_keys(self.overrides))


def read_source(options: Mapping[str, Any], config: str | None) -> SourcedWorkload | None:
    """The ``--from`` config of a command's options, or None."""
    path = options.get("run_config")
    if path is None:
        if options.get("from_format") is not None:
            raise InputError("--from-format: give the file with --from FILE")
        return None
    if config is not None:
        raise InputError("--from and -c/--config: give one workload base, not both (flags override either)")
    from vramlens.workload.sources import read_run_config

    return read_run_config(path, format=options.get("from_format"))


def with_source(report: Any, inputs: WorkloadInputs) -> Any:
    """``report`` with the source's lines at the head of its assumptions."""
    notes = inputs.assumptions()
    if not notes:
        return report
    return dataclasses.replace(report, assumptions=(*notes, *report.assumptions))
