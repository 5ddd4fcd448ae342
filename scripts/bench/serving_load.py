"""The serving phase of `make bench` (`--no-serving` skips it): the model server under a bounded load, beside the
SavedModel called in process, on one machine.

A tiny cnn is trained (synthetic data), its SavedModel served by `python -m trainer.serving`. Then, for each
protocol (REST v1 JSON in TF Serving's row form; gRPC v2 with raw tensors, the server's fastest), each batch size
(1 and 32 examples a request) and each number of concurrent clients (1, 8, 32), a bounded asyncio client sends
--serving-requests requests and records each one's latency and outcome. In the last gRPC cell (the largest batch
and client count) a second version is published halfway through: the figures must show no failed request
across the swap. In a separate process the SavedModel's signature is called directly at the same batch sizes.
Reported: requests/s, examples/s, p50 and p99 latency, failures, versions seen; and the ratio of the fastest
protocol's examples/s at the largest batch to the in-process call's.

Run alone with tiny counts: python -m scripts.bench.serving_load --serving-requests 8 --serving-clients 1,2
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
from typing import Any

from scripts.common.ports import free_ports
from scripts.common.settings import ROOT

from .runs import BenchError, clean_environment, log_tail, scratch_dir

PROTOCOLS = ("v1_json", "grpc_v2")
# At the largest batch, the fastest protocol serves at least this share of the in-process examples/s.
TARGET_SHARE = 0.5
IMAGE_SHAPE = (28, 28, 1)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("serving phase (the model server under load, against the in-process call)")
    group.add_argument("--no-serving", action="store_true", help="skip the serving phase")
    group.add_argument("--serving-requests", type=int, default=400, help="requests per cell (protocol, batch, clients)")
    group.add_argument("--serving-clients", default="1,8,32", help="concurrent clients, comma-separated")
    group.add_argument("--serving-batches", default="1,32", help="examples per request, comma-separated")


def counts(text: str, flag: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise BenchError(f"{flag} must be positive integers separated by commas, got {text!r}")
    return values


def available() -> bool:
    """The serving room is optional: without trainer/serving the phase is skipped."""
    return importlib.util.find_spec("trainer.serving") is not None


# ---- the load: one cell ------------------------------------------------------------------------


def image_batch(batch: int):
    import numpy as np

    return np.random.default_rng(batch).integers(0, 256, (batch, *IMAGE_SHAPE), dtype=np.uint8)


async def load_cell(
    protocol: str, url: str, target: str, model: str, batch: int, clients: int, requests: int, halfway: Any = None
) -> dict[str, Any]:
    """`requests` requests from `clients` concurrent clients; `halfway` (a callable) runs once half are sent."""
    import grpc
    import httpx
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    from kserve.protocol.grpc.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub

    images = image_batch(batch)
    latencies: list[float] = []
    failures: list[str] = []
    versions: dict[str, int] = {}
    remaining = iter(range(requests))
    v1_body = json.dumps({"instances": images.tolist()}).encode()
    tensor = pb.ModelInferRequest.InferInputTensor(name="images", datatype="UINT8", shape=list(images.shape))
    grpc_request = pb.ModelInferRequest(model_name=model, inputs=[tensor], raw_input_contents=[images.tobytes()])
    swapped = asyncio.Event()

    async def one_client(http: Any, stub: Any) -> None:
        for index in remaining:
            if halfway is not None and index == requests // 2 and not swapped.is_set():
                swapped.set()
                await asyncio.get_running_loop().run_in_executor(None, halfway)
            started = time.perf_counter()
            try:
                if protocol == "v1_json":
                    response = await http.post(f"{url}/v1/models/{model}:predict", content=v1_body)
                    if response.status_code != 200:
                        failures.append(f"{response.status_code} {response.text[:200]}")
                        continue
                    version = "n/a"
                else:
                    reply = await stub.ModelInfer(grpc_request, timeout=60)
                    version = reply.model_version
            except (httpx.HTTPError, grpc.RpcError) as error:
                failures.append(repr(error)[:200])
                continue
            latencies.append(time.perf_counter() - started)
            versions[version] = versions.get(version, 0) + 1

    started = time.perf_counter()
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        async with grpc.aio.insecure_channel(target) as channel:
            stub = GRPCInferenceServiceStub(channel)
            await asyncio.gather(*(one_client(http, stub) for _ in range(clients)))
    elapsed = time.perf_counter() - started
    return summarize_cell(protocol, batch, clients, latencies, failures, versions, elapsed)


def summarize_cell(
    protocol: str,
    batch: int,
    clients: int,
    latencies: list[float],
    failures: list[str],
    versions: dict[str, int],
    elapsed: float,
) -> dict[str, Any]:
    ordered = sorted(latencies)

    def quantile(share: float) -> float | None:
        return 1000 * ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else None

    return {
        "protocol": protocol,
        "batch": batch,
        "clients": clients,
        "requests": len(latencies) + len(failures),
        "failed": len(failures),
        "failures": failures[:5],
        "requests_per_second": len(latencies) / elapsed if elapsed else None,
        "examples_per_second": batch * len(latencies) / elapsed if elapsed else None,
        "p50_ms": quantile(0.50),
        "p99_ms": quantile(0.99),
        "versions_seen": versions,
        "seconds": elapsed,
    }


# ---- the in-process call -------------------------------------------------------------------------


def in_process(saved_model: str, batches: list[int], calls: int) -> list[dict[str, Any]]:
    """The signature called directly, one batch at a time, as the server calls it (no JSON, no network)."""
    import tensorflow as tf

    signature = tf.saved_model.load(saved_model).signatures["serve"]
    rows = []
    for batch in batches:
        images = tf.constant(image_batch(batch))
        signature(images=images)  # traced and warm, as the server's first version is
        latencies = []
        started = time.perf_counter()
        for _ in range(calls):
            begun = time.perf_counter()
            {name: tensor.numpy() for name, tensor in signature(images=images).items()}
            latencies.append(time.perf_counter() - begun)
        elapsed = time.perf_counter() - started
        rows.append(summarize_cell("in_process", batch, 1, latencies, [], {}, elapsed))
    return rows


# ---- the phase -------------------------------------------------------------------------------------


def train_model(scratch: pathlib.Path, timeout: float) -> pathlib.Path:
    model_dir = scratch / "serving-model"
    command = [sys.executable, "-m", "trainer", "--dataset", "synthetic", "--train-examples", "256"]
    command += ["--test-examples", "64", "--epochs", "1", "--model-dir", str(model_dir)]
    done = subprocess.run(command, cwd=ROOT, env=clean_environment(), capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise BenchError(f"training the served model failed:\n{done.stderr[-2000:]}")
    (version,) = [path for path in (model_dir / "serving").iterdir() if path.name.isdigit()]
    base_path = scratch / "served"
    base_path.mkdir()
    shutil.copytree(version, base_path / "1")
    return base_path


def start_server(base_path: pathlib.Path, log: pathlib.Path, timeout: float) -> tuple[subprocess.Popen, str, str]:
    import httpx

    rest, grpc_port = free_ports(2)
    command = [sys.executable, "-m", "trainer.serving", "--model-base-path", str(base_path), "--model-name", "bench"]
    command += ["--rest-port", str(rest), "--grpc-port", str(grpc_port), "--poll-seconds", "0.5"]
    with log.open("w") as out:
        server = subprocess.Popen(command, cwd=ROOT, env=clean_environment(), stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{rest}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise BenchError(f"the model server exited {server.returncode}:\n{log_tail(log)}")
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                return server, url, f"127.0.0.1:{grpc_port}"
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    server.kill()
    raise BenchError(f"the model server was not ready in {timeout:g} s:\n{log_tail(log)}")


def run_serving(args: argparse.Namespace, scratch: pathlib.Path) -> dict[str, Any]:
    clients = counts(args.serving_clients, "--serving-clients")
    batches = counts(args.serving_batches, "--serving-batches")
    scratch.mkdir(parents=True, exist_ok=True)
    print("[serving] training the served model ...", flush=True)
    base_path = train_model(scratch, args.timeout)
    in_process_rows = json.loads(
        subprocess.run(
            [sys.executable, "-m", "scripts.bench.serving_load", "--in-process", str(base_path / "1")]
            + ["--serving-batches", args.serving_batches, "--serving-requests", str(args.serving_requests)],
            cwd=ROOT,
            env=clean_environment(),
            capture_output=True,
            text=True,
            timeout=args.timeout,
            check=True,
        ).stdout.splitlines()[-1]
    )
    server, url, target = start_server(base_path, scratch / "server.log", args.timeout)
    cells = []
    try:
        for protocol in PROTOCOLS:
            for batch in batches:
                for count in clients:
                    last = protocol == PROTOCOLS[-1] and batch == batches[-1] and count == clients[-1]
                    halfway = (lambda: publish(base_path, 2, url, args.timeout)) if last else None
                    print(f"[serving] {protocol}, batch {batch}, {count} client(s) ...", flush=True)
                    cells.append(
                        asyncio.run(
                            load_cell(protocol, url, target, "bench", batch, count, args.serving_requests, halfway)
                        )
                    )
                    if last:
                        cells[-1]["version_published_halfway"] = 2
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    return summarize(cells, in_process_rows)


def publish(base_path: pathlib.Path, version: int, url: str, timeout: float) -> None:
    """A new version, renamed into place; returns once the server serves it (the other clients keep sending)."""
    import httpx

    partial = base_path / f".{version}.partial"
    shutil.copytree(base_path / "1", partial)
    os.replace(partial, base_path / str(version))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if httpx.get(f"{url}/v2/models/bench", timeout=10).json().get("versions") == [str(version)]:
            return
        time.sleep(0.1)
    raise BenchError(f"version {version} was not served {timeout:g} s after it was published")


def summarize(cells: list[dict[str, Any]], in_process_rows: list[dict[str, Any]]) -> dict[str, Any]:
    largest = max(row["batch"] for row in in_process_rows)
    reference = next(row for row in in_process_rows if row["batch"] == largest)["examples_per_second"]
    at_largest = [cell for cell in cells if cell["batch"] == largest]
    fastest = max(at_largest, key=lambda cell: cell["examples_per_second"] or 0.0)
    swap = next((cell for cell in cells if "version_published_halfway" in cell), None)
    return {
        "cells": cells,
        "in_process": in_process_rows,
        "fastest_at_largest_batch": {
            "protocol": fastest["protocol"],
            "clients": fastest["clients"],
            "examples_per_second": fastest["examples_per_second"],
            "share_of_in_process": fastest["examples_per_second"] / reference if reference else None,
        },
        "failed_requests": sum(cell["failed"] for cell in cells),
        "swap": None if swap is None else {"failed": swap["failed"], "versions_seen": swap["versions_seen"]},
    }


def check_targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    share = summary["fastest_at_largest_batch"]["share_of_in_process"] or 0.0
    swap_seen = summary["swap"] is not None and "2" in summary["swap"]["versions_seen"]
    return [
        {
            "key": "serving_share_of_in_process",
            "name": "serving: the fastest protocol's examples/s at the largest batch over the in-process call's",
            "measured": share,
            "target": f">= {TARGET_SHARE}",
            "met": share >= TARGET_SHARE,
        },
        {
            "key": "serving_failed_requests",
            "name": "serving: failed requests, the version swap included (the new version served)",
            "measured": summary["failed_requests"],
            "target": "0, with version 2 seen",
            "met": summary["failed_requests"] == 0 and swap_seen,
        },
    ]


def print_summary(summary: dict[str, Any]) -> None:
    print(
        f"\n{'serving':<10}{'batch':>6}{'clients':>8}{'req/s':>10}{'ex/s':>11}{'p50 ms':>9}{'p99 ms':>9}{'failed':>7}"
    )
    for row in [*summary["in_process"], *summary["cells"]]:
        print(
            f"{row['protocol']:<10}{row['batch']:>6}{row['clients']:>8}{row['requests_per_second'] or 0:>10,.0f}"
            f"{row['examples_per_second'] or 0:>11,.0f}{row['p50_ms'] or 0:>9.2f}{row['p99_ms'] or 0:>9.2f}"
            f"{row['failed']:>7}"
        )
    fastest = summary["fastest_at_largest_batch"]
    print(
        f"fastest at the largest batch: {fastest['protocol']} with {fastest['clients']} clients, "
        f"{(fastest['share_of_in_process'] or 0):.2f}x the in-process examples/s; swap: {summary['swap']}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.serving_load", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    parser.add_argument("--in-process", metavar="SAVED_MODEL", help="only the in-process call; prints JSON")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.in_process:
        batches = counts(args.serving_batches, "--serving-batches")
        print(json.dumps(in_process(args.in_process, batches, args.serving_requests)))
        return 0
    if not available():
        print("the serving room (trainer/serving) is not here: nothing to measure", file=sys.stderr)
        return 2
    with scratch_dir("bench-serving-") as scratch:
        summary = run_serving(args, scratch)
    print_summary(summary)
    print(json.dumps({"targets": check_targets(summary)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
