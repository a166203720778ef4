"""The page of ``vramlens serve`` in a real browser (Playwright + Debian's Chromium).

The server runs in a thread on a free loopback port. Every request the page makes is watched:
one to anywhere but that server is aborted and fails the test, as does any console error or
page error. The figures the page shows are compared with what ``vramlens estimate`` prints
for the workload the page sent (shown in its "workload sent" box): the same strings.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_helpers import NEEDS_CHROMIUM, chromium

from vramlens.cli.app import main
from vramlens.model.catalog import find_entry
from vramlens.result.timeline import CATEGORY_ORDER, TimelineBuilder
from vramlens.snapshot import save_snapshot

pytestmark = [
    *NEEDS_CHROMIUM,
    pytest.mark.skipif(
        importlib.util.find_spec("uvicorn") is None or importlib.util.find_spec("fastapi") is None,
        reason="needs the [web] extra (fastapi, uvicorn)",
    ),
]


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    import uvicorn

    from vramlens.web import create_app

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from chromium()


@dataclasses.dataclass
class Watched:
    page: Any
    requests: list[str]
    outside: list[str]
    errors: list[str]


@pytest.fixture
def watched(browser: Any, base_url: str) -> Iterator[Watched]:
    context = browser.new_context(accept_downloads=True, viewport={"width": 1200, "height": 1000})
    requests: list[str] = []
    outside: list[str] = []
    errors: list[str] = []

    def route(route: Any) -> None:
        url = route.request.url
        requests.append(url)
        if url == base_url or url.startswith(base_url + "/"):
            route.continue_()
        else:
            outside.append(url)
            route.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield Watched(page=page, requests=requests, outside=outside, errors=errors)
    context.close()


def _settle(page: Any, expected: dict[str, Any] | None = None) -> dict[str, Any]:
    """Wait until the page shows the answer to a request with ``expected`` keys; returns the
    workload it sent (its "workload sent" box)."""
    deadline = time.monotonic() + 20
    while True:
        page.wait_for_function(
            "() => document.body.dataset.state === 'ready' && document.getElementById('workload').textContent"
        )
        sent: dict[str, Any] = json.loads(page.text_content("#workload"))
        if all(sent.get(key) == value for key, value in (expected or {}).items()):
            return sent
        assert time.monotonic() < deadline, (sent, expected)
        time.sleep(0.05)


def _cli_table(workload: dict[str, Any], tmp_path: Path, capsys: Any) -> list[str]:
    path = tmp_path / "page-workload.json"
    path.write_text(json.dumps(workload))
    capsys.readouterr()
    assert main(["estimate", "-c", str(path)]) == 0
    return capsys.readouterr().out.splitlines()


def _assert_page_shows(page: Any, table: list[str]) -> None:
    """The page's figures are the CLI table's strings (title, fit, levels, breakdown, phases, assumptions)."""
    text = "\n".join(table)
    assert page.inner_text("#title") == table[0]
    assert page.inner_text("#fit") == table[1]
    assert page.inner_text("#settings") == f"{table[2]} {table[3].strip()}"
    for level, peak, what in page.eval_on_selector_all(
        "#levels tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))"
    ):
        assert re.search(rf"^\s*{level}\s+{re.escape(peak)}\s+{re.escape(what)}\s*$", text, re.M), (level, peak)
    rows = page.eval_on_selector_all(
        "#breakdown tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))"
    )
    assert len(rows) >= 4
    for name, memory, share, _ in rows:
        assert re.search(rf"^\s*{re.escape(name)}\s+{re.escape(memory)}\s+{re.escape(share)}\s", text, re.M), name
    for name, amount in page.eval_on_selector_all(
        "#phases .phase", "rows => rows.map(r => [r.children[0].textContent, r.children[1].textContent])"
    ):
        assert re.search(rf"^\s*{re.escape(name)}\s+{re.escape(amount)}\s", text, re.M), name
    for note in page.eval_on_selector_all("#assumptions li", "items => items.map(i => i.textContent)"):
        assert f"  - {note}" in table


def test_numbers_follow_the_inputs_and_are_what_the_cli_prints(
    watched: Watched, base_url: str, tmp_path: Path, capsys: Any
) -> None:
    page = watched.page
    page.goto(base_url + "/")
    first = _settle(page)
    assert first["model"] == "llama-3.1-8b"
    _assert_page_shows(page, _cli_table(first, tmp_path, capsys))
    before = page.inner_text("#title")
    page.select_option("#model", "qwen2.5-7b")
    page.fill("#batch", "8")
    changed = _settle(page, {"model": "qwen2.5-7b", "batch": 8})
    assert page.inner_text("#title") != before
    _assert_page_shows(page, _cli_table(changed, tmp_path, capsys))
    page.wait_for_function("() => document.querySelectorAll('#plan tbody tr').length > 0", timeout=20000)
    page.select_option("#mode", "infer")
    page.select_option("#engine", "vllm")
    serving = _settle(page, {"mode": "infer", "engine": "vllm"})
    _assert_page_shows(page, _cli_table(serving, tmp_path, capsys))
    assert watched.outside == [] and watched.errors == []
    assert all(url.startswith(base_url + "/") for url in watched.requests)


def test_a_gpu_size_replaces_the_chosen_gpu_as_the_cli_reads_it(
    watched: Watched, base_url: str, tmp_path: Path, capsys: Any
) -> None:
    """ "24GiB" in the size box is sent as ``gpu: 24GiB`` (what ``--gpu 24GiB`` means to the CLI),
    and the page's fit line and figures are then the CLI's for that size."""
    page = watched.page
    page.goto(base_url + "/")
    _settle(page)
    page.fill("#gpu-size", "24GiB")
    sized = _settle(page, {"gpu": "24GiB"})
    table = _cli_table(sized, tmp_path, capsys)
    assert "24" in table[1]
    _assert_page_shows(page, table)
    assert watched.outside == [] and watched.errors == []


def test_download_gives_the_cli_html_report(watched: Watched, base_url: str, tmp_path: Path, capsys: Any) -> None:
    page = watched.page
    page.goto(base_url + "/")
    sent = _settle(page)
    with page.expect_download() as info:
        page.click("#download")
    saved = tmp_path / "page.html"
    info.value.save_as(saved)
    (tmp_path / "run.json").write_text(json.dumps(sent))
    assert main(["estimate", "-c", str(tmp_path / "run.json"), "--html", str(tmp_path / "cli.html")]) == 0
    assert saved.read_bytes() == (tmp_path / "cli.html").read_bytes()
    assert watched.outside == [] and watched.errors == []


def test_an_uploaded_config_is_estimated_like_the_cli_estimates_the_file(
    watched: Watched, base_url: str, tmp_path: Path, capsys: Any
) -> None:
    entry = find_entry("qwen2.5-0.5b")
    assert entry is not None
    folder = tmp_path / "qwen2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(entry.config))
    page = watched.page
    page.goto(base_url + "/")
    _settle(page)
    page.set_input_files("#config-file", str(folder / "config.json"))
    page.wait_for_function("() => document.getElementById('model').value.startsWith('upload:')", timeout=20000)
    sent = _settle(page, {"model": page.eval_on_selector("#model", "node => node.value")})
    assert "qwen2 (qwen2)" in page.inner_text("#upload-note")
    cli_workload = {**sent, "model": str(folder / "config.json")}
    _assert_page_shows(page, _cli_table(cli_workload, tmp_path, capsys))
    assert watched.outside == [] and watched.errors == []


def test_a_bad_value_shows_the_cli_message(watched: Watched, base_url: str, capsys: Any) -> None:
    page = watched.page
    page.goto(base_url + "/")
    _settle(page)
    page.fill("#batch", "0")
    page.wait_for_function("() => document.body.dataset.state === 'error'", timeout=20000)
    capsys.readouterr()
    assert main(["estimate", "llama-3.1-8b", "--batch", "0"]) == 2
    assert f"error: {page.inner_text('#error')}\n" == capsys.readouterr().err
    # the browser reports the refused requests themselves (400) in its console; nothing else
    assert all("status of 400" in error for error in watched.errors) and watched.outside == []


def test_the_snapshot_page_views_a_dropped_file(watched: Watched, base_url: str, tmp_path: Path) -> None:
    builder = TimelineBuilder(time_unit="ns")
    forward = builder.code("phase", "forward")
    for index, nbytes in enumerate((4 << 20, 2 << 20, -(2 << 20))):
        builder.append(index * 1000, nbytes, CATEGORY_ORDER.index(CATEGORY_ORDER[0]), 1 + (index > 0), forward, -1, -1)
    path = save_snapshot(builder.build(), tmp_path / "run.pickle")
    page = watched.page
    page.goto(base_url + "/snapshot")
    page.set_input_files("#snapshot-file", str(path))
    page.wait_for_function("() => document.body.dataset.state === 'ready'", timeout=20000)
    assert page.inner_text("#levels tbody tr:first-child td:nth-child(2)") == "6.00 MiB"
    assert page.inner_text("#source").startswith("run.pickle: pytorch-snapshot")
    assert watched.outside == [] and watched.errors == []


def test_the_page_starts_on_a_workload_that_fits(watched: Watched, base_url: str) -> None:
    page = watched.page
    page.goto(base_url + "/")
    _settle(page)
    assert page.eval_on_selector("#fit", "node => node.className") == "fit ok", page.inner_text("#fit")
    assert watched.outside == [] and watched.errors == []


def test_an_invalid_input_clears_the_stale_result(watched: Watched, base_url: str) -> None:
    page = watched.page
    page.goto(base_url + "/")
    _settle(page)
    assert page.inner_text("#title") and page.eval_on_selector_all("#levels tbody tr", "rows => rows.length") == 3
    page.fill("#batch", "0")
    page.wait_for_function("() => document.body.dataset.state === 'error'", timeout=20000)
    assert page.inner_text("#title") == "" and page.inner_text("#fit") == ""
    assert page.eval_on_selector_all("#levels tbody tr", "rows => rows.length") == 0
    assert page.eval_on_selector_all("#breakdown tbody tr", "rows => rows.length") == 0
    assert page.eval_on_selector_all("#assumptions li", "items => items.length") == 0


def test_the_form_works_at_420_px(browser: Any, base_url: str) -> None:
    context = browser.new_context(viewport={"width": 420, "height": 900})
    try:
        page = context.new_page()
        page.goto(base_url + "/")
        _settle(page)
        width = page.evaluate("() => document.documentElement.scrollWidth")
        assert width <= 420, f"the page scrolls sideways: {width} px"
        for selector in ("#model", "#batch", "#gpu", "#mode"):  # every control inside the window
            box = page.eval_on_selector(
                selector, "n => { const r = n.getBoundingClientRect(); return [r.left, r.right]; }"
            )
            assert box[0] >= 0 and box[1] <= 420, (selector, box)
        page.fill("#batch", "2")
        sent = _settle(page, {"batch": 2})
        assert sent["batch"] == 2
    finally:
        context.close()


def test_a_run_config_upload_fills_the_form_and_is_read_like_from(
    watched: Watched, base_url: str, tmp_path: Path, capsys: Any
) -> None:
    examples = Path(__file__).resolve().parents[2] / "examples"
    page = watched.page
    page.goto(base_url + "/")
    _settle(page)
    page.set_input_files("#run-config", str(examples / "torchtune-lora.yaml"))
    sent = _settle(page, {"framework": "torchtune"})
    assert sent["model"] == "llama-3.1-8b" and sent["lora"]["rank"] == 8 and sent["loss"] == "chunked"
    notes = page.eval_on_selector_all("#source-notes li", "items => items.map(i => i.textContent)")
    assert notes[0] == "read torchtune-lora.yaml as torchtune"
    _assert_page_shows(page, _cli_table(sent, tmp_path, capsys))
    assert watched.outside == [] and watched.errors == []
