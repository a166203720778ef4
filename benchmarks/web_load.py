"""Latency of ``vramlens serve`` under 200 concurrent estimates, beside the same estimates in-process.

Run: ``python benchmarks/web_load.py [--bursts 5]``. The server runs in its own process (one
uvicorn worker, as users run it) on a free port; the client opens 200 connections and sends
200 *different* workloads at once (five models x 40 batch sizes, a new sequence length per
burst, so the answer cache cannot help), as the page asks for them
(``/api/estimate?report=false``), and times each from its send to its whole answer. The
yardstick, run in the same process: the same 200 estimates computed one after another by
``vramlens.estimator`` (what the server must do at the least). Printed per burst: p50, p99 and
max in ms and the p99 as a ratio to the yardstick's total (1.0 = the server answers the last
request as fast as a single process could compute all 200). The web page's target was p99 at
most 200 ms on a quiet machine; this is a benchmark, not a pass/fail test (the deterministic
load test is ``tests/web/test_web_load.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
import urllib.request

CONCURRENT = 200
MODELS = ("llama-3.1-8b", "qwen2.5-7b", "mistral-7b", "llama-3.1-70b", "gemma-3-1b-it")
TARGET = "/api/estimate?report=false"


def _bodies(burst: int) -> list[dict[str, object]]:
    seq = 1024 + 64 * burst
    return [{"model": MODELS[i % 5], "gpu": "h100-80gb", "batch": 1 + i // 5, "seq": seq} for i in range(CONCURRENT)]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _start(port: int) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [sys.executable, "-m", "vramlens", "serve", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/gpus", timeout=1):
                return process
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                raise SystemExit("the server did not start") from None
            time.sleep(0.1)


async def _one(port: int, body: bytes, go: asyncio.Event) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = f"POST {TARGET} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"  # fmt: skip
    await go.wait()
    start = time.perf_counter()
    writer.write(head.encode() + body)
    await writer.drain()
    lines = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
    if lines[0].split()[1] != b"200":
        raise SystemExit(f"the server answered {lines[0]!r}")
    length = next(int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length:"))
    await reader.readexactly(length)
    elapsed = time.perf_counter() - start
    writer.close()
    await writer.wait_closed()
    return elapsed


async def _burst(port: int, bodies: list[dict[str, object]]) -> list[float]:
    go = asyncio.Event()
    tasks = [asyncio.create_task(_one(port, json.dumps(body).encode(), go)) for body in bodies]
    await asyncio.sleep(0.3)  # every connection open before the first request goes out
    go.set()
    return sorted(await asyncio.gather(*tasks))


def _yardstick(bodies: list[dict[str, object]]) -> float:
    from vramlens.estimator import estimate

    start = time.perf_counter()
    for body in bodies:
        estimate(body)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bursts", type=int, default=5)
    bursts = parser.parse_args().bursts
    port = _free_port()
    process = _start(port)
    try:
        asyncio.run(_burst(port, _bodies(0)))  # warm-up: code paths and connections
        _yardstick(_bodies(0))
        for burst in range(1, bursts + 1):
            latencies = asyncio.run(_burst(port, _bodies(burst)))
            alone = _yardstick(_bodies(burst + 100))  # new workloads: no memo helps the yardstick either
            p50, p99 = latencies[len(latencies) // 2], latencies[int(0.99 * len(latencies)) - 1]
            print(
                f"burst {burst}: p50 {p50 * 1e3:6.1f} ms  p99 {p99 * 1e3:6.1f} ms  max {latencies[-1] * 1e3:6.1f} ms"
                f"  | in-process, 200 one after another: {alone * 1e3:6.1f} ms  -> p99 / yardstick {p99 / alone:.2f}"
            )
    finally:
        process.terminate()
        process.wait(timeout=10)


if __name__ == "__main__":
    main()
