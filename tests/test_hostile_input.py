"""Issue 21: every defect hostile input found, one test each (numbered as in the issue).

Each test drives what a user runs (the CLI in a subprocess under 512 MiB of address space and a
time limit, or the library) with the input that broke it, and checks the answer: a one-line
error naming the field, in time and within memory, the user's file untouched. On the code
before the fix each of these tests failed (a traceback, a hang, a limit exceeded, a wiped file).
Web-server hardening (9) is in ``tests/web/test_web_hardening.py``; the fuzz of every reader in
``tests/test_fuzz_readers.py``.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import tiny_llama_config
from hostile import (
    assert_one_line_error,
    deep_list_json,
    gzip_bomb,
    laughs_pickle,
    laughs_yaml,
    limited_env,
    npz_bomb,
    run_limited,
    tuple_hash_bomb,
)
from vramlens.errors import InputError, VramlensError

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="resource limits, FIFOs and /dev are POSIX")


def _config(tmp_path: Path, name: str = "config.json", **overrides: Any) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(tiny_llama_config(**overrides)))
    return path


# ---- 1. decompression bombs -------------------------------------------------------------------


@pytest.mark.slow
def test_1_view_stops_a_gzip_bomb_at_its_inflation_limit(tmp_path: Path) -> None:
    bomb = tmp_path / "mem.raw.json.gz"
    bomb.write_bytes(gzip_bomb(2**30))  # 1 MiB that inflates to 1 GiB
    outcome = run_limited("view", str(bomb))
    assert_one_line_error(outcome, "inflates to more than 31.9 MiB", "decompression bomb")


@pytest.mark.slow
def test_1_view_stops_a_zip_bomb_timeline_before_inflating_it(tmp_path: Path) -> None:
    bomb = tmp_path / "run.npz"
    bomb.write_bytes(npz_bomb(2**29))  # 0.5 MiB whose time column inflates to 512 MiB
    outcome = run_limited("view", str(bomb), memory=384 * 2**20)
    assert_one_line_error(outcome, "decompression bomb")


@pytest.mark.slow
def test_1_a_gzip_bomb_uploaded_to_the_server_is_a_400(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx2")
    (tmp_path / "bomb.gz").write_bytes(gzip_bomb(2**30))
    code = (
        "import sys; from starlette.testclient import TestClient; from vramlens.web import create_app\n"
        "with TestClient(create_app(), base_url='http://127.0.0.1') as client:\n"
        f"    answer = client.post('/api/snapshot', content=open({str(tmp_path / 'bomb.gz')!r}, 'rb').read())\n"
        "    print(answer.status_code, answer.json()['error'])\n"
    )
    outcome = run_limited(code=code, seconds=20)
    assert outcome.status == 0, outcome.stderr[-500:]
    assert outcome.stdout.startswith("400 ") and "inflates to more than" in outcome.stdout


# ---- 2. shared-reference expansion ("billion laughs") -----------------------------------------


def test_2_a_billion_laughs_snapshot_pickle_is_refused_at_once() -> None:
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); from hostile import laughs_pickle, tuple_hash_bomb\n"
        "from vramlens.snapshot import load_snapshot; from vramlens.errors import InputError\n"
        "for data in [*(laughs_pickle(f) for f in ('frames', 'user_metadata', 'category', 'addr')), tuple_hash_bomb()]:\n"
        "    try:\n"
        "        load_snapshot(data).timeline()\n"
        "    except InputError as error:\n"
        "        print(str(error)[:200])\n"
        "    else:\n"
        "        print('read')\n"
    )
    outcome = run_limited(code=code, seconds=10)
    assert outcome.status == 0, outcome.stderr[-800:]
    lines = outcome.stdout.strip().splitlines()
    assert len(lines) == 5 and all("refused" in line for line in lines), lines
    assert len(laughs_pickle()) < 3000 and len(tuple_hash_bomb()) < 300


@pytest.mark.parametrize(
    ("command", "key"),
    [
        (["estimate", "-c", "{file}"], "model"),
        (["estimate", "--from", "{file}"], "base_model"),
        (["rlhf", "-c", "{file}"], "actor"),
        (["experiment", "-c", "{file}", "--store", "{dir}/s.jsonl", "--device", "cpu"], "model"),
    ],
)
def test_2_a_billion_laughs_yaml_is_refused_at_once(tmp_path: Path, command: list[str], key: str) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(laughs_yaml(key) + ("runs: [control]\n" if command[0] == "experiment" else ""))
    assert path.stat().st_size < 700
    args = [part.format(file=path, dir=tmp_path) for part in command]
    assert_one_line_error(run_limited(*args), "billion laughs")


# ---- 3. the planner -----------------------------------------------------------------------------


@pytest.mark.slow
def test_3_a_plan_over_a_large_global_batch_ends() -> None:
    # 2**20 x 1024 samples per step: the planner walked every integer up to 2**30 to find divisors
    outcome = run_limited(
        "plan", "llama-3.2-1b", "--gpu", "h100-80gb", "--batch", str(2**20), "--grad-accum", "1024", "--seq", "128",
        "--top", "1", seconds=60,
    )  # fmt: skip
    assert outcome.status == 0, outcome.stderr[-500:]
    assert "plan for llama-3.2-1b" in outcome.stdout


def test_3_absurd_plan_inputs_are_one_line_errors_at_once() -> None:
    outcome = run_limited("plan", "llama-3.2-1b", "--gpu", "h100-80gb", "--batch", "2147483648")
    assert_one_line_error(outcome, "batch: must be an integer <= 1,048,576")
    outcome = run_limited("plan", "llama-3.2-1b", "--gpu", "h100-80gb", "--gpus", str(2**21), "--shard", "fsdp")
    assert_one_line_error(outcome, "parallel.gpus: must be an integer <= 1,048,576")


def test_3_a_plan_stops_at_its_budget_and_when_cancelled() -> None:
    import threading

    from vramlens.planner import plan
    from vramlens.planner.budget import PlanBudget, PlanCancelled, PlanTooLarge

    workload = {"model": "llama-3.1-8b", "gpu": "h100-80gb", "parallel": {"gpus": 64, "shard": "fsdp"}}
    with pytest.raises(PlanTooLarge) as caught:
        plan(workload, allow_method_change=True, budget=PlanBudget(max_estimates=50, max_seconds=60))
    message = str(caught.value)
    assert (
        message.startswith("plan: the search passed its limit of 50 configurations estimated") and "\n" not in message
    )
    stop = threading.Event()
    stop.set()
    with pytest.raises(PlanCancelled):
        plan(workload, budget=PlanBudget(max_estimates=10**6, max_seconds=60, cancel=(stop,)))


def test_3_divisors_and_micro_batches_take_no_walk_over_integers() -> None:
    from vramlens.planner.candidates import _divisors, _micro_batches
    from vramlens.workload import load_workload

    assert _divisors(2**20) == [2**k for k in range(21)]
    assert _divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36] and _divisors(1) == [1] and _divisors(97) == [1, 97]
    user = load_workload({"model": "llama-3.2-1b", "batch": 2**20, "grad_accum": 2**10, "seq": 128})
    micro = _micro_batches(user, user.parallel)  # 2**30 samples per rank: no walk to 2**30
    assert micro[0] == 2**30 and micro[-1] == 2**10 and all(2**30 // m <= 2**20 for m in micro)


# ---- 4. the estimate cache ----------------------------------------------------------------------


def test_4_the_estimate_cache_is_keyed_on_the_workload_and_bounded_in_bytes() -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx2")
    from starlette.testclient import TestClient

    from vramlens.web import create_app

    app = create_app()
    with TestClient(app, base_url="http://127.0.0.1") as client:
        for pad in range(40):  # one workload, padded differently each time (up to 10 MiB each before)
            body = b'{"model": "llama-3.2-1b"' + b" " * (pad * 50_000) + b"}"
            assert client.post("/api/estimate", content=body).status_code == 200
        cache = app.state.estimates
        held = sum(len(key) + len(answer) for key, answer in cache._answers.items())
        assert len(cache._answers) == 2 - 1 and held < 64 * 2**10
        for batch in range(1, 700):
            assert (
                client.post("/api/estimate?report=false", json={"model": "llama-3.2-1b", "batch": batch}).status_code
                == 200
            )
        held = sum(len(key) + len(answer) for key, answer in cache._answers.items())
        assert len(cache._answers) <= 512 and held <= 8 * 2**20


# ---- 5. devices and FIFOs -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["estimate", "/dev/zero"], "a device, not a regular file"),
        (["estimate", "llama-3.2-1b", "-c", "/dev/urandom"], "a device, not a regular file"),
        (["view", "/dev/urandom"], "a device, not a regular file"),
        (["models", "show", "/dev/zero"], "a device, not a regular file"),
    ],
)
def test_5_devices_are_refused_without_reading(args: list[str], fragment: str) -> None:
    assert_one_line_error(run_limited(*args), fragment)


def test_5_fifos_are_refused_without_blocking(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    _config(model)
    os.mkfifo(model / "model.safetensors")
    assert_one_line_error(run_limited("estimate", str(model)), "a FIFO (named pipe), not a regular file")
    os.mkfifo(tmp_path / "run.yaml")
    assert_one_line_error(run_limited("estimate", "-c", str(tmp_path / "run.yaml")), "FIFO")
    os.mkfifo(tmp_path / "snap.pickle")
    assert_one_line_error(run_limited("view", str(tmp_path / "snap.pickle")), "FIFO")


def test_5_a_device_or_fifo_is_not_a_results_store(tmp_path: Path) -> None:
    from vramlens.experiments.store import ResultStore

    os.mkfifo(tmp_path / "fifo.jsonl")
    for path in ("/dev/zero", str(tmp_path / "fifo.jsonl")):
        with pytest.raises(InputError, match=r"--store: .* not a regular file"):
            ResultStore(path).rows()


# ---- 6. --store never destroys a file -----------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [b"my notes: run 3 was the good one", b'{"model_type":"llama","hidden_size":4096}', b"{}", b"\n\xff\xfe binary"],
)
def test_6_a_file_that_is_not_a_store_is_refused_and_left_as_it_is(tmp_path: Path, content: bytes) -> None:
    from vramlens.experiments.store import ResultStore

    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    with pytest.raises(InputError) as caught:
        ResultStore(path).append({"key": "abc", "name": "control"})
    assert str(caught.value).startswith("--store: ") and "\n" not in str(caught.value)
    assert path.read_bytes() == content


def test_6_only_a_torn_last_row_of_a_real_store_is_cut(tmp_path: Path) -> None:
    from vramlens.experiments.store import ResultStore

    path = tmp_path / "s.jsonl"
    path.write_bytes(b'{"key":"a","name":"control"}\n{"key":"b","na')
    assert ResultStore(path).append({"key": "c"})
    assert path.read_bytes() == b'{"key":"a","name":"control"}\n{"key":"c"}\n'
    path.write_bytes(b'{"key":"a"}\nnotes appended by hand')
    with pytest.raises(InputError, match="not a vramlens results store"):
        ResultStore(path).append({"key": "c"})
    assert path.read_bytes() == b'{"key":"a"}\nnotes appended by hand'


# ---- 7. one-line errors instead of tracebacks ---------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["estimate", "llama-3.1-8b", "--batch", str(10**18)], "batch: must be an integer <= 1,048,576"),
        (["estimate", "llama-3.1-8b", "--seq", str(10**12), "--allow-long-context"], "seq: must be an integer <="),
        (["estimate", "llama-3.1-8b", "--seq", str(2**24), "--batch", "4096", "--allow-long-context"], "2**32"),
        (["estimate", "llama-3.1-8b", "--batch", "9" * 5000], "batch: must be an integer"),
    ],
)
def test_7_huge_numbers_are_one_line_errors(args: list[str], fragment: str) -> None:
    assert_one_line_error(run_limited(*args), fragment)


def test_7_rich_markup_in_a_config_prints_as_text(tmp_path: Path) -> None:
    config = _config(tmp_path, architectures=["[/bold][red]LlamaForCausalLM"])
    outcome = run_limited("models", "show", str(config))
    assert outcome.status == 0, outcome.stderr[-500:]
    assert "[/bold][red]LlamaForCausalLM" in outcome.stdout


def test_7_rich_markup_in_a_run_name_prints_as_text(tmp_path: Path) -> None:
    from vramlens.experiments.matrix import load_matrix

    path = tmp_path / "m.yaml"
    path.write_text("model: llama-3.2-1b\ndevice: cpu\nruns: [{name: '[/bold] run', techniques: []}]\n")
    key = load_matrix(path).runs[0].key
    store = tmp_path / "s.jsonl"  # the run is stored: nothing trains, the table and progress print
    row = {"key": key, "name": "[/bold] run", "techniques": [], "measured_peak_bytes": 2**30, "device": "cpu"}
    store.write_text(json.dumps(row) + "\n")
    outcome = run_limited("experiment", "-c", str(path), "--store", str(store), "--no-simulate", seconds=30)
    assert outcome.status == 0, outcome.stderr[-500:]
    assert "[/bold] run" in outcome.stdout


def test_7_a_parallel_block_that_is_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("model: llama-3.2-1b\nparallel: 5\n")
    for args in (["plan", "-c", str(path), "--gpu", "h100-80gb"], ["estimate", "-c", str(path), "--tp", "2"]):
        assert_one_line_error(run_limited(*args), "parallel: expected a mapping of keys, got int")


def test_7_a_cuda_device_on_a_machine_without_one(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    for device in ("cuda", "cuda:99"):
        outcome = run_limited(
            "experiment", "llama-3.2-1b", "--device", device, "--store", str(tmp_path / "s.jsonl"), seconds=30,
            memory=4 * 2**30,
        )  # fmt: skip
        assert_one_line_error(outcome, f"device: '{device}', but torch sees no CUDA GPU")


def test_7_deep_lists_in_snapshot_fields_are_one_line_errors() -> None:
    from vramlens.snapshot import load_snapshot

    entry = {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "frames": [], "user_metadata": "DEEP"}
    data = pickle.dumps({"segments": [], "device_traces": [[entry]]}, protocol=2)  # protocol 2: no frames to fix
    depth = 100_000  # EMPTY_LIST x depth, then APPEND x (depth - 1): lists nested 100,000 deep
    data = data.replace(b"X\x04\x00\x00\x00DEEP", b"]" * depth + b"a" * (depth - 1))
    with pytest.raises(InputError, match="nested deeper than 64 levels"):
        load_snapshot(data).timeline()
    with pytest.raises(InputError, match="nested too deeply"):
        load_snapshot(deep_list_json(100_000))


def test_7_corrupt_store_rows_are_one_line_errors(tmp_path: Path) -> None:
    from vramlens.experiments.store import ResultStore

    path = tmp_path / "s.jsonl"
    for row, problem in (
        ({"key": "a", "measured_peak_bytes": "12"}, "measured_peak_bytes is '12', not a byte count"),
        ({"key": "a", "measured_peak_bytes": -3928420}, "measured_peak_bytes is -3928420, not a byte count"),
        ({"key": "a", "techniques": "bf16"}, "techniques is 'bf16', not a list of text"),
        ({"key": "a", "name": ["x"]}, "name is ['x'], not text"),
        ({"key": 5}, "has no run key"),
    ):
        path.write_text(json.dumps(row) + "\n")
        with pytest.raises(InputError, match=r"^--store: .* line 1 ") as caught:
            ResultStore(path).rows()
        assert problem in str(caught.value)
    path.write_text('{"key": "a", "loss": NaN}\n')
    with pytest.raises(InputError, match="line 1 is not JSON"):
        ResultStore(path).rows()


# ---- 8. terminal escape codes -------------------------------------------------------------------


def test_8_control_characters_from_a_config_are_escaped_on_the_terminal(tmp_path: Path) -> None:
    title = "\x1b]0;pwned\x07"
    config = _config(tmp_path, architectures=[f"Llama{title}ForCausalLM"], hidden_act=f"silu{title}")
    for args in (["models", "show", str(config)], ["estimate", str(config), "--seq", "64"]):
        outcome = run_limited(*args)
        printed = outcome.stdout + outcome.stderr
        assert "\x1b" not in printed and "\x07" not in printed, printed[-500:]
    assert "Llama\\x1b]0;pwned" in run_limited("models", "show", str(config)).stdout  # BEL: dropped by rich


def test_8_control_characters_in_error_lines_are_escaped(tmp_path: Path) -> None:
    model = tmp_path / "model\x1b]0;pwned\x07"  # a model folder's name becomes the model's name
    model.mkdir()
    _config(model, max_position_embeddings=128)
    outcome = run_limited("estimate", str(model), "--seq", "4096")  # longer than the model's positions
    assert_one_line_error(outcome, "model\\x1b]0;pwned\\x07", "max_position_embeddings")
    assert "\x1b" not in outcome.stderr and "\x07" not in outcome.stderr


# ---- 10. finite, plausible numbers; never NaN in JSON -------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (
            [
                "rlhf",
                "--algo",
                "ppo",
                "--actor",
                "llama-3.2-1b",
                "--gpu",
                "h100-80gb",
                "--pcie-gbps",
                "nan",
                "--format",
                "json",
            ],
            "pcie_gbps: must be a finite number",
        ),
        (
            ["estimate", "llama-3.1-8b", "--method", "lora", "--lora-rank", "1000000000"],
            "lora.rank: must be an integer <= 65,536",
        ),
        (
            [
                "estimate",
                "llama-3.1-8b",
                "--mode",
                "infer",
                "--engine",
                "vllm",
                "--gpu",
                "h100-80gb",
                "--max-num-seqs",
                str(10**12),
            ],
            "max_num_seqs: must be an integer <= 1,048,576",
        ),
        (["estimate", "llama-3.1-8b", "--gpu", "1"], "gpu: a GPU size must be from 256 MiB to 64 TiB"),
        (
            [
                "estimate",
                "llama-3.1-8b",
                "--mode",
                "infer",
                "--engine",
                "vllm",
                "--gpu",
                "h100-80gb",
                "--gpu-memory-utilization",
                "1e-300",
            ],
            "gpu_memory_utilization: must be a number >= 0.01",
        ),
        (
            ["estimate", "llama-3.1-8b", "--lora-alpha", "inf", "--method", "lora"],
            "lora.alpha: must be a finite number",
        ),
    ],
)
def test_10_absurd_numbers_are_refused(args: list[str], fragment: str) -> None:
    outcome = run_limited(*args)
    assert "NaN" not in outcome.stdout
    assert_one_line_error(outcome, fragment)


def test_10_the_web_estimate_refuses_absurd_numbers() -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx2")
    from starlette.testclient import TestClient

    from vramlens.web import create_app

    with TestClient(create_app(), base_url="http://127.0.0.1") as client:
        for body, fragment in (
            ({"model": "llama-3.1-8b", "batch": 10**18}, "batch: must be an integer <= 1,048,576"),
            ({"model": "llama-3.1-8b", "lora": {"alpha": 1e400}}, "not a finite number"),
            ({"model": "llama-3.1-8b", "batch": "NINES"}, "invalid JSON: Exceeds the limit (4300 digits)"),
        ):
            raw = json.dumps(body).replace("Infinity", "1e400").replace('"NINES"', "9" * 5000).encode()
            answer = client.post("/api/estimate", content=raw)
            assert answer.status_code == 400 and fragment in answer.json()["error"], answer.text[:300]


def test_10_a_negative_stored_peak_never_reaches_a_table(tmp_path: Path) -> None:
    from vramlens.experiments.store import ResultStore

    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"key": "a", "name": "control", "measured_peak_bytes": -3928420}) + "\n")
    with pytest.raises(InputError, match="not a byte count"):
        ResultStore(path).finished()


# ---- 11. no code from a matrix file -------------------------------------------------------------


def test_11_a_matrix_file_cannot_import_and_call_a_factory(tmp_path: Path) -> None:
    from vramlens.experiments.matrix import load_matrix

    path = tmp_path / "m.yaml"
    path.write_text("model: tempfile:mkdtemp\ndevice: cpu\nruns: [control]\n")
    with pytest.raises(InputError, match="--trust-model-code") as caught:
        load_matrix(path)
    assert "\n" not in str(caught.value)
    matrix = load_matrix(path, trust_model_code=True)  # opt-in: the user typed the flag
    assert matrix.runs[0].model == "tempfile:mkdtemp"
    typed = load_matrix(path, {"model": "tempfile:mkdtemp"})  # the MODEL argument the user typed
    assert typed.runs[0].model == "tempfile:mkdtemp"


@pytest.mark.slow
def test_11_the_cli_runs_no_factory_named_by_a_matrix_file(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    made = tmp_path / "tmp"
    made.mkdir()
    path = tmp_path / "m.yaml"
    path.write_text("model: tempfile:mkdtemp\ndevice: cpu\nruns: [control]\n")
    outcome = run_limited(
        "experiment", "-c", str(path), "--store", str(tmp_path / "s.jsonl"), seconds=60, memory=4 * 2**30,
        env=limited_env(TMPDIR=str(made)),
    )  # fmt: skip
    assert_one_line_error(outcome, "names a Python factory to import and call", "--trust-model-code")
    assert list(made.iterdir()) == []  # tempfile.mkdtemp was never called


# ---- 12. long strings, the HF cache, long messages ----------------------------------------------


@pytest.mark.slow
def test_12_a_huge_frame_name_is_abridged_in_the_table(tmp_path: Path) -> None:
    name = "ab " * 10**6
    frames = [{"filename": "train.py", "line": 1, "name": name}]
    trace = [
        {"action": "alloc", "addr": 4096, "size": 2**20, "stream": 0, "frames": frames},
        {"action": "free_requested", "addr": 4096, "size": 2**20, "stream": 0, "frames": frames},
        {"action": "free_completed", "addr": 4096, "size": 2**20, "stream": 0, "frames": frames},
    ]
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace]}, protocol=4))
    outcome = run_limited("view", str(path), seconds=10)
    assert outcome.status == 0, outcome.stderr[-500:]
    assert len(outcome.stdout) < 100_000


def test_12_a_cache_ref_cannot_lead_out_of_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vramlens.errors import ModelNotFoundError
    from vramlens.model.resolve import load_model

    cache = tmp_path / "hub"
    repo = cache / "models--org--name"
    (repo / "snapshots").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("../../../evil")
    evil = tmp_path / "evil"
    evil.mkdir()
    _config(evil, hidden_size=256)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    with pytest.raises(ModelNotFoundError):
        load_model("org/name")
    (repo / "snapshots" / "escape").symlink_to(evil, target_is_directory=True)  # a link out of the cache
    with pytest.raises(ModelNotFoundError):
        load_model("org/name")
    inside = repo / "snapshots" / ("a" * 40)
    inside.mkdir()
    _config(inside, hidden_size=128)
    (repo / "refs" / "main").write_text("a" * 40)
    assert load_model("org/name").hidden_size == 128


def test_12_error_messages_are_capped(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("model: [&a [" + ", ".join(["x" * 20] * 8) + "], *a, *a, *a, *a, *a, *a, *a, *a, *a]\n")
    assert path.stat().st_size < 400
    outcome = run_limited("estimate", "-c", str(path))
    line = assert_one_line_error(outcome, "model: must be a non-empty string")
    assert len(line) < 300
    with pytest.raises(VramlensError) as caught:
        raise InputError("x" * 500_000)
    assert len(str(caught.value)) <= 1000 + 50
