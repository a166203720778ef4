"""``vramlens view FILE...`` and ``vramlens diff A B``: read measured memory records.

A FILE is a vramlens timeline (.npz), a PyTorch memory snapshot (pickle or JSON) or a torch
profiler memory timeline export (:mod:`vramlens.forensics.sources`). Several FILEs are one
run's ranks: per-rank peaks, their skew, and the details of the highest rank.
"""

from __future__ import annotations

from typing import Any

import click

from vramlens.cli._output import dumps
from vramlens.cli._pictures import check_pictures, picture_options, write_pictures

__all__ = ["diff_command", "view_command"]

_FORMAT = click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True, help="Output format."
)
_DEVICE = click.option(
    "--device", type=click.IntRange(min=0), default=None, help="Device of a snapshot to read (default: its first)."
)
_NO_REPLAY = click.option(
    "--no-replay",
    is_flag=True,
    help="Skip the caching-allocator replay (modelled reserved memory; about 2 s per million events).",
)


@click.command("view")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@_FORMAT
@click.option("--top", type=click.IntRange(1, 1000), default=10, show_default=True, help="Allocations to list.")
@click.option("--modules", type=click.IntRange(1, 1000), default=10, show_default=True, help="Modules to list.")
@click.option(
    "--leak-steps",
    type=click.IntRange(1, 1000),
    default=2,
    show_default=True,
    help="Step ends an allocation must survive to count as a leak.",
)
@click.option("--stack-lines", type=click.IntRange(1, 50), default=3, show_default=True, help="Stack frames shown.")
@click.option(
    "--user-frames",
    is_flag=True,
    help="Show only your own code's stack frames (no site-packages, no standard library).",
)
@_DEVICE
@_NO_REPLAY
@picture_options
def view_command(
    files: tuple[str, ...],
    fmt: str,
    top: int,
    modules: int,
    leak_steps: int,
    stack_lines: int,
    user_frames: bool,
    device: int | None,
    no_replay: bool,
    ascii_only: bool,
    plot_path: str | None,
    html_path: str | None,
) -> None:
    """Explain the memory of a recorded run: peak per level, categories, modules, phases, largest
    allocations, leaks and OOMs. FILES: vramlens .npz timelines, PyTorch memory snapshots, or
    torch profiler memory exports; several files are one run's ranks."""
    from vramlens.forensics.sources import open_source
    from vramlens.forensics.view import build_view

    check_pictures(plot_path=plot_path, html_path=html_path)
    sources = [open_source(path, device=device) for path in files]
    options: dict[str, Any] = {
        "top": top,
        "modules": modules,
        "leak_steps": leak_steps,
        "replay_allocator": not no_replay,
    }
    # The terminal renderers (rich) and the ranks' comparison are imported only when used.
    if len(sources) == 1:
        view = build_view(sources[0], **options)
        if fmt == "json":
            click.echo(dumps(view.to_dict(), indent=2))
        else:
            from vramlens.report.view_text import print_renderable, view_renderable

            print_renderable(
                view_renderable(view, stack_lines=stack_lines, ascii_only=ascii_only, user_frames=user_frames)
            )
    else:
        from vramlens.forensics.diff import build_ranks

        ranks = build_ranks(sources, **options)
        if fmt == "json":
            click.echo(dumps(ranks.to_dict(), indent=2))
        else:
            from vramlens.report.view_text import print_renderable, ranks_renderable

            print_renderable(
                ranks_renderable(ranks, stack_lines=stack_lines, ascii_only=ascii_only, user_frames=user_frames)
            )
        view = ranks.detailed  # pictures show the rank with the highest peak
    write_pictures(view.report, plot_path=plot_path, html_path=html_path, details=view.to_dict())


@click.command("diff")
@click.argument("a", type=click.Path(dir_okay=False))
@click.argument("b", type=click.Path(dir_okay=False))
@_FORMAT
@click.option(
    "--top", type=click.IntRange(1, 10**6), default=20, show_default=True, help="Rows shown per section (table)."
)
@_DEVICE
@_NO_REPLAY
def diff_command(a: str, b: str, fmt: str, top: int, device: int | None, no_replay: bool) -> None:
    """Compare run B with run A: peak per level, and per category, phase and module (bytes and %):
    the TOP largest differences of each section, the rest summed, and each section's total."""
    from vramlens.forensics.diff import diff_views
    from vramlens.forensics.sources import open_source
    from vramlens.forensics.view import build_view

    views = [
        build_view(open_source(path, device=device), top=1, modules=10**6, replay_allocator=not no_replay)
        for path in (a, b)
    ]
    diff = diff_views(*views)
    if fmt == "json":
        click.echo(dumps(diff.to_dict(), indent=2))
        return
    from vramlens.report.view_text import diff_renderable, print_renderable

    print_renderable(diff_renderable(diff, top=top))
