"""``vramlens estimate MODEL [flags]`` and ``vramlens estimate -c run.yaml [flags]``.

Every workload key is a flag with the same name in dashes (``--grad-accum``);
``lora.*`` keys are ``--lora-rank`` etc., ``parallel.*`` keys are plain
(``--gpus``, ``--tp``, ``--shard``). Flags override the file. Values are
validated by the workload loader, so errors are the same one-liners as for files.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from vramlens.cli._from import WorkloadInputs, from_options, read_source, with_source
from vramlens.cli._output import dumps, echo
from vramlens.cli._pictures import check_pictures, picture_options, write_pictures
from vramlens.errors import InputError
from vramlens.workload.keys import KEYS, Key, Kind

__all__ = ["FLAGS", "estimate_command", "with_workload_options", "workload_arguments", "workload_inputs"]


def _flag_help(key: Key) -> str:
    """A workload flag's ``--help``: the key's declared line, then an enum's values."""
    return f"{key.help}: {key.accepted()}" if key.values is not None else key.help


#: flag name -> (workload path, help), generated from the declaration of every workload key
#: (:data:`vramlens.workload.keys.KEYS`). Paths with a dot go into the ``lora`` / ``parallel`` blocks.
FLAGS: dict[str, tuple[str, str]] = {
    key.flag_name: (key.path, _flag_help(key)) for key in KEYS if key.flag_name and key.kind is not Kind.SWITCH
}
#: Boolean workload keys (``--compile/--no-compile``).
SWITCHES: dict[str, tuple[str, str]] = {
    key.flag_name: (key.path, key.help) for key in KEYS if key.flag_name and key.kind is Kind.SWITCH
}


def _set(overrides: dict[str, Any], path: str, value: Any) -> None:
    block, _, key = path.rpartition(".")
    target = overrides.setdefault(block, {}) if block else overrides
    target[key] = value


def _overrides(options: dict[str, Any]) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for flag, (path, _) in {**FLAGS, **SWITCHES}.items():
        value = options.get(flag.replace("-", "_"))
        if value is not None:
            _set(overrides, path, value)
    return overrides


def _default(path: str) -> str:
    """The contract default of a workload key (``batch``, ``lora.rank``, ``parallel.gpus``) as --help shows it."""
    import dataclasses

    from vramlens.workload.spec import LoraConfig, Parallelism, Workload

    block, _, key = path.rpartition(".")
    owner = {"": Workload, "lora": LoraConfig, "parallel": Parallelism}[block]
    field = next(f for f in dataclasses.fields(owner) if f.name == key)
    value = field.default
    if value is None:
        return "none" if key != "gpu" else "none: no fit check"
    if isinstance(value, bool):
        return "on" if value else "off"
    if value == "":
        return "none: PyTorch's defaults" if key == "alloc_conf" else "none"
    if key == "versions":
        return "none: the installed ones, else the current releases"
    if isinstance(value, tuple):
        return ", ".join(value) or "none"
    return str(getattr(value, "value", value))


def _with_workload_options(func: Callable[..., Any]) -> Callable[..., Any]:
    func = from_options(func)
    for flag, (path, help_text) in reversed(list(SWITCHES.items())):
        func = click.option(f"--{flag}/--no-{flag}", default=None, help=f"{help_text} [default: {_default(path)}]")(
            func
        )
    from vramlens.workload.ranges import RANGES

    for flag, (path, help_text) in reversed(list(FLAGS.items())):
        bounds = f" ({RANGES[path].describe()})" if path in RANGES else ""
        func = click.option(
            f"--{flag}", default=None, metavar="VALUE", help=f"{help_text}{bounds} [default: {_default(path)}]"
        )(func)
    return func


def workload_inputs(model: str | None, config: str | None, options: dict[str, Any], *, command: str) -> WorkloadInputs:
    """The base (a ``-c`` workload file or a ``--from`` run config), the flags' overrides and the
    run config's reading, for a command that takes MODEL, -c/--from and workload flags."""
    from vramlens.workload.load import read_workload_file

    source = read_source(options, config)
    base: dict[str, Any] = read_workload_file(config) if config else {}
    if source is not None:
        base = {k: (dict(v) if isinstance(v, dict) else v) for k, v in source.keys.items()}
    overrides = _overrides(options)
    if model is not None:
        overrides["model"] = model
    if "model" not in base and "model" not in overrides:
        where = f"{source.origin} names no model; " if source is not None else ""
        raise InputError(
            f"model: {where}give MODEL (e.g. vramlens {command} llama-3.1-8b) or a workload file with a 'model' key (-c run.yaml)"
        )
    return WorkloadInputs(base=base, overrides=overrides, source=source)


def workload_arguments(
    model: str | None, config: str | None, options: dict[str, Any], *, command: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The workload file's keys and the flags' overrides of a command that takes MODEL/-c and workload flags."""
    inputs = workload_inputs(model, config, options, command=command)
    return inputs.base, inputs.overrides


#: Adds every workload flag (and switch) to a click command.
with_workload_options = _with_workload_options


@click.command("estimate")
@click.argument("model", required=False)
@click.option(
    "-c", "--config", "config", type=click.Path(dir_okay=False), help="Workload file (YAML or JSON); flags override it."
)
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown"]), default="table", show_default=True)
@click.option("--explain", is_flag=True, help="Also list every term with its formula.")
@click.option("--max-batch", "max_batch", is_flag=True, help="Find the largest batch that fits the GPU.")
@click.option(
    "--max-context", "max_context", is_flag=True, help="Inference: find the longest context that fits the GPU."
)
@picture_options
@_with_workload_options
def estimate_command(
    model: str | None,
    config: str | None,
    fmt: str,
    explain: bool,
    max_batch: bool,
    max_context: bool,
    ascii_only: bool,
    plot_path: str | None,
    html_path: str | None,
    **options: Any,
) -> None:
    """Estimate per-GPU memory of training or serving MODEL (a catalog name, config path or cached HF id)."""
    from vramlens.estimator import estimate

    check_pictures(plot_path=plot_path, html_path=html_path)
    inputs = workload_inputs(model, config, options, command="estimate")
    base, overrides = inputs.base, inputs.overrides
    if max_batch and max_context:
        raise InputError("--max-batch and --max-context: ask one at a time (the other value is held fixed)")
    answer = None
    if max_batch or max_context:
        from vramlens.estimator.capacity import search_capacity

        answer = search_capacity(base, "batch" if max_batch else "context", **overrides)
        if answer.report is None:
            raise InputError(
                f"{answer.key}: even 1 does not fit the GPU; try quantized weights, more GPUs (tp) or fewer tokens"
            )
        report = answer.report
    else:
        report = estimate(base, **overrides)
    report = with_source(report, inputs)
    _show(report, fmt, explain, answer, ascii_only=ascii_only, source=inputs.source)
    write_pictures(report, plot_path=plot_path, html_path=html_path)


def _show(report: Any, fmt: str, explain: bool, answer: Any, *, ascii_only: bool = False, source: Any = None) -> None:
    headline = None
    if answer is not None:
        headline = f"largest {answer.key} that fits: {answer.value} (searched up to {answer.limit})"
    if fmt == "json":
        data = report.to_dict()
        if answer is not None:
            data["capacity"] = {"key": answer.key, "value": answer.value, "limit": answer.limit}
        if source is not None:
            data["source"] = source.to_dict()
        click.echo(dumps(data, indent=2))
        return
    if headline:
        echo(headline)
    if fmt == "markdown":
        from vramlens.report.text import markdown_report

        echo(markdown_report(report, explain=explain), nl=False)
    else:
        from vramlens.report.text import print_report

        print_report(report, explain=explain, ascii_only=ascii_only)
