"""``vramlens gpus [NAME] [--memory SIZE]``: the GPU table, one card, or the cards with a given memory.

NAME is read as ``--gpu`` reads it (a table name or alias, ``nvidia-smi``'s or torch's name, or a
size such as ``24GiB``); the answer lists the cards sold with the same memory beside it.
"""

from __future__ import annotations

from typing import Any

import click

from vramlens.cli._output import dumps, echo
from vramlens.hardware import GpuSpec, gpu_table, resolve_gpu, same_memory
from vramlens.units import format_bytes

__all__ = ["gpus_command"]


def _row(gpu: GpuSpec) -> dict[str, Any]:
    return {
        "name": gpu.name,
        "display_name": gpu.display_name,
        "memory_bytes": gpu.memory_bytes,
        "memory": format_bytes(gpu.memory_bytes),
        "marketed_gb": gpu.marketed_gb,
        "capacity_basis": gpu.capacity_basis,
        "aliases": list(gpu.aliases),
        "same_memory": [other.name for other in same_memory(gpu)],
        "source": gpu.source,
    }


@click.command("gpus")
@click.argument("name", required=False)
@click.option("--memory", "memory", metavar="SIZE", help="Only the cards with about this memory (e.g. 24GiB, 80GB).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def gpus_command(name: str | None, memory: str | None, fmt: str) -> None:
    """List the GPUs vramlens knows (capacity as torch reports it, and its source), or describe NAME
    (a table name, nvidia-smi's or torch's name, or a size) with the cards that have the same memory."""
    if name is not None and memory is not None:
        raise click.UsageError("give NAME or --memory, not both")
    if name is not None:
        gpus = [resolve_gpu(name, field_name="NAME")]
    elif memory is not None:
        gpus = same_memory(resolve_gpu(memory, field_name="--memory"))
    else:
        gpus = list(gpu_table())
    rows = [_row(gpu) for gpu in gpus]
    if fmt == "json":
        click.echo(dumps(rows if name is None else rows[0], indent=2))
        return
    if name is not None:
        _describe(gpus[0], rows[0])
        return
    if not rows:
        echo(f"no card in the table has about {memory}")
        return
    from vramlens.report.console import fit_lines

    width = max(len(row["name"]) for row in rows)
    lines = [f"{'name':<{width}}  {'memory':>11}  {'basis':<18}  same memory as"]
    for row in rows:
        same = ", ".join(row["same_memory"]) or "-"
        lines.append(f"{row['name']:<{width}}  {row['memory']:>11}  {row['capacity_basis']:<18}  {same}")
    for line in fit_lines(lines):
        echo(line)


def _describe(gpu: GpuSpec, row: dict[str, Any]) -> None:
    from vramlens.report.console import fit_lines

    lines = [
        f"{gpu.name}: {gpu.display_name}",
        f"  memory:       {row['memory']} ({gpu.memory_bytes:,} bytes, {gpu.capacity_basis})",
        *([f"  also called:  {', '.join(gpu.aliases)}"] if gpu.aliases else []),
        f"  same memory:  {', '.join(row['same_memory']) or 'no other card in the table'}",
        *([f"  source:       {gpu.source}"] if gpu.source else []),
    ]
    for line in fit_lines(lines):
        echo(line)
