"""``vramlens simulate MODEL [flags]`` and ``vramlens compare MODEL [flags]``.

Both take the same workload flags and files as ``estimate``. ``simulate`` runs the real
transformers model on fake tensors (needs the [torch] and [hf] extras); ``compare``
prints the estimate and the simulation side by side, per memory level, phase and category.
"""

from __future__ import annotations

from typing import Any

import click

from vramlens.cli._from import with_source
from vramlens.cli._output import dumps, echo
from vramlens.cli._pictures import check_pictures, picture_options, write_pictures
from vramlens.cli.estimate import with_workload_options, workload_inputs

__all__ = ["compare_command", "simulate_command"]


def _simulate(base: dict[str, Any], overrides: dict[str, Any], steps: int, stacks: bool, timeout: float | None) -> Any:
    """The simulation of the workload; its ``alloc_conf`` (``--alloc-conf``) sets the allocator replay."""
    from vramlens.hardware import resolve_gpu
    from vramlens.model.resolve import load_model
    from vramlens.simulator import simulate_resolved
    from vramlens.simulator._guard import DEFAULT_TIMEOUT_S
    from vramlens.workload.load import load_workload

    workload = load_workload(base, overrides)
    gpu = resolve_gpu(workload.gpu) if workload.gpu is not None else None
    spec = load_model(workload.model)
    return simulate_resolved(
        spec,
        workload,
        gpu,
        steps=steps,
        capture_stacks=stacks,
        timeout_s=DEFAULT_TIMEOUT_S if timeout is None else (timeout or None),
    )


#: ``--timeout SECONDS`` (0: no limit), shared by simulate and compare.
_TIMEOUT = click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=None,
    help="Stop a simulation that runs longer than this many seconds (0: no limit; default: 600).",
)


@click.command("simulate")
@click.argument("model", required=False)
@click.option("-c", "--config", "config", type=click.Path(dir_okay=False), help="Workload file (YAML or JSON).")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown"]), default="table", show_default=True)
@click.option("--steps", type=click.IntRange(1, 100), default=2, show_default=True, help="Training steps to run.")
@click.option(
    "--stacks",
    is_flag=True,
    help="Record the Python stack of every allocation (slower); with --timeline, vramlens view shows them "
    "(--user-frames: your code's frames only).",
)
@click.option("--timeline", "timeline_path", type=click.Path(dir_okay=False), help="Save every event to this .npz.")
@_TIMEOUT
@picture_options
@with_workload_options
def simulate_command(
    model: str | None,
    config: str | None,
    fmt: str,
    steps: int,
    stacks: bool,
    timeline_path: str | None,
    timeout: float | None,
    ascii_only: bool,
    plot_path: str | None,
    html_path: str | None,
    **options: Any,
) -> None:
    """Run MODEL's real transformers code on fake tensors and report every allocation's memory."""
    check_pictures(plot_path=plot_path, html_path=html_path)
    inputs = workload_inputs(model, config, options, command="simulate")
    report = with_source(_simulate(inputs.base, inputs.overrides, steps, stacks, timeout), inputs)
    if timeline_path is not None and report.timeline is not None:
        from vramlens.trace.timeline_io import save_timeline

        written = save_timeline(report.timeline, timeline_path)
        echo(f"timeline: {len(report.timeline)} events written to {written}", err=True)
    if fmt == "json":
        click.echo(dumps(report.to_dict(), indent=2))
    elif fmt == "markdown":
        from vramlens.report.text import markdown_report

        echo(markdown_report(report), nl=False)
    else:
        from vramlens.report.text import print_report

        print_report(report, ascii_only=ascii_only)
    write_pictures(report, plot_path=plot_path, html_path=html_path)


@click.command("compare")
@click.argument("model", required=False)
@click.option("-c", "--config", "config", type=click.Path(dir_okay=False), help="Workload file (YAML or JSON).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--steps", type=click.IntRange(1, 100), default=2, show_default=True, help="Training steps to simulate.")
@_TIMEOUT
@click.option(
    "--plot", "plot_path", type=click.Path(dir_okay=False), help="Also draw both peak breakdowns: .png or .svg."
)
@with_workload_options
def compare_command(
    model: str | None,
    config: str | None,
    fmt: str,
    steps: int,
    timeout: float | None,
    plot_path: str | None,
    **options: Any,
) -> None:
    """Estimate and simulate MODEL's workload and print them side by side per level, phase and category."""
    from vramlens.estimator import estimate
    from vramlens.report.compare import compare_reports, comparison_dict, comparison_table

    inputs = workload_inputs(model, config, options, command="compare")
    base, overrides = inputs.base, inputs.overrides
    if plot_path is not None:
        from vramlens.report.plot import plot_target

        plot_target(plot_path)  # a bad --plot is refused before the simulation runs
    estimated = with_source(estimate(base, **overrides), inputs)
    simulated = with_source(_simulate(base, overrides, steps, False, timeout), inputs)
    comparison = compare_reports([estimated, simulated])
    if fmt == "json":
        click.echo(dumps(comparison_dict(comparison), indent=2))
    else:
        from vramlens.report.terminal import terminal_console

        terminal_console().print(comparison_table(comparison))
    if plot_path is not None:
        from vramlens.report.plot import save_comparison

        written = save_comparison([estimated, simulated], plot_path)
        echo(f"plot: written to {written}", err=True)
