"""``vramlens serve``: lazy imports with an install hint, loopback by default, the schema kept in
step with the workload loader."""

from __future__ import annotations

import subprocess
import sys

import pytest

from vramlens.cli.app import main
from vramlens.cli.serve import _hosts
from vramlens.workload.load import LORA_KEYS, PARALLEL_KEYS, TOP_KEYS


def test_importing_the_cli_and_the_web_package_imports_no_web_framework() -> None:
    code = (
        "import sys, vramlens, vramlens.cli.app, vramlens.web; "
        "assert not {'fastapi', 'uvicorn', 'starlette', 'torch'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("module", ["uvicorn", "fastapi"])
def test_serve_without_the_web_extra_names_it(
    module: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    assert main(["serve"]) == 2
    assert capsys.readouterr().err == (
        f"error: vramlens serve needs the optional package '{module}'; install it with: pip install 'vramlens[web]'\n"
    )


def test_serve_refuses_a_bad_port(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--port", "70000"]) == 2
    assert capsys.readouterr().err == "error: --port: must be from 1 to 65535, got 70000\n"


def test_serve_answers_loopback_names_and_its_own_host() -> None:
    assert _hosts("127.0.0.1") == ("127.0.0.1", "localhost", "[::1]")
    assert _hosts("::1") == ("127.0.0.1", "localhost", "[::1]")
    assert _hosts("192.168.1.5") == ("127.0.0.1", "localhost", "[::1]", "192.168.1.5")
    assert _hosts("::1", ("My.Box", "fe80::1")) == ("127.0.0.1", "localhost", "[::1]", "my.box", "[fe80::1]")


def test_a_wildcard_bind_still_answers_only_known_names() -> None:
    import socket

    hosts = _hosts("0.0.0.0", ("vramlens.example",))
    assert hosts[:3] == ("127.0.0.1", "localhost", "[::1]")
    assert socket.gethostname().lower() in hosts and "vramlens.example" in hosts
    assert "evil.com" not in hosts


def test_the_schema_documents_every_workload_key() -> None:
    from vramlens.web.schema import WORKLOAD_SCHEMA

    properties = WORKLOAD_SCHEMA["properties"]
    assert set(properties) == {*TOP_KEYS, "lora", "parallel"}
    assert set(properties["lora"]["properties"]) == set(LORA_KEYS)
    assert set(properties["parallel"]["properties"]) == set(PARALLEL_KEYS)
