"""The picture flags shared by ``estimate``, ``simulate`` and ``view``: ``--ascii``,
``--plot out.png|out.svg`` and ``--html out.html``.

The renderers live in ``report/`` (the terminal timeline in :mod:`vramlens.report.timeline_text`,
static plots in :mod:`vramlens.report.plot`, the HTML report in :mod:`vramlens.report.html`)
and are imported only when their flag is given, so the core commands stay light.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click

from vramlens.cli._output import echo
from vramlens.errors import InputError
from vramlens.result.report import MemoryReport

__all__ = ["check_pictures", "picture_options", "write_pictures"]


def picture_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--ascii``, ``--plot`` and ``--html`` to a command (parameters ``ascii_only``,
    ``plot_path`` and ``html_path``)."""
    func = click.option(
        "--html",
        "html_path",
        type=click.Path(dir_okay=False),
        help="Also write a self-contained interactive HTML report (works offline).",
    )(func)
    func = click.option(
        "--plot",
        "plot_path",
        type=click.Path(dir_okay=False),
        help="Also write a picture: .png or .svg (needs the [plot] extra).",
    )(func)
    return click.option(
        "--ascii", "ascii_only", is_flag=True, help="Draw the terminal pictures in plain ASCII (no Unicode blocks)."
    )(func)


def check_pictures(*, plot_path: str | None, html_path: str | None) -> None:
    """Refuse a bad ``--plot``/``--html`` path before any work is done (one line), so that a long
    simulation is not lost to a typo in a file name."""
    if plot_path is not None:
        from vramlens.report.plot import plot_target

        plot_target(plot_path)
    if html_path is not None:
        target = Path(html_path)
        if target.suffix.lower() not in (".html", ".htm"):
            raise InputError(f"--html: cannot write {str(target)!r}; accepted suffixes: .html, .htm")
        if not target.parent.is_dir():
            raise InputError(f"--html: folder {str(target.parent)!r} does not exist")


def write_pictures(
    report: MemoryReport,
    *,
    plot_path: str | None,
    html_path: str | None,
    details: Mapping[str, Any] | None = None,
) -> None:
    """Write the files the flags asked for and say where they went (on stderr, so that
    ``--format json`` output stays clean). ``details``: extra facts of a measured run for the
    HTML report (``top_allocations`` as in ``vramlens view --format json``)."""
    if plot_path is not None:
        from vramlens.report.plot import save_plot

        written = save_plot(report, plot_path)
        echo(f"plot: written to {written}", err=True)
    if html_path is not None:
        from vramlens.report.html import save_html

        written = save_html(report, html_path, details=details)
        echo(f"html: written to {written}", err=True)
