"""``vramlens models list`` and ``vramlens models show NAME|PATH``."""

from __future__ import annotations

import click

from vramlens.cli._output import dumps
from vramlens.model.catalog import CatalogEntry, catalog_entries, find_entry
from vramlens.model.resolve import load_model
from vramlens.model.serialize import spec_summary, spec_to_dict

__all__ = ["models"]

_FORMAT = click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="Output format.",
)


def _published(entry: CatalogEntry | None) -> dict[str, object]:
    if entry is None:
        return {}
    return {
        "published_parameters": entry.published_parameters,
        "published_parameters_source": entry.published_parameters_source,
        "config_source": entry.config_source,
    }


@click.group()
def models() -> None:
    """The bundled model catalog and model descriptions."""


@models.command("list")
@_FORMAT
def list_models(fmt: str) -> None:
    """List the bundled checkpoints with their shapes and parameter counts."""
    entries = catalog_entries()
    if fmt == "json":
        rows = [{**spec_summary(e.spec()), "aliases": list(e.aliases), "family": e.family} for e in entries]
        click.echo(dumps(rows, indent=2))
        return
    from vramlens.report.model_view import print_models_table

    print_models_table([(entry, entry.spec()) for entry in entries])


@models.command("show")
@click.argument("model")
@_FORMAT
def show_model(model: str, fmt: str) -> None:
    """Describe MODEL: a catalog name, a config.json or model directory, or a cached HF id."""
    spec = load_model(model)
    entry = find_entry(model)
    if fmt == "json":
        click.echo(dumps({**spec_to_dict(spec), **_published(entry)}, indent=2))
        return
    from vramlens.report.model_view import print_model

    print_model(spec, entry)
