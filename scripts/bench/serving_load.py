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

Then batching (the server's --max-batch-size): one server with batching off and one per --batching setting
(MAX_BATCH:TIMEOUT_MS), all running at once, measured interleaved, cell by cell (the order flipped every other cell,
so a drift in the machine's load falls on both): batch-1 requests from each --batching-clients count, over both
protocols; reported with the mean batch the server formed (its /metrics). Last, load shedding: --shed-clients clients,
over gRPC and then REST, against a server whose queue holds --shed-queue-limit examples (and so, by default, admits
that many requests plus a batch: --max-concurrent-requests), reporting how fast the shed requests were answered,
whether any admitted request failed, and the server's memory before and after. The batching and shedding cells'
load comes from ghz (gRPC) and hey (REST), Go programs on one core each, so that the clients take little of the
server's CPU (scripts/bench/load_tools.py; `make bench-tools` installs them, and the bench refuses to start without
them, saying how); the cells above keep the Python client, which reads each answer's version across the swap.

Run alone (make bench-serving); with tiny counts: python -m scripts.bench.serving_load --serving-requests 8
--serving-clients 1,2 --batching-requests 8 --batching-clients 1,2 --shed-clients 4 --shed-requests 16
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

from . import load_tools
from .runs import BenchError, clean_environment, log_tail, scratch_dir

PROTOCOLS = ("v1_json", "grpc_v2")
# At the largest batch, the fastest protocol serves at least this share of the in-process examples/s.
TARGET_SHARE = 0.5
# Batching's targets (issue 35): at this many clients gRPC v2 serves this many times the requests/s of batching off,
# with a p99 no worse; at one client its p50 is at most the batch timeout above batching off's; shed requests are
# answered within this many milliseconds.
SPEEDUP_CLIENTS, TARGET_SPEEDUP = 32, 3.0
TARGET_SHED_MS = 10.0
IMAGE_SHAPE = (28, 28, 1)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("serving phase (the model server under load, against the in-process call)")
    group.add_argument("--no-serving", action="store_true", help="skip the serving phase")
    group.add_argument("--serving-requests", type=int, default=400, help="requests per cell (protocol, batch, clients)")
    group.add_argument("--serving-clients", default="1,8,32", help="concurrent clients, comma-separated")
    group.add_argument("--serving-batches", default="1,32", help="examples per request, comma-separated")
    group.add_argument(
        "--batching",
        default="32:2,32:0",
        help="batching settings measured against batching off, MAX_BATCH:TIMEOUT_MS, comma-separated",
    )
    group.add_argument("--batching-clients", default="1,8,32,128", help="concurrent clients in the batching cells")
    group.add_argument("--batching-requests", type=int, default=1000, help="batch-1 requests per batching cell")
    group.add_argument("--shed-clients", type=int, default=128, help="concurrent clients in the shedding cells")
    group.add_argument("--shed-queue-limit", type=int, default=32, help="the shedding server's --max-queued-examples")
    group.add_argument(
        "--shed-requests", type=int, default=4000, help="requests in each shedding cell (gRPC, REST), shed included"
    )


def counts(text: str, flag: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise BenchError(f"{flag} must be positive integers separated by commas, got {text!r}")
    return values


def batching_settings(text: str) -> list[tuple[int, float]]:
    settings = []
    for part in filter(None, text.split(",")):
        size, _, timeout = part.partition(":")
        try:
            settings.append((int(size), float(timeout or 0)))
        except ValueError:
            raise BenchError(f"--batching takes MAX_BATCH:TIMEOUT_MS pairs separated by commas, got {text!r}") from None
    if not settings or min(size for size, _ in settings) < 1:
        raise BenchError(f"--batching needs at least one MAX_BATCH:TIMEOUT_MS with MAX_BATCH >= 1, got {text!r}")
    return settings


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
    shed: list[float] = []  # the latencies of requests the server refused for a full queue
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
                    if response.status_code == 503 and "retry-after" in response.headers:
                        shed.append(time.perf_counter() - started)
                        continue
                    if response.status_code != 200:
                        failures.append(f"{response.status_code} {response.text[:200]}")
                        continue
                    version = "n/a"
                else:
                    reply = await stub.ModelInfer(grpc_request, timeout=60)
                    version = reply.model_version
            except grpc.RpcError as error:
                if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    shed.append(time.perf_counter() - started)
                else:
                    failures.append(repr(error)[:200])
                continue
            except httpx.HTTPError as error:
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
    cell = summarize_cell(protocol, batch, clients, latencies, failures, versions, elapsed)
    if shed:
        cell.update(
            requests=cell["requests"] + len(shed),
            shed=len(shed),
            shed_p50_ms=quantile(sorted(shed), 0.50),
            shed_p99_ms=quantile(sorted(shed), 0.99),
            shed_max_ms=1000 * max(shed),
        )
    return cell


def quantile(ordered: list[float], share: float) -> float | None:
    """The share-quantile of sorted seconds, in milliseconds."""
    return 1000 * ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else None


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
    return {
        "protocol": protocol,
        "batch": batch,
        "clients": clients,
        "requests": len(latencies) + len(failures),
        "failed": len(failures),
        "failures": failures[:5],
        "requests_per_second": len(latencies) / elapsed if elapsed else None,
        "examples_per_second": batch * len(latencies) / elapsed if elapsed else None,
        "p50_ms": quantile(ordered, 0.50),
        "p99_ms": quantile(ordered, 0.99),
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


def start_server(
    base_path: pathlib.Path,
    log: pathlib.Path,
    timeout: float,
    flags: list[str] | None = None,
    root: pathlib.Path = ROOT,
) -> tuple[subprocess.Popen, str, str]:
    """The model server as a process, ready; root: the checkout whose trainer/serving runs (another revision's)."""
    import httpx

    rest, grpc_port = free_ports(2)
    command = [sys.executable, "-m", "trainer.serving", "--model-base-path", str(base_path), "--model-name", "bench"]
    command += ["--rest-port", str(rest), "--grpc-port", str(grpc_port), "--poll-seconds", "0.5", *(flags or [])]
    with log.open("w") as out:
        server = subprocess.Popen(command, cwd=root, env=clean_environment(), stdout=out, stderr=subprocess.STDOUT)
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
    tools = load_tools.require()  # before anything is trained: a missing tool is named at once, with its fix
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
        stop_server(server)
    batching = run_batching(args, base_path, scratch, tools)
    return summarize(cells, in_process_rows, batching)


def stop_server(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()


def batch_counts(url: str) -> tuple[float, float]:
    """(examples, model calls) the server's batcher has made so far, from its /metrics."""
    import httpx

    samples = dict(
        line.rsplit(" ", 1) for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines() if line[:1] != "#"
    )
    return float(samples.get("serving_batch_examples_sum", 0)), float(samples.get("serving_batch_examples_count", 0))


def memory_mb(server: subprocess.Popen) -> dict[str, float]:
    """The server's resident memory now and at its peak (Linux /proc), in MiB."""
    try:
        status = pathlib.Path(f"/proc/{server.pid}/status").read_text()
    except OSError:
        return {}
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {key: int(fields[key].split()[0]) / 1024 for key in ("VmRSS", "VmHWM") if key in fields}


def request_files(scratch: pathlib.Path) -> dict[str, pathlib.Path]:
    """What the load generators send: one image as a serialized gRPC v2 request with its schema (a protoset, from
    KServe's own descriptor), and as a REST v1 body."""
    from google.protobuf import descriptor_pb2
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

    images = image_batch(1)
    tensor = pb.ModelInferRequest.InferInputTensor(name="images", datatype="UINT8", shape=list(images.shape))
    request = pb.ModelInferRequest(model_name="bench", inputs=[tensor], raw_input_contents=[images.tobytes()])
    protoset = descriptor_pb2.FileDescriptorSet(
        file=[descriptor_pb2.FileDescriptorProto.FromString(pb.DESCRIPTOR.serialized_pb)]
    )
    files = {
        "protoset": scratch / "grpc_predict_v2.protoset",
        "grpc": scratch / "request.bin",
        "v1": scratch / "v1.json",
    }
    files["protoset"].write_bytes(protoset.SerializeToString())
    files["grpc"].write_bytes(request.SerializeToString())
    files["v1"].write_text(json.dumps({"instances": images.tolist()}))
    return files


def tool_cell(
    tools: dict[str, pathlib.Path],
    files: dict[str, pathlib.Path],
    protocol: str,
    url: str,
    target: str,
    clients: int,
    requests: int,
) -> dict[str, Any]:
    """One batch-1 cell from ghz (gRPC v2) or hey (REST v1)."""
    if protocol == "grpc_v2":
        return load_tools.ghz_cell(tools["ghz"], target, files["protoset"], files["grpc"], clients, requests)
    return load_tools.hey_cell(tools["hey"], f"{url}/v1/models/bench:predict", files["v1"], clients, requests)


def run_batching(
    args: argparse.Namespace, base_path: pathlib.Path, scratch: pathlib.Path, tools: dict[str, pathlib.Path]
) -> dict[str, Any]:
    """Batch-1 requests against batching off and each --batching setting, interleaved cell by cell; then shedding."""
    settings = batching_settings(args.batching)
    files = request_files(scratch)
    client_counts = counts(args.batching_clients, "--batching-clients")
    modes: dict[str, list[str]] = {"off": []}
    for size, timeout_ms in settings:
        modes[f"on {size}:{timeout_ms:g}"] = ["--max-batch-size", str(size), "--batch-timeout-ms", f"{timeout_ms:g}"]
    servers: dict[str, tuple[subprocess.Popen, str, str]] = {}
    cells = []
    try:
        for mode, flags in modes.items():
            log = scratch / f"server-{mode.replace(' ', '-').replace(':', '-')}.log"
            servers[mode] = start_server(base_path, log, args.timeout, flags)
        step = 0
        for protocol in PROTOCOLS:
            for clients in client_counts:
                order = list(modes) if step % 2 == 0 else list(reversed(modes))
                step += 1
                for mode in order:
                    _, url, target = servers[mode]
                    print(f"[serving] batching {mode}, {protocol}, {clients} client(s) ...", flush=True)
                    examples, calls = batch_counts(url)
                    cell = tool_cell(tools, files, protocol, url, target, clients, args.batching_requests)
                    examples_after, calls_after = batch_counts(url)
                    made = calls_after - calls
                    cell["mode"] = mode
                    cell["mean_batch"] = (examples_after - examples) / made if made else 1.0
                    cells.append(cell)
    finally:
        for server, _, _ in servers.values():
            stop_server(server)
    size, timeout_ms = settings[0]
    flags = ["--max-batch-size", str(size), "--batch-timeout-ms", f"{timeout_ms:g}"]
    flags += ["--max-queued-examples", str(args.shed_queue_limit)]
    server, url, target = start_server(base_path, scratch / "server-shed.log", args.timeout, flags)
    mode = f"on {size}:{timeout_ms:g}, queue {args.shed_queue_limit}, {args.shed_queue_limit + size} requests"
    shedding = []
    try:
        for protocol in ("grpc_v2", "v1_json"):
            print(f"[serving] shedding: {args.shed_clients} {protocol} clients, {mode} ...", flush=True)
            before = memory_mb(server)
            shed = tool_cell(tools, files, protocol, url, target, args.shed_clients, args.shed_requests)
            shed.update(mode=mode, memory_before_mb=before, memory_after_mb=memory_mb(server))
            shedding.append(shed)
    finally:
        stop_server(server)
    return {
        "settings": list(modes),
        "cells": cells,
        "shedding": shedding[0],
        "shedding_rest": shedding[1],
        "timeout_ms": timeout_ms,
    }


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


def summarize(
    cells: list[dict[str, Any]], in_process_rows: list[dict[str, Any]], batching: dict[str, Any] | None = None
) -> dict[str, Any]:
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
        "batching": batching,
    }


def batching_cell(batching: dict[str, Any], mode: str, protocol: str, clients: int) -> dict[str, Any] | None:
    return next(
        (
            cell
            for cell in batching["cells"]
            if (cell["mode"], cell["protocol"], cell["clients"]) == (mode, protocol, clients)
        ),
        None,
    )


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
        *batching_targets(summary.get("batching")),
    ]


def batching_targets(batching: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The first batching setting against batching off: the speed-up at SPEEDUP_CLIENTS, the cost at one client,
    and the shedding cell."""
    if not batching:
        return []
    on = batching["settings"][1]
    targets = []
    off_cell = batching_cell(batching, "off", "grpc_v2", SPEEDUP_CLIENTS)
    on_cell = batching_cell(batching, on, "grpc_v2", SPEEDUP_CLIENTS)
    if off_cell and on_cell:
        speedup = (on_cell["requests_per_second"] or 0.0) / (off_cell["requests_per_second"] or float("inf"))
        p99_held = (on_cell["p99_ms"] or float("inf")) <= (off_cell["p99_ms"] or 0.0)
        targets.append(
            {
                "key": "serving_batching_speedup",
                "name": f"serving: gRPC v2 batch-1 requests/s at {SPEEDUP_CLIENTS} clients, batching {on} over off "
                f"(p99 on {on_cell['p99_ms'] or 0:.1f} ms, off {off_cell['p99_ms'] or 0:.1f} ms)",
                "measured": speedup,
                "target": f">= {TARGET_SPEEDUP}, p99 no worse",
                "met": speedup >= TARGET_SPEEDUP and p99_held,
            }
        )
    for protocol in PROTOCOLS:
        off_cell, on_cell = batching_cell(batching, "off", protocol, 1), batching_cell(batching, on, protocol, 1)
        if off_cell and on_cell:
            added = (on_cell["p50_ms"] or float("inf")) - (off_cell["p50_ms"] or 0.0)
            targets.append(
                {
                    "key": f"serving_batching_one_client_{protocol}",
                    "name": f"serving: {protocol} p50 at one client, batching {on} minus off (ms)",
                    "measured": added,
                    "target": f"<= {batching['timeout_ms']:g} (the batch timeout)",
                    "met": added <= batching["timeout_ms"],
                }
            )
    for key, shed in (
        ("serving_shed_answer", batching["shedding"]),
        ("serving_shed_answer_rest", batching.get("shedding_rest")),
    ):
        if not shed:
            continue
        shed_p99 = shed.get("shed_p99_ms")
        targets.append(
            {
                "key": key,
                "name": f"serving: {shed['protocol']} p99 of the shed answers at {shed['clients']} clients (ms; "
                f"{shed.get('shed', 0)} shed, {shed['failed']} admitted requests failed)",
                "measured": shed_p99,
                "target": f"<= {TARGET_SHED_MS:g}, with requests shed and none admitted failing",
                "met": shed_p99 is not None and shed_p99 <= TARGET_SHED_MS and shed["failed"] == 0,
            }
        )
    return targets


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
    batching = summary.get("batching")
    if not batching:
        return
    header = f"{'batching':<12}{'protocol':<10}{'clients':>8}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
    print(f"\n{header}{'batch':>7}{'failed':>7}")
    for row in batching["cells"]:
        print(
            f"{row['mode']:<12}{row['protocol']:<10}{row['clients']:>8}{row['requests_per_second'] or 0:>9,.0f}"
            f"{row['p50_ms'] or 0:>9.2f}{row['p99_ms'] or 0:>9.2f}{row['mean_batch']:>7.1f}{row['failed']:>7}"
        )
    for shed in (batching["shedding"], batching.get("shedding_rest")):
        if not shed:
            continue
        print(
            f"shedding ({shed['mode']}, {shed['clients']} {shed['protocol']} clients): {shed.get('shed', 0)} of "
            f"{shed['requests']} shed, answered in p50 {shed.get('shed_p50_ms') or 0:.2f} / p99 "
            f"{shed.get('shed_p99_ms') or 0:.2f} / max {shed.get('shed_max_ms') or 0:.2f} ms; admitted "
            f"{shed['requests_per_second'] or 0:,.0f} req/s, p50 {shed['p50_ms'] or 0:.1f} ms, p99 "
            f"{shed['p99_ms'] or 0:.1f} ms, {shed['failed']} failed; server memory {shed['memory_before_mb']} -> "
            f"{shed['memory_after_mb']} MiB"
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
