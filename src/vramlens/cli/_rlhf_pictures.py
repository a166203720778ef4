"""The pictures of ``vramlens rlhf``: the terminal timeline (on by default with ``--format table``,
``--no-timeline`` turns it off), ``--ascii``, ``--plot out.png|out.svg`` and ``--html out.html``.

The same flags and conventions as :mod:`vramlens.cli._pictures` (bad paths refused before any work,
"written to" on stderr so JSON output stays clean); the renderers are the RLHF ones in ``report/``
(:mod:`~vramlens.rlhf.render.text`, :mod:`~vramlens.rlhf.render.plot`, :mod:`~vramlens.rlhf.render.html`),
imported only when needed: matplotlib only for ``--plot``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from vramlens.cli._output import echo
from vramlens.cli._pictures import check_pictures, picture_options

if TYPE_CHECKING:
    from vramlens.rlhf import RlhfReport

__all__ = ["check_pictures", "rlhf_picture_options", "show_rlhf_pictures"]


def rlhf_picture_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--ascii``, ``--plot``, ``--html`` (parameters ``ascii_only``, ``plot_path``, ``html_path``)
    and ``--timeline/--no-timeline`` (``timeline``)."""
    func = click.option(
        "--timeline/--no-timeline",
        "timeline",
        default=True,
        show_default=True,
        help="Draw the per-phase memory timeline after the table (table format only).",
    )(func)
    return picture_options(func)


def show_rlhf_pictures(
    report: RlhfReport,
    *,
    fmt: str,
    ascii_only: bool,
    timeline: bool,
    plot_path: str | None,
    html_path: str | None,
) -> None:
    """Print the terminal timeline (table format) and write the files the flags asked for."""
    if fmt == "table" and timeline:
        from vramlens.report.terminal import terminal_console
        from vramlens.rlhf.render.text import RlhfTimeline

        console = terminal_console()
        console.print()
        console.print(RlhfTimeline(report=report, ascii=ascii_only))
    if plot_path is not None:
        from vramlens.rlhf.render.plot import plot_rlhf

        echo(f"plot: written to {plot_rlhf(report, plot_path)}", err=True)
    if html_path is not None:
        from vramlens.rlhf.render.html import save_rlhf_html

        echo(f"html: written to {save_rlhf_html(report, html_path)}", err=True)
