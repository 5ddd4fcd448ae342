"""The serving bench's load generators: ghz (gRPC) and hey (HTTP), two Go programs, so that the load takes little of
the server's CPU (the Python clients took as much per request as the server: 0.65 ms per gRPC request and 4.8 ms per
REST one, against ghz's 0.17 to 0.31 and hey's 0.2, measured here). Each runs on one core (GOMAXPROCS 1).

Pinned in scripts/bench/settings.env (BENCH_GHZ_VERSION and BENCH_GHZ_MODULE_SHA256, BENCH_HEY_VERSION and
BENCH_HEY_MODULE_SHA256: the module's version and its go.sum hash, h1:, in hex) and installed into the venv's bin by
`make bench-tools` (`python -m scripts.bench.load_tools --install`): `go install MODULE/CMD@VERSION`, which checks the
module against the Go checksum database, and then the binary's own record of the module it was built from
(`go version -m`) must name the pinned version and hash, or the bench refuses to run it. Each cell's per-request
latencies and outcomes come from the tool's own report (ghz's JSON details, hey's CSV).
"""

from __future__ import annotations

import argparse
import base64
import csv
import dataclasses
import io
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
from typing import Any

from scripts.common import settings as project_settings

from .runs import BenchError


@dataclasses.dataclass(frozen=True)
class Tool:
    name: str
    module: str
    package: str
    setting: str  # BENCH_<NAME>: its _VERSION and _MODULE_SHA256 settings

    def pin(self, settings: dict[str, str]) -> tuple[str, str]:
        """(the module's version, its go.sum hash as go writes it: h1: and the sha256 in base64)"""
        digest = bytes.fromhex(settings[f"{self.setting}_MODULE_SHA256"])
        return settings[f"{self.setting}_VERSION"], f"h1:{base64.b64encode(digest).decode()}"


TOOLS = (
    Tool("ghz", "github.com/bojand/ghz", "github.com/bojand/ghz/cmd/ghz", "BENCH_GHZ"),
    Tool("hey", "github.com/rakyll/hey", "github.com/rakyll/hey", "BENCH_HEY"),
)
BIN = pathlib.Path(sys.prefix) / "bin"  # the venv's


def path_of(tool: Tool) -> pathlib.Path:
    return BIN / tool.name


def install_line(tool: Tool, settings: dict[str, str]) -> str:
    return f"GOBIN={BIN} go install {tool.package}@{tool.pin(settings)[0]}"


def problem(tool: Tool, settings: dict[str, str]) -> str | None:
    """Why the tool cannot be used as pinned (missing, no go to check it, another build), or None."""
    version, module_sum = tool.pin(settings)
    fix = f"run `make bench-tools` (Go 1.24 or later: {install_line(tool, settings)})"
    path = path_of(tool)
    if not path.exists():
        return f"{tool.name} {version} is not installed at {path}: {fix}"
    go = shutil.which("go")
    if go is None:
        return f"go is not on PATH, so {path} cannot be checked against its pin ({tool.module} {version}): install Go"
    done = subprocess.run([go, "version", "-m", str(path)], capture_output=True, text=True, timeout=60)
    built = [line.split("\t")[2:] for line in done.stdout.splitlines() if line.startswith("\tmod\t")]
    if built != [[tool.module, version, module_sum]]:
        error = done.stderr.strip()[:200]
        found = " ".join(built[0]) if built else "no module record" + (f" ({error})" if error else "")
        return f"{path} was built from {found}, not {tool.module} {version} {module_sum}: {fix}"
    return None


def require(settings: dict[str, str] | None = None) -> dict[str, pathlib.Path]:
    """Each tool's path once checked against its pin; BenchError naming every problem and its fix otherwise."""
    settings = settings or project_settings.load()
    problems = [found for tool in TOOLS if (found := problem(tool, settings))]
    if problems:
        raise BenchError("the serving bench's load generators:\n  " + "\n  ".join(problems))
    return {tool.name: path_of(tool) for tool in TOOLS}


def install(settings: dict[str, str]) -> None:
    if shutil.which("go") is None:
        raise BenchError("installing ghz and hey needs Go 1.24 or later on PATH (go install)")
    for tool in TOOLS:
        if problem(tool, settings) is None:
            continue
        print(f"[bench-tools] {install_line(tool, settings)}", flush=True)
        environment = {**os.environ, "GOBIN": str(BIN), "GOFLAGS": "-trimpath"}
        subprocess.run(["go", "install", f"{tool.package}@{tool.pin(settings)[0]}"], env=environment, check=True)
        found = problem(tool, settings)
        if found:
            raise BenchError(found)
    print(f"[bench-tools] {', '.join(f'{tool.name} {tool.pin(settings)[0]}' for tool in TOOLS)} in {BIN}, checked")


# ---- one cell -----------------------------------------------------------------------------------------


def quantile(ordered: list[float], share: float) -> float | None:
    """The share-quantile of sorted seconds, in milliseconds."""
    return 1000 * ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else None


def summary(
    protocol: str, clients: int, latencies: list[float], shed: list[float], failures: list[str], elapsed: float
) -> dict[str, Any]:
    """A batch-1 cell as the bench reports it (the Python client's cells have the same keys)."""
    ordered = sorted(latencies)
    cell: dict[str, Any] = {
        "protocol": protocol,
        "batch": 1,
        "clients": clients,
        "requests": len(latencies) + len(shed) + len(failures),
        "failed": len(failures),
        "failures": failures[:5],
        "requests_per_second": len(latencies) / elapsed if elapsed else None,
        "examples_per_second": len(latencies) / elapsed if elapsed else None,
        "p50_ms": quantile(ordered, 0.50),
        "p99_ms": quantile(ordered, 0.99),
        "seconds": elapsed,
        "load_generator": "ghz" if protocol == "grpc_v2" else "hey",
    }
    if shed:
        ordered_shed = sorted(shed)
        cell.update(
            shed=len(shed),
            shed_p50_ms=quantile(ordered_shed, 0.50),
            shed_p99_ms=quantile(ordered_shed, 0.99),
            shed_max_ms=1000 * ordered_shed[-1],
        )
    return cell


def by_outcome(
    calls: list[tuple[float, str, str]], answered: str, refused: str
) -> tuple[list[float], list[float], list[str]]:
    """Each call's (seconds, status, failure) sorted into the answered calls' latencies, the shed calls' latencies
    and the other calls' failures, as both load generators report them."""
    latencies, shed, failures = [], [], []
    for seconds, status, failure in calls:
        if status == answered:
            latencies.append(seconds)
        elif status == refused:
            shed.append(seconds)
        else:
            failures.append(failure)
    return latencies, shed, failures


def ghz_cell(
    ghz: pathlib.Path, target: str, protoset: pathlib.Path, message: pathlib.Path, clients: int, requests: int
) -> dict[str, Any]:
    """`requests` gRPC v2 ModelInfer calls of one serialized request from `clients` concurrent workers on one
    connection; RESOURCE_EXHAUSTED is a shed request, any other status a failure."""
    command = [
        str(ghz),
        "--insecure",
        "--protoset",
        str(protoset),
        "--call",
        "inference.GRPCInferenceService/ModelInfer",
    ]
    command += ["--binary-file", str(message), "--concurrency", str(clients), "--total", str(requests)]
    command += ["--cpus", "1", "--timeout", "60s", "--format", "json", target]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise BenchError(f"ghz failed (exit {done.returncode}): {done.stderr[-2000:] or done.stdout[-2000:]}") from None
    calls = [
        (call["latency"] / 1e9, call["status"], f"{call['status']}: {call.get('error', '')[:200]}")
        for call in report.get("details") or []
    ]
    latencies, shed, failures = by_outcome(calls, answered="OK", refused="ResourceExhausted")
    return summary("grpc_v2", clients, latencies, shed, failures, report["total"] / 1e9)


def hey_cell(hey: pathlib.Path, url: str, body: pathlib.Path, clients: int, requests: int) -> dict[str, Any]:
    """About `requests` REST v1 predict requests (hey sends a whole number per client) from `clients` connections;
    503 (the server's refusal, with Retry-After) is a shed request, another status or a lost request a failure."""
    per_client = max(1, -(-requests // clients))
    command = [str(hey), "-n", str(per_client * clients), "-c", str(clients), "-m", "POST", "-T", "application/json"]
    command += ["-D", str(body), "-t", "60", "-cpus", "1", "-o", "csv", url]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise BenchError(f"hey failed (exit {done.returncode}): {done.stderr[-2000:]}")
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    calls = [(float(row["response-time"]), row["status-code"], f"HTTP {row['status-code']}") for row in rows]
    latencies, shed, failures = by_outcome(calls, answered="200", refused="503")
    end = max((float(row["offset"]) + float(row["response-time"]) for row in rows), default=0.0)
    # hey leaves out of its CSV the requests that got no answer (a refused or broken connection).
    failures += ["no answer (connection error)"] * (per_client * clients - len(rows))
    return summary("v1_json", clients, latencies, shed, failures, end or time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.load_tools", description=__doc__.split("\n\n")[0])
    parser.add_argument("--install", action="store_true", help="install what is missing or not the pinned build")
    args = parser.parse_args(argv)
    settings = project_settings.load()
    try:
        if args.install:
            install(settings)
        else:
            require(settings)
            print("ghz and hey are installed as pinned")
    except (BenchError, subprocess.CalledProcessError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
