"""Picture files to the served model: the answers over REST v1, REST v2 and gRPC against the SavedModel called in
process, and REST v1 requests/s for a file (`{"b64": ...}`) against the same picture as a pixel list, at batch 1.

    python -m scripts.bench.picture_requests --model-dir DIR --pictures a.png,b.jpg [--rounds 3 --requests 2000]

DIR is a model dir of the default task (its serving/ and a model that takes pictures). The load comes from hey, one
connection (batch 1, one request at a time), rounds interleaved; one JSON line per measurement, then a summary.
"""

from __future__ import annotations

import argparse
import base64
import json
import pathlib
import sys
import tempfile
from typing import Any

from scripts.bench import load_tools, serving_load


def in_process(model_dir: pathlib.Path, picture: bytes) -> dict[str, Any]:
    import tensorflow as tf

    from trainer.artifacts.layout import ModelDir

    served = tf.saved_model.load(ModelDir(str(model_dir)).latest_saved_model())
    out = served.signatures["serve_image_bytes"](image_bytes=tf.constant([picture]))
    return {
        "class_id": int(out["class_id"][0]),
        "class_name": out["class_name"][0].numpy().decode(),
        "probabilities": out["probabilities"][0].numpy().tolist(),
    }


def answers(url: str, grpc_target: str, picture: bytes) -> dict[str, dict[str, Any]]:
    """The served answer to one picture over each protocol: REST v1 by httpx, REST v2 (its binary data extension)
    and gRPC by KServe's own clients."""
    import asyncio

    import httpx
    import numpy as np
    from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig

    body = {"instances": [{"b64": base64.b64encode(picture).decode()}]}
    v1 = httpx.post(f"{url}/v1/models/bench:predict", json=body, timeout=30).json()["predictions"][0]

    def tensor() -> InferInput:
        files = InferInput("image_bytes", [1], "BYTES")
        files.set_data_from_numpy(np.array([picture], dtype=object), binary_data=True)
        return files

    async def over_v2_and_grpc() -> tuple[Any, Any]:
        rest = InferenceRESTClient(RESTConfig(protocol="v2", timeout=60))
        grpc = InferenceGRPCClient(grpc_target)
        try:
            v2 = await rest.infer(url, InferRequest("bench", [tensor()]), model_name="bench")
            return v2, await grpc.infer(InferRequest(model_name="bench", infer_inputs=[tensor()]))
        finally:
            await rest.close()
            await grpc.close()

    def answer(response: Any) -> dict[str, Any]:
        outputs = {output.name: output.as_numpy() for output in response.outputs}
        return {
            "class_id": int(outputs["class_id"][0]),
            "class_name": _text(outputs["class_name"][0]),
            "probabilities": outputs["probabilities"][0].tolist(),
        }

    v2, grpc = asyncio.run(over_v2_and_grpc())
    return {"v1": v1, "v2": answer(v2), "grpc": answer(grpc)}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def request_bodies(picture: bytes, scratch: pathlib.Path) -> dict[str, pathlib.Path]:
    """The same picture as a file (b64) and as a pixel list, each a REST v1 body of one example."""
    import tensorflow as tf

    from trainer.data import images

    shape = tuple(int(d) for d in tf.io.decode_image(picture, expand_animations=False).shape)
    pixels = images.decoded(tf.constant(picture), shape).numpy().tolist()
    bodies = {
        "file_b64": {"instances": [{"b64": base64.b64encode(picture).decode()}]},
        "pixels": {"instances": [pixels]},
    }
    paths = {}
    for name, body in bodies.items():
        paths[name] = scratch / f"{name}.json"
        paths[name].write_text(json.dumps(body))
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.bench.picture_requests", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--model-dir", type=pathlib.Path, required=True)
    parser.add_argument("--pictures", required=True, help="comma-separated picture files (PNG, JPEG, ...)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args(argv)
    tools = load_tools.require()
    pictures = [pathlib.Path(path) for path in args.pictures.split(",")]
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="picture-requests-"))
    server, url, grpc_target = serving_load.start_server(args.model_dir / "serving", scratch / "server.log", 120)
    try:
        for picture in pictures:
            line = {"picture": picture.name, "in_process": in_process(args.model_dir, picture.read_bytes())}
            print(json.dumps({**line, "served": answers(url, grpc_target, picture.read_bytes())}), flush=True)
        bodies = request_bodies(pictures[0].read_bytes(), scratch)
        rates: dict[str, list[float]] = {name: [] for name in bodies}
        for _ in range(args.rounds):
            for name, body in bodies.items():
                cell = load_tools.hey_cell(tools["hey"], f"{url}/v1/models/bench:predict", body, 1, args.requests)
                rates[name].append(cell["requests_per_second"])
                print(json.dumps({"body": name, "bytes": body.stat().st_size, **cell}), flush=True)
        medians = {name: sorted(values)[len(values) // 2] for name, values in rates.items()}
        print(
            json.dumps(
                {
                    "summary": {
                        "requests_per_second_median": medians,
                        "file_over_pixels": medians["file_b64"] / medians["pixels"],
                    }
                }
            ),
            flush=True,
        )
    finally:
        serving_load.stop_server(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
