"""The web server never reads or traces a model's code itself (issue 21 applied to issue 19's
generic reader): building a model on the meta device took 20 s on the event loop and brought
torch into the server (68 -> 368 MiB), holding every estimate meanwhile. A config whose
``model_type`` has no native family is read, and its layer recipe traced, in a process of its
own that fills the recipe cache; the server then answers from the cache, in pure Python."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT, requires_hf

pytestmark = [
    requires_hf,
    pytest.mark.hf,
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform == "win32", reason="forkserver"),
]

_SERVER = r"""
import json, sys, threading, time
from starlette.testclient import TestClient
from vramlens.web import create_app

config = sys.stdin.read()
answers, slowest = {}, [0.0]
with TestClient(create_app(), base_url="http://127.0.0.1") as client:
    def upload():
        answers["config"] = client.post("/api/config?name=config.json", content=config)
    thread = threading.Thread(target=upload)
    thread.start()
    while thread.is_alive():  # estimates keep their speed while the model's code is read
        start = time.monotonic()
        assert client.post("/api/estimate?report=false", json={"model": "llama-3.2-1b"}).status_code == 200
        slowest[0] = max(slowest[0], time.monotonic() - start)
        time.sleep(0.05)
    thread.join()
    token = answers["config"].json().get("model")
    estimate = client.post("/api/estimate?report=false", json={"model": token, "seq": 256})
    again = client.post("/api/estimate?report=false", json={"model": token, "seq": 256, "batch": 2})
print(json.dumps({
    "config": answers["config"].status_code, "config_text": answers["config"].text[:300],
    "estimate": estimate.status_code, "estimate_text": estimate.text[:300], "again": again.status_code,
    "torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules, "slowest": slowest[0],
}))
"""


def test_a_model_read_from_its_code_is_read_outside_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO_ROOT / "tests" / "model"))
    from generic_configs import small_config

    config = {**small_config("qwen3_5_moe_text"), "layer_types": None}
    done = subprocess.run(
        [sys.executable, "-c", _SERVER],
        input=json.dumps(config),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO_ROOT,
        env={**os.environ, "VRAMLENS_CACHE_DIR": str(tmp_path)},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["config"] == 200 and "qwen3_5_moe_text" in found["config_text"], found
    assert found["estimate"] == 200 and found["again"] == 200, found
    assert not found["torch"] and not found["transformers"], found  # the server never imported them
    assert found["slowest"] < 2.0, found  # 20 s when the code was read on the event loop
    assert list((tmp_path / "recipes").glob("qwen3_5_moe_text-*.json")), "the child filled the recipe cache"
