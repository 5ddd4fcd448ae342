"""`python -m trainer.serving --model-base-path DIR`: serve the highest numbered SavedModel under DIR (make serve)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from trainer.base.errors import ExitCode, UserError

# TensorFlow Serving's ports: REST 8501, gRPC 8500 (make serve passes SERVE_PORT and SERVE_GRPC_PORT).
DEFAULT_REST_PORT, DEFAULT_GRPC_PORT = 8501, 8500
# KServe's own gRPC message limit (MAX_GRPC_MESSAGE_LENGTH), applied to REST bodies too.
DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
# Batching's wait when the model is idle (docs/serving.md, "Many small requests", says how to pick it).
DEFAULT_BATCH_TIMEOUT_MS = 2.0
# The queue's default bound, in batches, as TF Serving's max_enqueued_batches.
DEFAULT_QUEUED_BATCHES = 10


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer.serving", description=__doc__)
    parser.add_argument(
        "--model-base-path", required=True, help="folder of numbered SavedModel versions (a model dir's serving/)"
    )
    parser.add_argument("--model-name", default="model", help="the name in /v1/models/<name> and /v2/models/<name>")
    parser.add_argument("--rest-port", type=int, default=DEFAULT_REST_PORT, help="REST v1 and v2, health, /metrics")
    parser.add_argument("--grpc-port", type=int, default=DEFAULT_GRPC_PORT, help="gRPC v2 (Open Inference Protocol)")
    parser.add_argument(
        "--max-request-bytes",
        type=int,
        default=DEFAULT_MAX_REQUEST_BYTES,
        help="the largest request body (REST) or message (gRPC) accepted; larger ones get 413",
    )
    parser.add_argument("--poll-seconds", type=float, default=1.0, help="how often to look for a new version")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="TensorFlow's intra- and inter-op threads (0: its default, one per core of the machine; in a pod give "
        "its CPU limit, as the cluster's ServingRuntime does)",
    )
    batching = parser.add_argument_group(
        "batching and load shedding",
        "off by default; --max-batch-size turns both on, --max-concurrent-requests alone sheds without batching "
        "(docs/serving.md)",
    )
    batching.add_argument(
        "--max-batch-size",
        type=int,
        default=0,
        help="join concurrent requests into model calls of up to this many examples (0: off, each request its own "
        "call); a larger request runs alone",
    )
    batching.add_argument(
        "--batch-timeout-ms",
        type=float,
        help=f"the longest a request waits for others to join it while the model is idle (default "
        f"{DEFAULT_BATCH_TIMEOUT_MS:g}; 0: join only what arrives while a call runs)",
    )
    batching.add_argument(
        "--max-queued-examples",
        type=int,
        help=f"refuse a new request at once (REST 503, gRPC RESOURCE_EXHAUSTED) past this many waiting examples "
        f"(default {DEFAULT_QUEUED_BATCHES} batches: {DEFAULT_QUEUED_BATCHES} x --max-batch-size)",
    )
    batching.add_argument(
        "--max-concurrent-requests",
        type=int,
        help="refuse a new inference request at once (REST 503, gRPC RESOURCE_EXHAUSTED), before it is decoded, while "
        "this many are in the server, REST and gRPC together (0: no limit; default: none with batching off, else "
        "--max-queued-examples + --max-batch-size, the single-example requests a full queue and a call hold)",
    )
    args = parser.parse_args(argv)
    if args.max_request_bytes < 1 or args.poll_seconds <= 0:
        parser.error("--max-request-bytes must be at least 1 and --poll-seconds above 0")
    if args.threads < 0:
        parser.error(f"--threads must be 0 (TensorFlow's default) or more, got {args.threads}")
    check_batching(parser, args)
    return args


def check_batching(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The batching flags checked together, their defaults filled in when batching is on."""
    if args.max_batch_size < 0:
        parser.error(f"--max-batch-size must be 0 (off) or more, got {args.max_batch_size}")
    if args.max_concurrent_requests is not None and args.max_concurrent_requests < 0:
        parser.error(f"--max-concurrent-requests must be 0 (no limit) or more, got {args.max_concurrent_requests}")
    if args.max_batch_size == 0:
        if args.max_concurrent_requests is None:
            args.max_concurrent_requests = 0
        for flag, value in (
            ("--batch-timeout-ms", args.batch_timeout_ms),
            ("--max-queued-examples", args.max_queued_examples),
        ):
            if value is not None:
                parser.error(f"{flag} applies to batching, which is off: add --max-batch-size N to turn it on")
        return
    if args.batch_timeout_ms is None:
        args.batch_timeout_ms = DEFAULT_BATCH_TIMEOUT_MS
    if not 0 <= args.batch_timeout_ms < float("inf"):
        parser.error(f"--batch-timeout-ms must be 0 or more milliseconds, got {args.batch_timeout_ms}")
    if args.max_queued_examples is None:
        args.max_queued_examples = DEFAULT_QUEUED_BATCHES * args.max_batch_size
    if args.max_queued_examples < args.max_batch_size:
        parser.error(
            f"--max-queued-examples {args.max_queued_examples} is below --max-batch-size {args.max_batch_size}, so "
            f"no batch could fill: set it to at least {args.max_batch_size}"
        )
    if args.max_concurrent_requests is None:
        args.max_concurrent_requests = args.max_queued_examples + args.max_batch_size


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    # kserve parses sys.argv when it is imported; our flags are not its flags.
    sys.argv[1:] = []
    from trainer.reporting import tf_log_filter

    # TensorFlow's lines that are no failure (the trainer drops them too): its start-up's, and its own line for an
    # input a request's refusal names; Python's lines bypass the filter.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    tf_log_filter.install(python_direct=True)
    import tensorflow as tf

    tf.config.list_physical_devices()  # the device set-up, where the CUDA lines come from

    from trainer.serving.batching import BatchingOptions
    from trainer.serving.model import SavedModelVersions
    from trainer.serving.server import serve

    if args.threads:
        # TensorFlow sizes its pools to the machine's cores, not a pod's CPU limit, and is then throttled.
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)

    batching = (
        BatchingOptions(args.max_batch_size, args.batch_timeout_ms / 1000, args.max_queued_examples)
        if args.max_batch_size
        else None
    )

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        serve(
            SavedModelVersions(args.model_name, args.model_base_path, args.poll_seconds, batching),
            args.rest_port,
            args.grpc_port,
            args.max_request_bytes,
            args.max_concurrent_requests,
        )
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return ExitCode.BAD_CONFIG
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
