"""`python -m trainer.serving --model-base-path DIR`: serve the highest numbered SavedModel under DIR (make serve)."""

from __future__ import annotations

import argparse
import logging
import sys

from trainer.base.errors import ExitCode, UserError

# TensorFlow Serving's ports: REST 8501, gRPC 8500 (make serve passes SERVE_PORT and SERVE_GRPC_PORT).
DEFAULT_REST_PORT, DEFAULT_GRPC_PORT = 8501, 8500
# KServe's own gRPC message limit (MAX_GRPC_MESSAGE_LENGTH), applied to REST bodies too.
DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024


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
    args = parser.parse_args(argv)
    if args.max_request_bytes < 1 or args.poll_seconds <= 0:
        parser.error("--max-request-bytes must be at least 1 and --poll-seconds above 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    # kserve parses sys.argv when it is imported; our flags are not its flags.
    sys.argv[1:] = []
    from trainer.serving.model import SavedModelVersions
    from trainer.serving.server import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        serve(
            SavedModelVersions(args.model_name, args.model_base_path, args.poll_seconds),
            args.rest_port,
            args.grpc_port,
            args.max_request_bytes,
        )
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return ExitCode.BAD_CONFIG
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
