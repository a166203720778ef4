"""``vramlens experiment MODEL --techniques bf16,checkpoint,... --steps N``: measure what each
memory-saving technique buys on this machine, beside vramlens's predictions.

The control and one run per comma item (``+`` combines techniques in a run) train MODEL (a
catalog name, config.json, model directory, or ``module:callable`` returning an
``nn.Module``) with random weights on random or given tokens; ``-c matrix.yaml`` lists the
runs instead (:mod:`vramlens.experiments.matrix`). Results go to ``--store`` (JSON lines) as
each run finishes; running the same matrix again skips what is stored. A progress bar per run
goes to stderr; the table (or Markdown, or JSON) to stdout.
"""

from __future__ import annotations

from typing import Any

import click

from vramlens.cli._output import dumps, echo
from vramlens.errors import InputError

__all__ = ["experiment_command"]


def _matrix(
    model: str | None, techniques: str | None, config: str | None, settings: dict[str, Any], *, trust: bool
) -> Any:
    from vramlens.experiments.matrix import load_matrix, matrix_from_list

    if config is not None:
        if techniques is not None:
            raise InputError(
                "--techniques: give the runs either in the matrix file (-c) or with --techniques, not both"
            )
        return load_matrix(config, {"model": model, **settings}, trust_model_code=trust)
    if model is None:
        raise InputError("MODEL: required (a catalog name, config.json, model directory or module:callable)")
    return matrix_from_list(model, techniques or "", **{k: v for k, v in settings.items() if v is not None})


def _run_with_progress(matrix: Any, store: Any, *, simulate: bool) -> Any:
    """Run the matrix with one rich progress bar per run on stderr."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from vramlens._untrusted import abridge, terminal_text
    from vramlens.experiments import run_matrix
    from vramlens.experiments.techniques import unavailable_reason

    console = Console(stderr=True, markup=False, highlight=False, emoji=False)
    columns = (TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        current: dict[str, Any] = {}

        def on_run(spec: Any, index: int, count: int, stored: bool) -> None:
            label = f"[{index}/{count}] {terminal_text(abridge(spec.name, 80))}"  # a name from the matrix file
            unavailable = unavailable_reason(spec.techniques)
            if stored or unavailable:
                progress.add_task(f"{label} ({'stored, skipped' if stored else unavailable})", total=1, completed=1)
                return
            current["task"] = progress.add_task(label, total=spec.steps)

        def on_step(done: int, total: int) -> None:
            progress.update(current["task"], completed=done, total=total)

        return run_matrix(matrix, store, simulate=simulate, on_run=on_run, on_step=on_step)


def _ranks(device: str | None) -> Any:
    """This process under torchrun (its process group started: gloo on CPU, nccl on CUDA), or a world of one."""
    from vramlens.trace.ranks import init_from_env, rank_info

    info = rank_info()
    if info.world < 2:
        return info
    from vramlens.experiments.matrix import resolve_device

    return init_from_env(resolve_device(device or "auto"))


@click.command("experiment")
@click.argument("model", required=False)
@click.option(
    "--techniques",
    "techniques",
    metavar="LIST",
    help="Runs besides the control, comma-separated; '+' combines (bf16,checkpoint,bf16+fused-optimizer). "
    "Techniques: bf16, checkpoint, compile, fused-optimizer, memory-budget=X, chunked-loss, 8bit-optimizer, "
    "ddp, fsdp (under torchrun: every rank measures, rank 0 merges).",
)
@click.option("-c", "--config", "config", type=click.Path(dir_okay=False), help="Matrix file (YAML) with the runs.")
@click.option("--steps", type=int, help="Optimizer steps per run (at least 3; default 3).")
@click.option("--batch", type=int, help="Sequences per step (default 4).")
@click.option("--seq", type=int, help="Tokens per sequence (default 256).")
@click.option("--optimizer", type=click.Choice(["adamw", "adafactor", "sgd"]), help="Optimizer (default adamw).")
@click.option("--device", help="auto (default), cpu, cuda or cuda:N.")
@click.option("--tokens", type=click.Path(dir_okay=False), help="Token file (.npy 1-D integers, or .bin uint16).")
@click.option(
    "--store",
    "store_path",
    type=click.Path(dir_okay=False),
    default="vramlens-experiment.jsonl",
    show_default=True,
    help="Results store (JSON lines); finished runs in it are not run again.",
)
@click.option("--format", "fmt", type=click.Choice(["table", "markdown", "json"]), default="table", show_default=True)
@click.option(
    "--plot", "plot_path", type=click.Path(dir_okay=False), help="Also write peak memory vs time: .png or .svg."
)
@click.option("--no-simulate", "no_simulate", is_flag=True, help="Skip the simulator's prediction (estimate only).")
@click.option(
    "--trust-model-code",
    "trust_model_code",
    is_flag=True,
    help="Allow 'model: module:callable' in the matrix file: vramlens imports that module and calls the factory.",
)
def experiment_command(
    model: str | None,
    techniques: str | None,
    config: str | None,
    store_path: str,
    fmt: str,
    plot_path: str | None,
    no_simulate: bool,
    trust_model_code: bool,
    **settings: Any,
) -> None:
    """Train MODEL under memory-saving techniques, measure peak memory, speed and loss, and put
    vramlens's estimate and simulation beside each measurement."""  # fmt: skip
    from vramlens.experiments.store import ResultStore

    if plot_path is not None:
        from vramlens.report.plot import plot_target

        plot_target(plot_path)
    info = _ranks(settings.get("device"))
    matrix = _matrix(model, techniques, config, settings, trust=trust_model_code)
    store = ResultStore(store_path)
    if info.world > 1:  # under torchrun: every rank runs and records; rank 0 merges and reports
        from vramlens.experiments import run_matrix
        from vramlens.trace.ranks import barrier

        result = (
            run_matrix(matrix, store, simulate=not no_simulate)
            if info.rank
            else _run_with_progress(matrix, store, simulate=not no_simulate)
        )
        barrier()
        if info.rank:
            return
    else:
        result = _run_with_progress(matrix, store, simulate=not no_simulate)
    if fmt == "json":
        click.echo(dumps(result.to_dict(), indent=2))
    elif fmt == "markdown":
        from vramlens.experiments.render.table import experiment_markdown

        echo(experiment_markdown(result.rows, device=result.device), nl=False)
    else:
        from vramlens.experiments.render.table import experiment_text

        echo(experiment_text(result.rows, device=result.device), nl=False)
    if plot_path is not None:
        from vramlens.experiments.render.plot import save_experiment_plot

        save_experiment_plot(result.rows, plot_path, device=result.device)
