"""What a gRPC server in Python does on this machine with no model and no KServe behind it (the floor), against the
project's model server with batching off and on: `python -m scripts.bench.grpc_floor` (make bench-floor).

The floor is grpcio's asyncio server on uvloop, with the heap frozen as the model server's, serving KServe's own
GRPCInferenceService descriptor: its ModelInfer answers every request with one fixed ten-score response, without
reading the tensor. So its requests/s are the most any server built on Python's gRPC serves here, and its refusals the
fastest a shed answer comes: with --limit N, a call past N in the handler at once is refused with RESOURCE_EXHAUSTED
(one comparison, as the model server's admission), and an admitted call holds its place --hold-ms, asleep (no CPU),
as a model call would.

With --baseline-rev REV, that revision's model server (batching off, from a git worktree of it) is measured beside
them: the server before a change, in the same run, since a figure here means something only against another taken
with it.

Every cell is batch-1 gRPC v2 from ghz (make bench-tools), 1,000 requests unless told, the servers up at once and
measured interleaved cell by cell (the order flipped every other cell). Then shedding: the floor and the model server
(batching on, the queue of the serving bench's shedding cell) each take --shed-clients clients.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import pathlib
import subprocess
import sys
import time
from typing import Any

from scripts.common.ports import free_ports
from scripts.common.settings import ROOT

from . import load_tools, serving_load
from .runs import BenchError, clean_environment, log_tail, scratch_dir

# The model server is measured off and on, as the serving bench's first batching setting (MAX_BATCH:TIMEOUT_MS).
BATCH_TIMEOUT_MS = 2


# ---- the floor server (a process of its own) ------------------------------------------------------------------------


async def serve_floor(port: int, limit: int, hold_s: float) -> None:
    import grpc
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as pb_grpc

    output = pb.ModelInferResponse.InferOutputTensor(name="scores", datatype="FP32", shape=[1, 10])
    answer = pb.ModelInferResponse(model_name="bench", outputs=[output], raw_output_contents=[bytes(40)])
    in_flight = 0

    class Floor(pb_grpc.GRPCInferenceServiceServicer):
        async def ModelInfer(self, request: Any, context: Any) -> Any:  # noqa: N802 (the service's method name)
            nonlocal in_flight
            if limit and in_flight >= limit:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"the floor holds {limit} calls at once")
            in_flight += 1
            try:
                if hold_s:
                    await asyncio.sleep(hold_s)
                return answer
            finally:
                in_flight -= 1

    server = grpc.aio.server()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(Floor(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    gc.freeze()
    print(f"floor serving on {port}", flush=True)
    await server.wait_for_termination()


def start_floor(port: int, log: pathlib.Path, limit: int = 0, hold_ms: float = 0.0) -> subprocess.Popen:
    command = [sys.executable, "-m", "scripts.bench.grpc_floor", "--serve", str(port)]
    command += ["--limit", str(limit), "--hold-ms", str(hold_ms)]
    with log.open("w") as out:
        floor = subprocess.Popen(command, cwd=ROOT, env=clean_environment(), stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if floor.poll() is not None:
            raise BenchError(f"the floor server exited {floor.returncode}:\n{log_tail(log)}")
        if "floor serving" in log.read_text():
            return floor
        time.sleep(0.2)
    floor.kill()
    raise BenchError(f"the floor server did not start in 60 s:\n{log_tail(log)}")


# ---- the bench ------------------------------------------------------------------------------------------------------


def is_commit(revision: str) -> bool:
    command = ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"]
    done = subprocess.run(command, capture_output=True)
    return done.returncode == 0


def baseline_worktree(revision: str, path: pathlib.Path) -> None:
    """A detached git worktree of this repository at revision (removed by remove_worktree)."""
    done = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), revision], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise BenchError(
            f"--baseline-rev {revision}: git could not check it out ({done.stderr.strip()}); give a commit, tag or "
            f"branch of this repository (git log --oneline)"
        )


def remove_worktree(path: pathlib.Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], capture_output=True)


def run(args: argparse.Namespace, scratch: pathlib.Path) -> dict[str, Any]:
    tools = load_tools.require()
    print("[floor] training the served model ...", flush=True)
    base_path = serving_load.train_model(scratch, args.timeout)
    files = serving_load.request_files(scratch)

    def ghz(target: str, clients: int, requests: int) -> dict[str, Any]:
        return load_tools.ghz_cell(tools["ghz"], target, files["protoset"], files["grpc"], clients, requests)

    batching_on = ["--max-batch-size", str(args.batch_size), "--batch-timeout-ms", str(BATCH_TIMEOUT_MS)]
    servers = [("off", [], ROOT), (f"on {args.batch_size}:{BATCH_TIMEOUT_MS}", batching_on, ROOT)]
    worktree = scratch / "baseline"
    if args.baseline_rev:
        baseline_worktree(args.baseline_rev, worktree)
        servers.insert(0, (f"{args.baseline_rev} off", [], worktree))
    processes: list[subprocess.Popen] = []
    try:
        (floor_port,) = free_ports(1)
        processes.append(start_floor(floor_port, scratch / "floor.log"))
        targets = {"floor": f"127.0.0.1:{floor_port}"}
        for number, (mode, flags, root) in enumerate(servers):
            log = scratch / f"server-{number}.log"
            server, _, target = serving_load.start_server(base_path, log, args.timeout, flags, root)
            processes.append(server)
            targets[mode] = target
        cells = []
        for step, clients in enumerate(serving_load.counts(args.clients, "--clients")):
            order = list(targets) if step % 2 == 0 else list(reversed(targets))
            for mode in order:
                print(f"[floor] {mode}, {clients} client(s) ...", flush=True)
                cells.append({"mode": mode, **ghz(targets[mode], clients, args.requests)})
    finally:
        for process in processes:
            serving_load.stop_server(process)
        if args.baseline_rev:
            remove_worktree(worktree)

    # The model server's admission limit by default: a full queue of single-example requests and a batch.
    limit = args.shed_queue_limit + args.batch_size
    shedding = []
    flags = [*batching_on, "--max-queued-examples", str(args.shed_queue_limit)]
    server, _, target = serving_load.start_server(base_path, scratch / "shed.log", args.timeout, flags)
    (floor_port,) = free_ports(1)
    floor = start_floor(floor_port, scratch / "floor-shed.log", limit, args.hold_ms)
    try:
        for mode, where in (("model server", target), (f"floor, hold {args.hold_ms:g} ms", f"127.0.0.1:{floor_port}")):
            print(f"[floor] shedding: {args.shed_clients} clients against the {mode}, limit {limit} ...", flush=True)
            shedding.append({"mode": f"{mode}, limit {limit}", **ghz(where, args.shed_clients, args.shed_requests)})
    finally:
        serving_load.stop_server(server)
        serving_load.stop_server(floor)
    return {"cells": cells, "shedding": shedding}


def print_report(report: dict[str, Any]) -> None:
    width = max(12, *(len(row["mode"]) + 1 for row in report["cells"]))
    print(f"\n{'server':<{width}}{'clients':>8}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'failed':>7}")
    for row in report["cells"]:
        print(
            f"{row['mode']:<{width}}{row['clients']:>8}{row['requests_per_second'] or 0:>9,.0f}"
            f"{row['p50_ms'] or 0:>9.2f}{row['p99_ms'] or 0:>9.2f}{row['failed']:>7}"
        )
    for shed in report["shedding"]:
        print(
            f"shedding ({shed['mode']}, {shed['clients']} clients): {shed.get('shed', 0)} of {shed['requests']} shed, "
            f"answered in p50 {shed.get('shed_p50_ms') or 0:.2f} / p99 {shed.get('shed_p99_ms') or 0:.2f} ms; "
            f"admitted {shed['requests_per_second'] or 0:,.0f} req/s, p99 {shed['p99_ms'] or 0:.1f} ms, "
            f"{shed['failed']} failed"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.grpc_floor", description=__doc__)
    parser.add_argument("--clients", default="1,32,128", help="concurrent clients per cell, comma-separated")
    parser.add_argument("--requests", type=int, default=1000, help="requests per cell")
    parser.add_argument("--batch-size", type=int, default=32, help="the model server's --max-batch-size when on")
    parser.add_argument("--shed-clients", type=int, default=128)
    parser.add_argument("--shed-queue-limit", type=int, default=32, help="the model server's --max-queued-examples")
    parser.add_argument("--shed-requests", type=int, default=4000)
    parser.add_argument("--hold-ms", type=float, default=30.0, help="how long the floor's admitted calls hold a place")
    parser.add_argument(
        "--baseline-rev", metavar="REV", help="also measure this git revision's model server, batching off"
    )
    parser.add_argument("--timeout", type=float, default=600, help="seconds to train and to start each server")
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--limit", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.baseline_rev and not is_commit(args.baseline_rev):
        parser.error(
            f"--baseline-rev {args.baseline_rev} is not a commit of this repository: give a commit, tag or branch "
            f"(git log --oneline)"
        )
    if args.serve:
        # uvloop, as the model server runs on (its room is not imported here: the bench only starts it).
        try:
            import uvloop

            loop_factory = uvloop.new_event_loop
        except ImportError:
            loop_factory = None
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(serve_floor(args.serve, args.limit, args.hold_ms / 1000))
        return 0
    with scratch_dir("grpc-floor-") as scratch:
        print_report(run(args, scratch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
