"""make pipeline's last step: serve the published base path, send it one request, print the answer, stop.

The request is built from the served model's own v2 metadata (its inputs' names, dtypes and shapes): one example
of zeros in TF Serving's row form, so it works for any task. `make serve SERVE_FROM=<base path>` keeps serving.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import signal
import subprocess
import sys
import time

import httpx
import numpy as np

from scripts.common.settings import ROOT


def zeros_request(metadata: dict) -> dict:
    """One example of zeros per input, in TF Serving's row form."""

    def example(tensor: dict) -> list:
        shape = [1 if size == -1 else size for size in tensor["shape"][1:]]
        dtype = {"FP32": np.float32, "FP64": np.float64, "UINT8": np.uint8, "INT32": np.int32, "INT64": np.int64}
        return np.zeros(shape, dtype.get(tensor["datatype"], np.float32)).tolist()

    inputs = metadata["inputs"]
    if len(inputs) == 1:
        return {"instances": [example(inputs[0])]}
    return {"instances": [{tensor["name"]: example(tensor) for tensor in inputs}]}


def wait_ready(server: subprocess.Popen, url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"serve_once: the model server exited {server.returncode} before it was ready")
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"serve_once: the model server was not ready in {timeout:g} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-path", required=True)
    parser.add_argument("--model-name", required=True)
    parser.add_argument("--rest-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=180)
    args = parser.parse_args(argv)
    url = f"http://127.0.0.1:{args.rest_port}"
    command = [sys.executable, "-m", "trainer.serving", "--model-base-path", args.base_path]
    command += ["--model-name", args.model_name, "--rest-port", str(args.rest_port), "--grpc-port", str(args.grpc_port)]
    log = pathlib.Path(args.base_path).resolve().parent / "serve_once.log"
    with log.open("w") as out:
        server = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_ready(server, url, args.timeout)
        metadata = httpx.get(f"{url}/v2/models/{args.model_name}", timeout=30).json()
        request = zeros_request(metadata)
        answer = httpx.post(f"{url}/v1/models/{args.model_name}:predict", json=request, timeout=60)
        print(
            f"POST {url}/v1/models/{args.model_name}:predict (version {metadata['versions'][0]}, one example of zeros)"
        )
        print(json.dumps(answer.json())[:2000])
        print(f"keep serving it: make serve SERVE_FROM={args.base_path} SERVE_MODEL={args.model_name}")
        return 0 if answer.status_code == 200 else 1
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        if server.returncode not in (0, -signal.SIGTERM):
            print(
                f"the model server exited {server.returncode}; its log: {log}\n{log.read_text()[-3000:]}",
                file=sys.stderr,
            )


if __name__ == "__main__":
    sys.exit(main())
