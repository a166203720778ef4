"""A bounded fuzz of every reader and of the web API, each input under the issue's limits
(issue 21: 5 s and 512 MiB per input, in a subprocess).

For each kind of input (snapshot pickle / JSON / gzip / npz through ``vramlens view``; workload
YAML/JSON; RLHF setup; experiment matrix; config.json; safetensors header; results store; the
web API's routes) the test writes valid seeds, seeded random mutations of them (bit flips,
cuts, insertions, splices) and hand-made hostile inputs (bombs, deep nesting, huge numbers,
NaN, control characters, ``<script>``), then runs ``tests/fuzz_worker.py`` on them under
``RLIMIT_AS`` = 512 MiB. The worker reads each input as the user's command would (and renders
the terminal table and HTML where the command does); the test fails on any traceback, any
error that is not one line, any input that takes more than 5 s (the worker is killed and
restarted after it), any memory error, and any control character or unescaped ``<script>``
that reaches the output.
"""

from __future__ import annotations

import gzip
import json
import pickle
import random
import selectors
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import tiny_llama_config, write_safetensors
from hostile import (
    MEMORY,
    SECONDS,
    deep_list_json,
    gzip_bomb,
    laughs_pickle,
    laughs_yaml,
    limited_env,
    npz_bomb,
    tiny_timeline_npz,
    tuple_hash_bomb,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform == "win32", reason="resource limits are POSIX"),
]

WORKER = Path(__file__).with_name("fuzz_worker.py")
#: Random mutants per seed (the hand-made hostile inputs come on top).
MUTANTS = 12
#: Allowance for the worker's imports before its first input (a busy CI machine).
START_SECONDS = 60.0
SCRIPT = "<script>fuzz</script>"
ESCAPE = "\x1b]0;fuzz\x07"


def _mutants(seed: bytes, rng: random.Random, count: int = MUTANTS) -> Iterator[bytes]:
    """``count`` random byte-level mutations of ``seed``."""
    for _ in range(count):
        data = bytearray(seed)
        for _ in range(rng.randint(1, 4)):
            how = rng.choice(("flip", "cut", "insert", "splice", "repeat"))
            at = rng.randrange(len(data) + 1) if data else 0
            if how == "flip" and data:
                data[min(at, len(data) - 1)] ^= 1 << rng.randrange(8)
            elif how == "cut":
                del data[at : at + rng.randint(1, 64)]
            elif how == "insert":
                data[at:at] = rng.choice([b"\xff", b"\x00" * 8, b"[", b"{", b"&a ", b"*a", b"9" * 40, b"NaN"])
            elif how == "splice" and data:
                start = rng.randrange(len(data))
                data[at:at] = data[start : start + rng.randint(1, 128)]
            elif how == "repeat":
                data += data[at : at + rng.randint(1, 256)] * rng.randint(1, 8)
        yield bytes(data)


def _scenario_snapshot() -> dict[str, object]:
    sys.path.insert(0, str(Path(__file__).parent / "snapshot"))
    from layouts import scenario_snapshot

    snapshot: dict[str, object] = scenario_snapshot("2.1+")
    return snapshot


def _snapshot_inputs(folder: Path, rng: random.Random) -> dict[str, bytes]:
    snapshot = _scenario_snapshot()
    hostile = json.loads(json.dumps(snapshot))
    hostile["device_traces"][0][1]["frames"] = [{"filename": SCRIPT + ESCAPE, "line": 1, "name": "x" * 100_000}]
    hostile["external_annotations"] = [{"name": SCRIPT, "stage": "START", "device": 0, "time_us": 1}]
    raw_rows = json.dumps([[0, 2, 1048576, 1], [10, 4, -1048576, 1], [-1, 1, 4096, 0]]).encode()
    coalesced = json.dumps([[0, 10], [[0] * 9, [0, 1, 2, 3, 4, 5, 6, 7, 8]]]).encode()
    npz = tiny_timeline_npz(folder / "seed.npz").read_bytes()
    seeds = {
        "p4": pickle.dumps(snapshot, protocol=4),
        "p2": pickle.dumps(snapshot, protocol=2),
        "json": json.dumps(snapshot).encode(),
        "raw": raw_rows,
        "gz": gzip.compress(raw_rows, mtime=0),
        "coalesced": coalesced,
        "npz": npz,
    }
    inputs = {f"{name}-seed": data for name, data in seeds.items()}
    for name, data in seeds.items():
        inputs |= {f"{name}-m{i}": mutant for i, mutant in enumerate(_mutants(data, rng))}
    inputs |= {
        "hostile-strings": pickle.dumps(hostile, protocol=4),
        "laughs-frames": laughs_pickle("frames"),
        "laughs-metadata": laughs_pickle("user_metadata"),
        "hash-bomb": tuple_hash_bomb(),
        "deep-json": deep_list_json(100_000),
        "deep-json-900": deep_list_json(900),
        "big-int": b'{"segments": [], "device_traces": [[{"action": "alloc", "addr": ' + b"9" * 5000 + b"}]]}",
        "nan": b"[[NaN, 2, 1, 1]]",
        "gzip-bomb": gzip_bomb(2**30),
        "npz-bomb": npz_bomb(2**29),
        "empty": b"",
    }
    return inputs


def _text_inputs(seeds: dict[str, str], key: str, rng: random.Random) -> dict[str, bytes]:
    inputs: dict[str, bytes] = {}
    for name, text in seeds.items():
        inputs[f"{name}-seed"] = text.encode()
        inputs |= {f"{name}-m{i}": mutant for i, mutant in enumerate(_mutants(text.encode(), rng))}
    inputs |= {
        "laughs.yaml": laughs_yaml(key).encode(),
        "merge.yaml": (
            "a: &a {x: 1, y: 2}\nb: &b {<<: [*a, *a, *a, *a], z: 3}\nc: &c {<<: [*b, *b, *b, *b]}\n"
            f"{key}: {{<<: [*c, *c, *c, *c]}}\n"
        ).encode(),
        "cycle.yaml": f"{key}: &a [*a]\n".encode(),
        "deep.yaml": (f"{key}: " + "[" * 5000 + "]" * 5000 + "\n").encode(),
        "bigint.yaml": f"{key}: {'9' * 5000}\n".encode(),
        "python-tag.yaml": f"{key}: !!python/object/apply:os.system ['touch /tmp/vramlens-fuzz']\n".encode(),
        "escape.yaml": f"{key}: '{ESCAPE}{SCRIPT}'\n".encode(),
        "nul.yaml": b"\x00\x01",
        "deep.json": b'{"' + key.encode() + b'": ' + deep_list_json(100_000) + b"}",
        "bigint.json": b'{"' + key.encode() + b'": ' + b"9" * 5000 + b"}",
        "nan.json": b'{"' + key.encode() + b'": NaN}',
    }
    return inputs


def _workload_inputs(folder: Path, rng: random.Random) -> dict[str, bytes]:
    seeds = {
        "train.yaml": "model: llama-3.2-1b\nbatch: 4\nseq: 512\ngpu: h100-80gb\nparallel: {gpus: 2, shard: fsdp}\n",
        "lora.yaml": "model: llama-3.2-1b\nmethod: lora\nlora: {rank: 8, alpha: 16}\nseq: 8k\n",
        "infer.yaml": "model: llama-3.2-1b\nmode: infer\nengine: vllm\ngpu: 24GiB\nmax_num_seqs: 64\n",
    }
    inputs = _text_inputs(seeds, "model", rng)
    inputs |= {
        "huge.yaml": b"model: llama-3.2-1b\nbatch: 1000000000000000000\n",
        "nan.yaml": b"model: llama-3.2-1b\nmode: infer\ngpu_memory_utilization: .nan\n",
        "parallel.yaml": b"model: llama-3.2-1b\nparallel: 5\n",
    }
    return {name if name.endswith((".yaml", ".json")) else f"{name}.yaml": data for name, data in inputs.items()}


def _rlhf_inputs(folder: Path, rng: random.Random) -> dict[str, bytes]:
    seeds = {
        "ppo.yaml": "algo: ppo\nactor: llama-3.2-1b\ngpu: h100-80gb\ngpus: 8\ntp: 2\nrollout: {engine: vllm}\n",
        "grpo.yaml": "algo: grpo\nactor: {model: llama-3.2-1b, method: lora, lora_rank: 16}\ngpu: 80GiB\npcie_gbps: 25\n",
    }
    inputs = _text_inputs(seeds, "actor", rng)
    inputs["nan.yaml"] = b"algo: ppo\nactor: llama-3.2-1b\ngpu: h100-80gb\npcie_gbps: .nan\n"
    return {name if name.endswith((".yaml", ".json")) else f"{name}.yaml": data for name, data in inputs.items()}


def _matrix_inputs(folder: Path, rng: random.Random) -> dict[str, bytes]:
    seeds = {
        "m.yaml": "model: llama-3.2-1b\nsteps: 3\ndevice: cpu\nruns:\n  - control\n  - bf16+checkpoint\n"
        "  - {name: Budget, techniques: [memory-budget=0.6]}\n",
    }
    inputs = _text_inputs(seeds, "model", rng)
    inputs["factory.yaml"] = b"model: tempfile:mkdtemp\ndevice: cpu\nruns: [control]\n"
    inputs["name.yaml"] = f"model: llama-3.2-1b\ndevice: cpu\nruns: [{{name: '{ESCAPE}[/bold]'}}]\n".encode()
    return {name if name.endswith((".yaml", ".json")) else f"{name}.yaml": data for name, data in inputs.items()}


def _config_inputs(folder: Path, rng: random.Random) -> dict[str, bytes]:
    seed = json.dumps(tiny_llama_config()).encode()
    inputs = {"seed": seed} | {f"m{i}": mutant for i, mutant in enumerate(_mutants(seed, rng, 3 * MUTANTS))}
    hostile = tiny_llama_config(architectures=[SCRIPT + ESCAPE + "[/bold]"], hidden_act="silu" + ESCAPE)
    inputs |= {
        "hostile": json.dumps(hostile).encode(),
        "deep": b'{"model_type": "llama", "hidden_size": ' + deep_list_json(100_000) + b"}",
        "bigint": json.dumps(tiny_llama_config(hidden_size=1)).replace("1", "9" * 5000, 1).encode(),
        "nan": json.dumps(tiny_llama_config(rope_theta=float("nan"))).encode(),
        "huge": json.dumps(tiny_llama_config(vocab_size=10**15, hidden_size=10**9)).encode(),
    }
    for name, data in inputs.items():  # each in its own folder, as config.json
        (folder / f"{name}.json").write_bytes(data)
    return {}


def _safetensors_inputs(folder: Path, rng: random.Random) -> dict[str, bytes]:
    seed_path = folder / "seed.safetensors"
    write_safetensors(seed_path, {"w": ("BF16", [4, 8]), "b": ("F32", [8])}, {"format": "pt"})
    seed = seed_path.read_bytes()
    inputs = {f"m{i}": mutant for i, mutant in enumerate(_mutants(seed, rng, 3 * MUTANTS))}
    header = json.dumps({"w": {"dtype": "F32", "shape": [10**12], "data_offsets": [0, 4 * 10**12]}}).encode()
    inputs |= {
        "length-bomb": struct.pack("<Q", 2**62) + b"{}",
        "huge-shape": struct.pack("<Q", len(header)) + header,
        "deep": struct.pack("<Q", 200_002) + deep_list_json(100_001),
        "nan": struct.pack("<Q", 11) + b'{"a": NaN}',
    }
    return {f"{name}.safetensors": data for name, data in inputs.items()}


def _store_inputs(folder: Path, rng: random.Random) -> dict[str, bytes]:
    rows = [
        {"key": "a1", "name": "control", "techniques": [], "measured_peak_bytes": 2**30, "tokens_per_s": 10.0},
        {"key": "b2", "name": "bf16", "techniques": ["bf16"], "measured_peak_bytes": 2**29, "loss": 3.2},
    ]
    seed = b"".join(json.dumps(row).encode() + b"\n" for row in rows)
    inputs = {"seed": seed} | {f"m{i}": mutant for i, mutant in enumerate(_mutants(seed, rng, 3 * MUTANTS))}
    inputs |= {
        "negative": b'{"key": "a", "measured_peak_bytes": -3928420}\n',
        "name": json.dumps({"key": "a", "name": SCRIPT + ESCAPE + "[/bold]", "measured_peak_bytes": 1}).encode()
        + b"\n",
        "notes": b"my notes, no newline",
        "nan": b'{"key": "a", "loss": NaN}\n',
    }
    return {f"{name}.jsonl": data for name, data in inputs.items()}


def _web_inputs(folder: Path, rng: random.Random) -> dict[str, bytes]:
    bodies = {
        "/api/estimate": json.dumps({"model": "llama-3.2-1b", "batch": 2, "seq": 1024}).encode(),
        "/api/estimate?report=false": json.dumps({"model": "llama-3.2-1b", "mode": "infer", "engine": "vllm"}).encode(),
        "/api/plan": json.dumps({"workload": {"model": "llama-3.2-1b", "gpu": "h100-80gb"}, "top": 2}).encode(),
        "/api/report.html": json.dumps({"model": "llama-3.2-1b"}).encode(),
        "/api/config?name=config.json": json.dumps(tiny_llama_config()).encode(),
        "/api/snapshot?name=s.pickle": pickle.dumps(_scenario_snapshot(), protocol=4),
    }
    inputs: dict[str, bytes] = {}
    for index, (target, body) in enumerate(bodies.items()):
        inputs[f"{index}-seed"] = f"POST {target}\n".encode() + body
        for i, mutant in enumerate(_mutants(body, rng, MUTANTS)):
            inputs[f"{index}-m{i}"] = f"POST {target}\n".encode() + mutant
    hostile = {
        "deep": deep_list_json(100_000),
        "deep-900": b'{"model": ' + deep_list_json(900) + b"}",
        "bigint": b'{"model": "llama-3.2-1b", "batch": ' + b"9" * 5000 + b"}",
        "nan": b'{"model": "llama-3.2-1b", "lora": {"alpha": NaN}}',
        "batch": b'{"model": "llama-3.2-1b", "batch": 1000000000000000000}',
        "parallel": b'{"model": "llama-3.2-1b", "parallel": 5}',
        "escape": json.dumps({"model": ESCAPE + SCRIPT}).encode(),
    }
    for name, body in hostile.items():
        for target in ("/api/estimate", "/api/report.html", "/api/config"):
            inputs[f"h-{name}-{target.rsplit('/', 1)[1]}"] = f"POST {target}\n".encode() + body
        inputs[f"h-{name}-plan"] = b"POST /api/plan\n" + b'{"workload": ' + body + b"}"
    inputs["h-gzip-bomb"] = b"POST /api/snapshot?name=m.json.gz\n" + gzip_bomb(2**28)
    inputs["h-laughs"] = b"POST /api/snapshot\n" + laughs_pickle()
    inputs["h-hash-bomb"] = b"POST /api/snapshot\n" + tuple_hash_bomb()
    inputs["h-get-405"] = b"GET /api/plan\n"
    inputs["h-name"] = b"POST /api/config?name=" + b"%1b%5d0%3b" * 20 + b"\n{}"
    return {f"{name}.req": data for name, data in inputs.items()}


BUILDERS = {
    "snapshot": _snapshot_inputs,
    "workload": _workload_inputs,
    "rlhf": _rlhf_inputs,
    "matrix": _matrix_inputs,
    "config": _config_inputs,
    "safetensors": _safetensors_inputs,
    "store": _store_inputs,
    "web": _web_inputs,
}


def _run_worker(kind: str, folder: Path) -> tuple[list[str], int]:
    """Run the worker over ``folder``; returns the failures and how many inputs were read.
    An input that runs past :data:`SECONDS` is a failure; the worker restarts after it."""
    names = sorted(path.name for path in folder.iterdir())
    failures: list[str] = []
    done: set[str] = set()
    while len(done) < len(names):
        pending = folder.parent / f"{kind}-pending"
        pending.mkdir(exist_ok=True)
        for name in names:
            if name not in done and not (pending / name).exists():
                (pending / name).symlink_to(folder / name)
        failures += _one_worker(kind, pending, done)
        for link in pending.iterdir():
            if link.name in done:
                link.unlink()
    return failures, len(done)


def _one_worker(kind: str, folder: Path, done: set[str]) -> list[str]:
    import resource

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    errors = (folder.parent / f"{kind}-stderr.txt").open("w+b")
    process = subprocess.Popen(
        [sys.executable, str(WORKER), kind, str(folder)],
        stdout=subprocess.PIPE,
        stderr=errors,
        env=limited_env(),
        preexec_fn=limits,
    )
    assert process.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    failures: list[str] = []
    current, deadline, buffer = None, time.monotonic() + START_SECONDS, b""
    try:
        while True:
            if not selector.select(timeout=max(deadline - time.monotonic(), 0)):
                failures.append(f"{kind}/{current}: ran past {SECONDS:g} s (killed)")
                done.add(current or "")
                return failures
            chunk = process.stdout.read1(65536)  # type: ignore[attr-defined]
            if not chunk:
                break
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                text = line.decode(errors="replace")
                if text.startswith("START "):
                    current, deadline = text[6:], time.monotonic() + SECONDS
                elif text.startswith("END "):
                    name, status, *detail = text[4:].split(" ", 2)
                    done.add(name)
                    if status == "bad":
                        failures.append(f"{kind}/{name}: {detail[0] if detail else ''}")
                    current, deadline = None, time.monotonic() + SECONDS
    finally:
        process.kill()
        process.wait()
        process.stdout.close()
        selector.close()
        errors.seek(0)
        stderr = errors.read()[-300:]
        errors.close()
    if current is not None:  # the worker died inside an input (a crash, or killed for memory)
        failures.append(f"{kind}/{current}: the worker died ({stderr!r})")
        done.add(current)
    return failures


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_every_fuzzed_input_is_read_or_refused_in_one_line_within_limits(tmp_path: Path, kind: str) -> None:
    folder = tmp_path / kind
    folder.mkdir()
    rng = random.Random(21)
    for name, data in BUILDERS[kind](folder, rng).items():
        (folder / name).write_bytes(data)
    if kind == "config":  # load_model reads a folder's config.json: one folder per input
        for path in sorted(folder.glob("*.json")):
            model = folder / path.stem
            model.mkdir()
            path.rename(model / "config.json")
    failures, read = _run_worker(kind, folder)
    assert read >= 10
    assert not failures, "\n".join(failures)
    assert not Path("/tmp/vramlens-fuzz").exists()  # no YAML tag ran code
