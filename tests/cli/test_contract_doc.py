"""docs/workload.md is generated from the code: it is current, and it names every workload key."""

from __future__ import annotations

from conftest import REPO_ROOT
from vramlens.cli.contract_doc import contract_markdown
from vramlens.workload.load import LORA_KEYS, PARALLEL_KEYS, TOP_KEYS


def test_the_contract_page_is_current() -> None:
    page = (REPO_ROOT / "docs" / "workload.md").read_text(encoding="utf-8")
    assert page == contract_markdown(), "rerun: python -m vramlens.cli.contract_doc > docs/workload.md"


def test_every_key_is_on_the_page_with_its_default() -> None:
    page = contract_markdown()
    for key in TOP_KEYS:
        assert f"| `{key}` |" in page, key
    for prefix, table in (("lora", LORA_KEYS), ("parallel", PARALLEL_KEYS)):
        for key in table:
            assert f"| `{prefix}.{key}` |" in page, key
    assert "| `batch` | `4` |" in page and "| `parallel.offload` | `none` |" in page
