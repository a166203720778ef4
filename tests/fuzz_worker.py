"""The worker of ``tests/test_fuzz_readers.py``: reads every input of one kind with the reader a
user's command would use, and reports each on stdout.

``python fuzz_worker.py KIND FOLDER`` prints ``START name`` before each input (flushed, so the
parent can time it and kill a hang) and ``END name ok|error|bad detail`` after it: ``ok`` the
input was read, ``error`` a one-line :class:`~vramlens.errors.VramlensError` (what bad input
must give), ``bad`` anything else (another exception, a multi-line or over-long message, a
control character or an unescaped ``<script`` from the input in the output). The parent runs
it under an address-space limit; a :class:`MemoryError` is reported as ``bad``.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

MARKER = "<script>fuzz"  # planted in inputs: must never come out unescaped in HTML
PAGE = "\x00PAGE\x00"  # separates terminal text from an HTML page in what a reader returns


def _view(path: Path) -> str:
    from vramlens.forensics.sources import open_source
    from vramlens.forensics.view import build_view
    from vramlens.report.html import render_html
    from vramlens.report.view_text import view_renderable

    view = build_view(open_source(path))
    details = view.to_dict()
    json.dumps(details, allow_nan=False)
    return _rendered(view_renderable(view)) + PAGE + render_html(view.report, details=details)


def _rendered(renderable: Any) -> str:
    from vramlens.report.terminal import terminal_console

    console = terminal_console(width=120)
    with console.capture() as capture:
        console.print(renderable)
    return capture.get()


def _workload(path: Path) -> str:
    from vramlens.estimator import estimate
    from vramlens.report.html import render_html
    from vramlens.report.text import report_renderable
    from vramlens.workload import load_workload, read_workload_file

    workload = load_workload(read_workload_file(path))
    report = estimate(workload)
    json.dumps(report.to_dict(), allow_nan=False)
    return _rendered(report_renderable(report)) + PAGE + render_html(report)


def _rlhf(path: Path) -> str:
    from vramlens.rlhf import load_rlhf

    return repr(load_rlhf(path))


def _matrix(path: Path) -> str:
    from vramlens.experiments.matrix import load_matrix

    matrix = load_matrix(path)
    return " ".join(run.key + run.name for run in matrix.runs)


def _config(path: Path) -> str:
    from vramlens.estimator import estimate
    from vramlens.model.resolve import load_model
    from vramlens.report.html import render_html
    from vramlens.report.model_view import breakdown_table, describe_model

    spec = load_model(path)
    report = estimate({"model": spec, "seq": 64, "batch": 1})
    return _rendered(describe_model(spec)) + _rendered(breakdown_table(spec)) + PAGE + render_html(report)


def _safetensors(path: Path) -> str:
    from vramlens.model.safetensors import read_checkpoint

    return json.dumps(read_checkpoint(path).to_dict(), allow_nan=False)


def _store(path: Path) -> str:
    from vramlens._untrusted import terminal_text
    from vramlens.experiments.render.table import experiment_markdown, experiment_text
    from vramlens.experiments.store import ResultStore

    rows = ResultStore(path).rows()
    return terminal_text(
        experiment_text(rows, device="cpu") + experiment_markdown(rows, device="cpu")
    )  # as the CLI echoes


_CLIENT: list[Any] = []


def _web(path: Path) -> str:
    """One request: the file's first line is ``METHOD /path``, the rest its body."""
    if not _CLIENT:
        from starlette.testclient import TestClient

        from vramlens.web import create_app

        _CLIENT.append(TestClient(create_app(), base_url="http://127.0.0.1").__enter__())
    head, _, body = path.read_bytes().partition(b"\n")
    method, target = head.decode().split(" ", 1)
    answer = _CLIENT[0].request(method, target, content=body)
    if answer.status_code >= 500:
        raise AssertionError(f"HTTP {answer.status_code}: {answer.text[:300]}")
    if answer.headers.get("content-type", "").startswith("text/html"):
        return PAGE + answer.text
    if answer.headers.get("content-type", "").startswith("application/json"):
        document = json.loads(answer.text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
        if answer.status_code >= 400 and ("\n" in document["error"] or len(document["error"]) > 1100):
            raise AssertionError(f"not a one-line error: {document['error'][:300]!r}")
        return ""  # JSON escapes everything
    return answer.text


def _run_config(path: Path) -> str:
    """``vramlens estimate --from FILE``: the reading, then the estimate with its notes."""
    from vramlens.estimator import estimate
    from vramlens.report.text import report_renderable
    from vramlens.workload import load_workload
    from vramlens.workload.sources import read_run_config

    source = read_run_config(path)
    keys = dict(source.keys)
    keys.setdefault("model", "llama-3.2-1b")
    report = estimate(load_workload(keys))
    return "\n".join(source.assumptions()) + _rendered(report_renderable(report))


READERS: dict[str, Callable[[Path], str]] = {
    "snapshot": _view,
    "workload": _workload,
    "rlhf": _rlhf,
    "matrix": _matrix,
    "config": _config,
    "safetensors": _safetensors,
    "store": _store,
    "web": _web,
    "run-config": _run_config,
}


def _check_output(text: str) -> str | None:
    """What is wrong with what a reader produced (None when nothing): an HTML page (it starts
    with ``<!``) must not hold the input's ``<script>``; terminal text no control character."""
    for part in text.split("\x00PAGE\x00"):
        if part.lstrip().startswith("<!"):
            if MARKER in part:
                return "the input's <script> reached an HTML page unescaped"
            continue
        bad = [c for c in part if (ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0]
        if bad:
            return f"control character {bad[0]!r} in the terminal output"
    return None


def main() -> None:
    from vramlens.errors import VramlensError

    kind, folder = sys.argv[1], Path(sys.argv[2])
    read = READERS[kind]
    for path in sorted(folder.iterdir()):
        print(f"START {path.name}", flush=True)
        try:
            problem = _check_output(read(path))
            status, detail = ("bad", problem) if problem else ("ok", "")
        except VramlensError as error:
            message = str(error)
            one_line = "\n" not in message and "\r" not in message and len(message) <= 1100
            status, detail = ("error", "") if one_line else ("bad", f"not one line: {message[:300]!r}")
        except MemoryError:
            status, detail = "bad", "MemoryError (over the address-space limit)"
        except BaseException as error:  # anything else is a bug
            last = traceback.extract_tb(error.__traceback__)[-1]
            status, detail = "bad", f"{type(error).__name__}: {str(error)[:200]!r} at {last.filename}:{last.lineno}"
        print(f"END {path.name} {status} {detail}".replace("\n", " "), flush=True)


if __name__ == "__main__":
    main()
