"""``vramlens sweep MODEL --batch 1,2,4,8 [--seq 2k,8k] [flags]``: one estimate per value.

Any workload flag of ``vramlens estimate`` given comma-separated values (``--batch 1,2,4,8``,
``--seq 2k,8k,32k``, ``--tp 1,2,4``) is swept; one or two of them at a time, every pair for
two. ``--sweep KEY=V1,V2`` sweeps any contract key, switches included
(``--sweep compile=false,true``). The other flags set the workload as for ``estimate``.
``--lora-targets`` and ``--modules-to-save`` take comma lists themselves and are never swept.
"""

from __future__ import annotations

from typing import Any

import click

from vramlens.cli._output import dumps, echo
from vramlens.cli.estimate import FLAGS, with_workload_options, workload_arguments
from vramlens.errors import InputError

__all__ = ["sweep_command"]

#: Flags whose single value is itself a comma-separated list.
_LIST_FLAGS = ("lora-targets", "modules-to-save")


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",")]


def _axes(options: dict[str, Any], extra: tuple[str, ...]) -> list[Any]:
    """The swept axes (flags with commas, then ``--sweep KEY=VALUES``); their flags are removed from ``options``."""
    from vramlens.planner.sweep import parse_axis

    axes = []
    for flag, (path, _) in FLAGS.items():
        name = flag.replace("-", "_")
        value = options.get(name)
        if flag in _LIST_FLAGS or not isinstance(value, str) or "," not in value:
            continue
        axes.append(parse_axis(path, _split(value), name=f"--{flag}"))
        options[name] = None
    for item in extra:
        key, sep, values = item.partition("=")
        if not sep or not key.strip() or not values.strip():
            raise InputError(f"--sweep: expected KEY=V1,V2,... (e.g. --sweep parallel.tp=1,2,4), got {item!r}")
        axes.append(parse_axis(key, _split(values), name=f"--sweep {key.strip()}"))
    if not 1 <= len(axes) <= 2:
        raise InputError(
            f"sweep: give one or two flags with comma-separated values (e.g. --batch 1,2,4,8), got {len(axes)}"
        )
    return axes


@click.command("sweep")
@click.argument("model", required=False)
@click.option(
    "-c", "--config", "config", type=click.Path(dir_okay=False), help="Workload file (YAML or JSON); flags override it."
)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--sweep", "extra", multiple=True, metavar="KEY=V1,V2", help="Sweep any workload key (repeatable).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Also write a picture: .png or .svg.")
@click.option("--ascii", "ascii_only", is_flag=True, help="Plain ASCII table (yes/no instead of check marks).")
@with_workload_options
def sweep_command(
    model: str | None,
    config: str | None,
    fmt: str,
    extra: tuple[str, ...],
    plot_path: str | None,
    ascii_only: bool,
    **options: Any,
) -> None:
    """Estimate MODEL at each value of one or two workload keys: growth per category and what fits.

    Token counts take k = 1024 (--seq 2k,8k,32k is 2048, 8192, 32768 tokens).
    """
    from vramlens.planner.sweep import sweep

    if plot_path is not None:
        from vramlens.report.plot import plot_target

        plot_target(plot_path)
    axes = _axes(options, extra)
    base, overrides = workload_arguments(model, config, options, command="sweep")
    result = sweep(base, axes, **overrides)
    if fmt == "json":
        click.echo(dumps(result.to_dict(), indent=2))
    else:
        from vramlens.planner.render.sweep_text import sweep_table

        echo(sweep_table(result, ascii_only=ascii_only), nl=False)
    if plot_path is not None:
        from vramlens.planner.render.sweep_plot import save_sweep_plot

        save_sweep_plot(result, plot_path)
