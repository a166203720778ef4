"""``vramlens plan MODEL --gpu a100-80gb --gpus 2 [workload flags]``: configurations that fit, fastest first.

Takes every workload flag ``vramlens estimate`` takes (the user's configuration, the starting
point of the search), plus ``--headroom``, ``--allow-method-change``, ``--top``, ``--format``
and ``--plot``. A rich progress bar appears on stderr when the search runs longer than 1 s.
"""

from __future__ import annotations

import time
from typing import Any

import click

from vramlens.cli._output import dumps, echo
from vramlens.cli.estimate import with_workload_options, workload_inputs
from vramlens.errors import InputError
from vramlens.units import GiB

__all__ = ["plan_command"]

#: Seconds before the progress bar appears (a quick plan shows none).
PROGRESS_AFTER_S = 1.0


class _LazyProgress:
    """A ``progress(done, total)`` callback that shows a rich bar once the search is slow."""

    def __init__(self) -> None:
        self._start = time.monotonic()
        self._bar: Any = None
        self._task: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self._bar is None and time.monotonic() - self._start > PROGRESS_AFTER_S:
            from rich.console import Console
            from rich.progress import Progress

            self._bar = Progress(console=Console(stderr=True), transient=True)
            self._bar.start()
            self._task = self._bar.add_task("planning", total=total)
        if self._bar is not None:
            self._bar.update(self._task, completed=done)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def _notes(changes: tuple[tuple[str, Any, Any], ...]) -> str:
    keys = {key: new for key, _, new in changes}
    notes = []
    if not changes:
        notes.append("your configuration")
    if keys.get("parallel.offload", "none") != "none":
        notes.append("needs host RAM + PCIe")
    if "method" in keys:
        notes.append("trains adapters, not all weights")
    if keys.get("precision") == "bf16":
        notes.append("pure bf16 weights")
    if str(keys.get("optimizer", "")).endswith("8bit"):
        notes.append("bitsandbytes")
    return "; ".join(notes)


def _table(result: Any) -> list[str]:
    from vramlens.planner.render.text import candidate_cells

    lines = [f"{'#':>3}  {'peak/GPU':>10}  {'headroom':>9}  {'rel. time':>9}  changes  [notes]"]
    for rank, cand in enumerate(result.candidates, start=1):
        cells = candidate_cells(cand)
        notes = _notes(cand.changes)
        lines.append(
            f"{rank:>3}  {cells['peak']:>10}  {cells['headroom']:>9}  {cells['relative_step_time']:>9}  {cells['changes']}"
            + (f"  [{notes}]" if notes else "")
        )
    return lines


def _show(result: Any, fmt: str, source: Any = None) -> None:
    if fmt == "json":
        data = result.to_dict()
        if source is not None:
            data["source"] = source.to_dict()
        click.echo(dumps(data, indent=2))
        return
    from vramlens.planner.render.text import plan_searched, plan_title

    echo(plan_title(result))
    echo(plan_searched(result))
    if result.impossible is not None:
        echo(f"impossible: {result.impossible}")
        return
    from vramlens.report.console import fit_lines

    for line in fit_lines(_table(result)):
        echo(line)


@click.command("plan")
@click.argument("model", required=False)
@click.option(
    "-c", "--config", "config", type=click.Path(dir_okay=False), help="Workload file (YAML or JSON); flags override it."
)
@click.option("--headroom", type=float, default=0.10, show_default=True, help="Fraction of each GPU kept free.")
@click.option("--allow-method-change", is_flag=True, help="Also try LoRA, QLoRA and pure bf16 weights.")
@click.option("--top", type=int, default=10, show_default=True, help="Show the N best configurations.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Also draw memory vs time (.png/.svg).")
@click.option(
    "--cheapest", is_flag=True, help="Show the entry with the fewest changes as steps from your settings instead."
)
@click.option("--min-gpus", is_flag=True, help="Show the smallest number of these GPUs on which something fits.")
@with_workload_options
def plan_command(
    model: str | None,
    config: str | None,
    headroom: float,
    allow_method_change: bool,
    top: int,
    fmt: str,
    plot_path: str | None,
    cheapest: bool,
    min_gpus: bool,
    **options: Any,
) -> None:
    """Find training configurations of MODEL that fit the GPUs, fastest first."""
    from vramlens.planner import plan
    from vramlens.workload.load import load_workload

    if top < 1:
        raise InputError(f"--top: must be an integer >= 1, got {top}")
    if cheapest and min_gpus:
        raise InputError("--cheapest, --min-gpus: give one of them")
    inputs = workload_inputs(model, config, options, command="plan")
    base, overrides = inputs.base, inputs.overrides
    workload = load_workload(base, _default_ddp(base, overrides))
    if fmt != "json":
        for line in inputs.assumptions():
            echo(f"  - {line}")
    if cheapest or min_gpus:
        _answer(workload, fmt, headroom=headroom, allow_method_change=allow_method_change, cheapest=cheapest)
        return
    progress = _LazyProgress()
    try:
        result = plan(
            workload,
            headroom=headroom,
            allow_method_change=allow_method_change,
            max_candidates=top,
            progress=progress,
        )
    finally:
        progress.close()
    _show(result, fmt, inputs.source)
    if plot_path is not None and result.candidates:
        from vramlens.planner.render.plot import save_plan_plot

        save_plan_plot(result, plot_path)


def _default_ddp(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``--gpus N`` alone means N data-parallel ranks: plain DDP unless a strategy is given
    (the workload contract refuses several ranks with ``shard: none``)."""
    flags = overrides.get("parallel", {})
    from_file = base.get("parallel") or {}
    if not isinstance(from_file, dict):
        raise InputError(f"parallel: expected a mapping of keys, got {type(from_file).__name__}")
    given = {**from_file, **flags}
    if "gpus" not in flags or "shard" in given:
        return overrides
    try:
        gpus, split = int(given["gpus"]), int(given.get("tp", 1)) * int(given.get("pp", 1)) * int(given.get("cp", 1))
    except (TypeError, ValueError):
        raise InputError(f"--gpus: must be an integer >= 1, got {given['gpus']!r}") from None
    if gpus > split:
        return {**overrides, "parallel": {**flags, "shard": "ddp"}}
    return overrides


def _answer(workload: Any, fmt: str, *, headroom: float, allow_method_change: bool, cheapest: bool) -> None:
    """``--cheapest`` (the fewest changes, step by step) or ``--min-gpus``."""
    from vramlens.planner import cheapest_change, min_gpus

    gpu = workload.gpu
    if not cheapest:
        count = min_gpus(workload, headroom=headroom, allow_method_change=allow_method_change)
        if fmt == "json":
            click.echo(dumps({"gpu": gpu, "headroom": headroom, "min_gpus": count}))
        else:
            echo(f"smallest number of {gpu} that fits with {headroom:.0%} headroom: {count or 'more than 1024'}")
        return
    progress = _LazyProgress()
    try:
        answer = cheapest_change(
            workload, headroom=headroom, allow_method_change=allow_method_change, progress=progress
        )
    finally:
        progress.close()
    if fmt == "json":
        click.echo(dumps({"cheapest": answer.to_dict() if answer is not None else None}, indent=2))
    elif answer is None:
        echo(f"nothing fits {workload.parallel.gpus} x {gpu}; see vramlens plan for the smallest setup that does")
    else:
        name = workload.model if isinstance(workload.model, str) else workload.model.name
        count = len(answer.candidate.changes)
        echo(f"cheapest change for {name} to fit {workload.parallel.gpus} x {gpu}: {count} setting(s)")
        for line in _steps_table(answer):
            echo(line)


def _steps_table(answer: Any) -> list[str]:
    if not answer.steps:
        return ["your configuration already fits: no change needed"]
    lines = [f"{'step':<14} {'peak/GPU':>10}  {'saved':>9}  {'time':>6}  fits  changes"]
    for step in answer.steps:
        changes = ", ".join(f"{k}: {old} -> {new}" for k, old, new in step.changes)
        lines.append(
            f"{step.name:<14} {step.peak_bytes / GiB:>6.1f} GiB  {step.saved_bytes / GiB:>5.1f} GiB"
            f"  {step.time_factor:>5.2f}x  {'yes' if step.fits else 'no ':<4}  {changes}"
        )
    lines.append("time: step time relative to your configuration (a ranking model, not a promise)")
    return lines
