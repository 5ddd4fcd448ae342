"""One client's bad picture never fails another's good one: the trainer's own image model (serve_image_bytes) served by
a real server process, real concurrent clients over REST v1 ({"b64": ...}), REST v2 (the binary data extension)
and gRPC v2 (raw BYTES), good PNG and JPEG files sent at once with files the model refuses (a WebP, a PNG whose
header claims a huge image, a JPEG cut in half), batching on and off.

Every good request gets 200 (gRPC OK) with the answer its files get alone; every bad one a 4xx (gRPC
INVALID_ARGUMENT) naming its own file's problem, element 0 of its own request, and no one else's. The server's log
holds our line for each refusal and none of TensorFlow's or libjpeg's own.
"""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import json
import random
import re
import struct
import zlib

import grpc
import httpx
import numpy as np
import pytest
from kserve.errors import InvalidInput
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.grpc.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub

from model_server import ServerProcess, copy_versions, image_examples, metrics

NAME = "images"
PROTOCOLS = ("v1", "v2", "grpc")
GOOD_FILES = 48
TF_LOG_LINE = re.compile(r"^(?:[IWEF]\d{4} [\d:.]+ +\d+ \S+:\d+\] |\t \[\[)")  # TensorFlow's C++ log lines, absl's form


def png_bomb(side: int = 40_000) -> bytes:
    """A few hundred bytes of PNG whose header claims side x side pixels."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\0" * 1000))
        + chunk(b"IEND", b"")
    )


WEBP = b"RIFF\x88\x00\x00\x00WEBPVP8 " + bytes(range(120, 250))


def good_files() -> list[bytes]:
    """Different crops of the synthetic test images the model was trained on, as PNG and JPEG files in turn; some
    larger than the model's input, which the model resizes."""
    import tensorflow as tf

    files = []
    for index, image in enumerate(image_examples(GOOD_FILES)):
        if index % 3 == 2:
            image = np.repeat(np.repeat(image, 2, axis=0), 2, axis=1)[: 40 + index % 5]
        encode = tf.io.encode_png if index % 2 else tf.io.encode_jpeg
        files.append(encode(tf.constant(image)).numpy())
    return files


def bad_files() -> dict[str, tuple[bytes, str]]:
    """Files the model refuses, each with what its refusal says."""
    jpeg = good_files()[0]
    return {
        "webp": (WEBP, "element 0 of input 'image_bytes' is a WebP image, not a PNG, JPEG, GIF or BMP file"),
        "bomb": (png_bomb(), "element 0 of input 'image_bytes' holds 1600000000 pixels, more than this model decodes"),
        "half jpeg": (
            jpeg[: len(jpeg) // 2],
            "the model refused the input (jpeg::Uncompress failed. Invalid JPEG data",
        ),
    }


@dataclasses.dataclass
class Answer:
    status: int | str  # the HTTP status, or the gRPC code's name
    class_id: list[int] | None = None
    probabilities: np.ndarray | None = None
    error: str = ""


def send(server: ServerProcess, protocol: str, data: bytes) -> Answer:
    """One request holding one file, over REST v1 ({"b64": ...}), REST v2 (binary BYTES) or gRPC v2 (raw BYTES)."""
    if protocol == "grpc":
        tensor = pb.ModelInferRequest.InferInputTensor(name="image_bytes", datatype="BYTES", shape=[1])
        raw = struct.pack("<I", len(data)) + data
        request = pb.ModelInferRequest(model_name=server.name, inputs=[tensor], raw_input_contents=[raw])
        with grpc.insecure_channel(server.grpc_target) as channel:
            try:
                reply = GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=120)
            except grpc.RpcError as error:
                return Answer(error.code().name, error=error.details())
        outputs = {tensor.name: raw for tensor, raw in zip(reply.outputs, reply.raw_output_contents, strict=True)}
        return Answer(
            "OK",
            np.frombuffer(outputs["class_id"], np.int64).tolist(),
            np.frombuffer(outputs["probabilities"], np.float32).reshape(1, -1),
        )
    if protocol == "v1":
        body = json.dumps({"instances": [{"b64": base64.b64encode(data).decode("ascii")}]}).encode()
        response = httpx.post(f"{server.url}/v1/models/{server.name}:predict", content=body, timeout=120)
        if response.status_code != 200:
            return Answer(response.status_code, error=response.json()["error"])
        (row,) = response.json()["predictions"]
        return Answer(200, [row["class_id"]], np.array([row["probabilities"]]))
    size = len(data) + 4
    tensor = {"name": "image_bytes", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": size}}
    header = json.dumps({"inputs": [tensor]}).encode()
    response = httpx.post(
        f"{server.url}/v2/models/{server.name}/infer",
        content=header + struct.pack("<I", len(data)) + data,
        headers={"inference-header-content-length": str(len(header)), "content-type": "application/octet-stream"},
        timeout=120,
    )
    if response.status_code != 200:
        return Answer(response.status_code, error=response.json()["error"])
    outputs = {output["name"]: output for output in response.json()["outputs"]}
    probabilities = np.reshape(outputs["probabilities"]["data"], outputs["probabilities"]["shape"])
    return Answer(200, outputs["class_id"]["data"], probabilities)


def alone(base_path, files: list[bytes]) -> list[tuple[list[int], np.ndarray]]:
    """What version 1's serve_image_bytes answers for each file sent alone, called in this process."""
    import tensorflow as tf

    signature = tf.saved_model.load(str(base_path / "1")).signatures["serve_image_bytes"]
    answers = []
    for data in files:
        outputs = signature(image_bytes=tf.constant([data]))
        answers.append((outputs["class_id"].numpy().tolist(), outputs["probabilities"].numpy()))
    return answers


def sent_at_once(server: ServerProcess, plan: list[Step]) -> list[Answer]:
    """Each step of the plan as its own request, all at once from as many clients."""
    with concurrent.futures.ThreadPoolExecutor(len(plan)) as pool:
        return list(pool.map(lambda step: send(server, step.protocol, step.data), plan))


@dataclasses.dataclass(frozen=True)
class Step:
    protocol: str
    data: bytes
    file: int | str  # the good file's index, or the bad file's name


def mixed_plan(good: list[bytes], bad: dict[str, tuple[bytes, str]], seed: int) -> list[Step]:
    """Every good and bad file once, shuffled, each over a protocol in turn."""
    files: list[tuple[bytes, int | str]] = [*((data, index) for index, data in enumerate(good))]
    files += [(data, name) for name, (data, _) in bad.items()]
    random.Random(seed).shuffle(files)
    return [Step(PROTOCOLS[position % len(PROTOCOLS)], data, file) for position, (data, file) in enumerate(files)]


@pytest.fixture(scope="module")
def base_path(image_model, tmp_path_factory):
    return copy_versions(image_model, tmp_path_factory.mktemp("bad-neighbours") / "serving")


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param(["--max-batch-size", "32", "--batch-timeout-ms", "500"], id="batching on"),
        pytest.param([], id="batching off", marks=pytest.mark.slow),
    ],
)
def test_bad_pictures_sent_among_good_ones_fail_alone_naming_their_own_problem(base_path, flags, tmp_path, monkeypatch):
    # Before: with batching on, a bad file's joined call failed the good requests in it with a 500 naming the bad
    # one's error ('utf-8' codec can't decode ... for a WebP), and the bad files got 500 too.
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)  # the user's log level: the suite quiets TensorFlow
    good, bad = good_files(), bad_files()
    expected = alone(base_path, good)
    plan = mixed_plan(good, bad, seed=0)
    server = ServerProcess(base_path, NAME, tmp_path / "server.log", *flags).wait_ready()
    try:
        before = metrics(server)
        answers = sent_at_once(server, plan)
        after = metrics(server)
    finally:
        server.stop()
    failed = [
        f"{step.protocol} file {step.file}: {answer.status} {answer.error[:300]}"
        for step, answer in zip(plan, answers, strict=True)
        if isinstance(step.file, int) and answer.status not in (200, "OK")
    ]
    assert not failed, f"{len(failed)} of {len(good)} good requests failed: {failed[:3]}"
    for step, answer in zip(plan, answers, strict=True):
        if isinstance(step.file, int):
            class_id, probabilities = expected[step.file]
            assert answer.class_id == class_id, step
            np.testing.assert_allclose(answer.probabilities, probabilities, rtol=1e-5, atol=1e-7)
        else:
            assert answer.status in (400, "INVALID_ARGUMENT"), (step.protocol, step.file, answer)
            assert bad[step.file][1] in answer.error, (step.protocol, step.file, answer.error)
            assert "this model's inputs are image_bytes: string [-1]" in answer.error, answer.error
    if flags:
        made = after["serving_batch_requests_count"] - before["serving_batch_requests_count"]
        assert made < len(plan), f"{made} model calls for {len(plan)} requests: none was joined"
    log = server.log.read_text()
    assert not [line for line in log.splitlines() if TF_LOG_LINE.match(line)], log[-3000:]
    assert log.count("refused with 400") + log.count("refused with INVALID_ARGUMENT") == len(bad), log[-3000:]


def test_a_model_exported_with_the_files_raw_bytes_in_its_message_refuses_a_webp_in_readable_words(tmp_path):
    # Before: such a model's message (the check exported before the message was escaped in graph) is not UTF-8, so
    # the refusal said "'utf-8' codec can't decode byte 0x88 ..." and nothing of the file.
    import tensorflow as tf

    from trainer.serving.signature import load_signatures

    @tf.function(input_signature=[tf.TensorSpec((None,), tf.string, name="image_bytes")])
    def serve(image_bytes):
        start = tf.strings.substr(image_bytes[0], 0, 8)
        message = tf.strings.format("element 0 of input 'image_bytes' is not a PNG file (it starts with {})", start)
        with tf.control_dependencies([tf.debugging.Assert(tf.strings.substr(start, 0, 4) == b"\x89PNG", [message])]):
            return {"length": tf.strings.length(image_bytes)}

    module = tf.Module()
    tf.saved_model.save(module, str(tmp_path / "1"), signatures={"serve": serve})
    signature = load_signatures(str(tmp_path / "1"))["serve"]
    with pytest.raises(InvalidInput) as refused:
        signature.run({"image_bytes": np.array([WEBP], dtype=object)})
    assert str(refused.value).startswith(
        "the model refused the input (element 0 of input 'image_bytes' is not a PNG file (it starts with "
        '"RIFF\\x88\\000\\000\\000"))'
    ), refused.value
