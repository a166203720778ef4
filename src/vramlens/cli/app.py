"""The top-level ``vramlens`` command group and its error handling.

Every :class:`~vramlens.errors.VramlensError` ends the program with its one-line
message on stderr and exit status 2; usage errors are click's (also status 2).
No traceback is shown for anything a user can cause.
"""

from __future__ import annotations

import logging
import os
import sys

import click

from vramlens._untrusted import abridge, terminal_text
from vramlens._version import __version__
from vramlens.cli._output import echo
from vramlens.cli.activations import activations_command
from vramlens.cli.estimate import estimate_command
from vramlens.cli.experiment import experiment_command
from vramlens.cli.models import models
from vramlens.cli.plan import plan_command
from vramlens.cli.rlhf import rlhf_command
from vramlens.cli.serve import serve_command
from vramlens.cli.simulate import compare_command, simulate_command
from vramlens.cli.sweep import sweep_command
from vramlens.cli.view import diff_command, view_command
from vramlens.errors import MAX_MESSAGE_CHARS, VramlensError

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="vramlens")
def cli() -> None:
    """How much GPU memory training and inference of a model take, and why."""


cli.add_command(activations_command)
cli.add_command(estimate_command)
cli.add_command(experiment_command)
cli.add_command(models)
cli.add_command(plan_command)
cli.add_command(serve_command)
cli.add_command(rlhf_command)
cli.add_command(simulate_command)
cli.add_command(compare_command)
cli.add_command(sweep_command)
cli.add_command(view_command)
cli.add_command(diff_command)


class _StderrNotes(logging.Handler):
    """Writes a record as ``note: ...`` to whatever ``sys.stderr`` is when it is emitted; the
    note may quote a file's path or a config's strings, so it is abridged and its control
    characters escaped, as every line the CLI prints."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(f"note: {terminal_text(abridge(record.getMessage(), MAX_MESSAGE_CHARS))}\n")
        except Exception:
            self.handleError(record)


def _notes_on_stderr() -> None:
    """The library's progress notes (``logging`` INFO of the ``vramlens`` logger: a model read
    from its code, a layer recipe traced) go to stderr, so stdout stays the answer."""
    logger = logging.getLogger("vramlens")
    if not any(isinstance(handler, _StderrNotes) for handler in logger.handlers):
        logger.addHandler(_StderrNotes())
        logger.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit status (the console-script entry point)."""
    _notes_on_stderr()
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
