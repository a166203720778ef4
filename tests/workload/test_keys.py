"""Every workload key is declared once (vramlens.workload.keys.KEYS); the loader, the ranges, the
CLI flags and their --help, the web schema and docs/workload.md are generated from it."""

from __future__ import annotations

import dataclasses
import re

import pytest
from click.testing import CliRunner

from conftest import REPO_ROOT
from vramlens.cli.app import cli
from vramlens.cli.contract_doc import key_row
from vramlens.cli.estimate import FLAGS, SWITCHES
from vramlens.web.schema import workload_schema
from vramlens.workload.keys import KEYS, Key, Kind, keys_of
from vramlens.workload.load import LORA_KEYS, PARALLEL_KEYS, TOP_KEYS
from vramlens.workload.options import Mode
from vramlens.workload.ranges import RANGES
from vramlens.workload.spec import LoraConfig, Parallelism, Workload


def _words(text: str) -> str:
    return " ".join(text.split())


def test_the_declaration_names_every_field_of_the_typed_record() -> None:
    fields = [f.name for f in dataclasses.fields(Workload) if f.name not in ("lora", "parallel")]
    assert [key.name for key in keys_of("")] == fields
    assert [key.name for key in keys_of("lora")] == [f.name for f in dataclasses.fields(LoraConfig)]
    assert [key.name for key in keys_of("parallel")] == [f.name for f in dataclasses.fields(Parallelism)]
    assert len({key.path for key in KEYS}) == len(KEYS)


def test_the_loader_ranges_and_flags_are_generated_from_it() -> None:
    assert (list(TOP_KEYS), list(LORA_KEYS), list(PARALLEL_KEYS)) == tuple(
        [key.name for key in keys_of(block)] for block in ("", "lora", "parallel")
    )
    assert {key.path: key.range for key in KEYS if key.range is not None} == RANGES
    flagged = {key.flag_name: key.path for key in KEYS if key.flag_name}
    assert {flag: path for flag, (path, _) in {**FLAGS, **SWITCHES}.items()} == flagged
    assert "model" not in {path for path, _ in FLAGS.values()}


@pytest.fixture(scope="module")
def estimate_help() -> str:
    result = CliRunner().invoke(cli, ["estimate", "--help"], terminal_width=1000)
    assert result.exit_code == 0, result.output
    return _words(result.output)


@pytest.mark.parametrize("key", [key for key in KEYS if key.flag_name], ids=lambda key: key.path)
def test_help_and_docs_show_the_declared_line(key: Key, estimate_help: str) -> None:
    """The CLI's --help and docs/workload.md carry the same declared description of each key."""
    page = (REPO_ROOT / "docs" / "workload.md").read_text(encoding="utf-8")
    assert key_row(key) in page.splitlines()
    assert _words(key.help).replace("|", "/") in key_row(key)
    option = f"--{key.flag_name} / --no-{key.flag_name}" if key.kind is Kind.SWITCH else f"--{key.flag_name} VALUE"
    match = re.search(re.escape(option) + r" (.*?)\[default:", estimate_help)
    assert match is not None, option
    assert match.group(1).startswith(_words(key.help)), (match.group(1), key.help)
    if key.values is not None:  # the values come from the enum, in --help and in the docs
        assert " | ".join(str(member.value) for member in key.values) in match.group(1)


def test_the_web_schema_describes_each_key_with_the_declared_line() -> None:
    schema = workload_schema()
    for key in KEYS:
        block = schema if not key.block else schema["properties"][key.block]
        assert block["properties"][key.name]["description"] == key.help, key.path


def test_a_declaration_that_contradicts_itself_is_refused() -> None:
    with pytest.raises(ValueError, match="enum"):
        Key(path="mode", kind=Kind.TEXT, values=Mode, help="x")
    with pytest.raises(ValueError, match="range"):
        Key(path="batch", kind=Kind.INT, help="x")
