"""The top-level ``vramlens`` command group and its error handling.

Every :class:`~vramlens.errors.VramlensError` ends the program with its one-line
message on stderr and exit status 2; usage errors are click's (also status 2).
No traceback is shown for anything a user can cause.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from vramlens._notes import notes_on_stderr
from vramlens._version import __version__
from vramlens.cli._output import echo
from vramlens.errors import VramlensError

__all__ = ["cli", "main"]


#: Command name -> (module, attribute): each command's module is imported only when that command
#: runs (or when ``--help`` lists them all), so ``vramlens estimate`` never loads the simulator,
#: the web server or the planner's renderers.
COMMANDS: dict[str, tuple[str, str]] = {
    "activations": ("vramlens.cli.activations", "activations_command"),
    "compare": ("vramlens.cli.simulate", "compare_command"),
    "diff": ("vramlens.cli.view", "diff_command"),
    "estimate": ("vramlens.cli.estimate", "estimate_command"),
    "experiment": ("vramlens.cli.experiment", "experiment_command"),
    "gpus": ("vramlens.cli.gpus", "gpus_command"),
    "models": ("vramlens.cli.models", "models"),
    "plan": ("vramlens.cli.plan", "plan_command"),
    "rlhf": ("vramlens.cli.rlhf", "rlhf_command"),
    "serve": ("vramlens.cli.serve", "serve_command"),
    "simulate": ("vramlens.cli.simulate", "simulate_command"),
    "sweep": ("vramlens.cli.sweep", "sweep_command"),
    "view": ("vramlens.cli.view", "view_command"),
}


class _LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use (click's documented pattern)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module_name, attribute = COMMANDS[cmd_name]
        command = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(command, click.Command):  # pragma: no cover - a wrong table entry
            raise TypeError(f"{module_name}.{attribute} is not a click command")
        return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="vramlens")
def cli() -> None:
    """How much GPU memory training and inference of a model take, and why."""


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit status (the console-script entry point)."""
    notes_on_stderr()
    try:
        cli.main(args=argv, prog_name="vramlens", standalone_mode=False)
    except VramlensError as exc:
        echo(f"error: {exc}", err=True)
        return 2
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx is not None else "vramlens"
        echo(f"error: {exc.format_message()} (see '{command} --help')", err=True)
        return exc.exit_code
    except click.ClickException as exc:
        echo(f"error: {exc.format_message()}", err=True)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except BrokenPipeError:  # e.g. `vramlens models list | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0
