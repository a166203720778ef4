"""Helpers of the web tests: the app under starlette's TestClient, the CLI run in-process.

(Not a conftest.py: a second module named ``conftest`` would shadow ``tests/conftest.py`` for
``from conftest import ...`` in the rest of the suite.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from vramlens.cli.app import main


def web_client() -> Iterator[Any]:
    """The app as ``vramlens serve`` builds it (loopback Host headers only), started (lifespan run);
    skips without the [web] extra or httpx2 (starlette's TestClient runs on it)."""
    pytest.importorskip("fastapi", reason="needs the [web] extra (fastapi, uvicorn)")
    pytest.importorskip("httpx2", reason="starlette's TestClient needs httpx2 (the [dev] extra)")
    from starlette.testclient import TestClient

    from vramlens.web import create_app

    with TestClient(create_app(), base_url="http://127.0.0.1") as test_client:
        yield test_client


def cli_runner(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """``run("estimate", "llama-3.1-8b", ...)`` -> (exit status, stdout, stderr) of the real CLI."""

    def run(*args: Any) -> tuple[int, str, str]:
        capsys.readouterr()
        status = main([str(arg) for arg in args])
        out, err = capsys.readouterr()
        return status, out, err

    return run
