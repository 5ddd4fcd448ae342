"""A classifier's SavedModel (tests/helpers/classes_model.py: serve, serve_image_bytes, class_names) served as a client
sees it: a real server process, httpx and KServe's own REST and gRPC clients.

Picture files sent as {"b64": ...} over REST v1 (rows and columns, no signature_name) and as BYTES over REST v2 and
gRPC v2 (raw and typed) are answered by serve_image_bytes with what it computes in process, class_name included; a
file that is not an image, and base64 that is not, get a 4xx naming them; numbers still go to serve; the metadata
carries the class names, the new version's after a swap. The server batches (--max-batch-size), so every string
request and answer here goes through the batcher, and concurrent ones are joined.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import shutil
import struct
import threading

import grpc
import httpx
import numpy as np
import pytest
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig

from classes_model import CLASS_NAMES, images, in_process, jpeg, png, save_classes_model
from model_server import ServerProcess, metrics, publish_version

NAME = "classes"
V1, V2 = f"/v1/models/{NAME}:predict", f"/v2/models/{NAME}/infer"
EXPECTED = "this model's inputs are image_bytes: string [-1]"


def not_an_image(element: int) -> str:
    return f"element {element} of input 'image_bytes' is not a PNG, JPEG, GIF or BMP image"


TEXT_FILE = b"a text file, not a picture\n"


@pytest.fixture(scope="module")
def server(classes_model, tmp_path_factory):
    """The server and its base path; it joins requests that arrive within 200 ms of each other."""
    base_path = tmp_path_factory.mktemp("classes-served") / "serving"
    shutil.copytree(classes_model, base_path / "1")
    flags = ["--max-batch-size", "8", "--batch-timeout-ms", "200"]
    process = ServerProcess(base_path, NAME, base_path.parent / "server.log", *flags).wait_ready()
    yield process, base_path
    process.stop()


def pictures() -> list[bytes]:
    """A PNG and a JPEG of the model's size, and a larger PNG the model resizes."""
    small = images(2)
    large = np.random.default_rng(3).integers(0, 256, (20, 12, 1), dtype=np.uint8)
    return [png(small[0]), jpeg(small[1]), png(large)]


def b64(data: bytes) -> dict[str, str]:
    return {"b64": base64.b64encode(data).decode("ascii")}


def post(server: ServerProcess, path: str, body: object, **options) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{server.url}{path}", content=content, timeout=60, **options)


def computed(base_path, files: list[bytes]) -> dict[str, np.ndarray]:
    """What version 1's serve_image_bytes computes for these files in this process."""
    return in_process(base_path / "1", "serve_image_bytes", image_bytes=np.array(files, dtype=object))


def assert_same(outputs: dict, expected: dict[str, np.ndarray]) -> None:
    """An answer's class_id, class_name and probabilities, as lists or arrays, equal the in-process ones."""
    names = [name.decode() if isinstance(name, bytes) else name for name in np.asarray(outputs["class_name"]).tolist()]
    assert names == [name.decode() for name in expected["class_name"]]
    assert set(names) <= set(CLASS_NAMES)
    assert np.asarray(outputs["class_id"]).tolist() == expected["class_id"].tolist()
    np.testing.assert_allclose(outputs["probabilities"], expected["probabilities"], rtol=1e-6)


def v1_outputs(answer: httpx.Response) -> dict[str, list]:
    """A v1 answer's outputs by name, rows turned into columns."""
    assert answer.status_code == 200, answer.text
    if "outputs" in answer.json():
        return answer.json()["outputs"]
    rows = answer.json()["predictions"]
    return {name: [row[name] for row in rows] for name in rows[0]}


def v2_rest(server: ServerProcess, files: list[bytes]) -> dict[str, np.ndarray]:
    """The files as one BYTES tensor, sent by KServe's InferenceRESTClient (REST v2, its binary data extension)."""

    async def infer():
        tensor = InferInput("image_bytes", [len(files)], "BYTES")
        tensor.set_data_from_numpy(np.array(files, dtype=object), binary_data=True)
        client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=60))
        try:
            return await client.infer(server.url, InferRequest(NAME, [tensor]), model_name=NAME)
        finally:
            await client.close()

    return {output.name: output.as_numpy() for output in asyncio.run(infer()).outputs}


def v2_grpc(server: ServerProcess, files: list[bytes], raw: bool) -> dict[str, np.ndarray]:
    """The files as one BYTES tensor, sent by KServe's InferenceGRPCClient: raw (length-prefixed) or typed."""
    data = np.array(files, dtype=object) if raw else list(files)  # an array is sent raw, a list in bytes_contents
    request = InferRequest(NAME, [InferInput("image_bytes", [len(files)], "BYTES", data=data)])
    assert bool(request.to_grpc().raw_input_contents) == raw

    async def infer():
        async with InferenceGRPCClient(server.grpc_target, retries=0) as client:
            return await client.infer(request)

    return {output.name: output.as_numpy() for output in asyncio.run(infer()).outputs}


def test_pictures_sent_as_b64_over_v1_are_answered_by_the_bytes_signature_with_their_class_names(server):
    # Before: {"b64": ...} was read as a row naming an input 'b64', refused; and string outputs were not JSON.
    process, base_path = server
    files = pictures()
    expected = computed(base_path, files)
    bodies = {
        "rows": {"instances": [b64(data) for data in files]},
        "named rows": {"instances": [{"image_bytes": b64(data)} for data in files]},
        "columns": {"inputs": {"image_bytes": [b64(data) for data in files]}},
        "signature named": {"instances": [b64(data) for data in files], "signature_name": "serve_image_bytes"},
    }
    for form, body in bodies.items():
        outputs = v1_outputs(post(process, V1, body))
        assert all(isinstance(name, str) for name in outputs["class_name"]), (form, outputs)
        assert_same(outputs, expected)


def test_pictures_sent_as_bytes_over_v2_rest_and_grpc_are_answered_with_their_class_names(server):
    # Before: REST v2 turned the files into UTF-8 text (a 500), and v2 and gRPC sent them to serve, which refused.
    process, base_path = server
    files = pictures()
    expected = computed(base_path, files)
    assert_same(v2_rest(process, files), expected)
    for raw in (True, False):
        assert_same(v2_grpc(process, files, raw), expected)


def test_numbers_still_go_to_serve_and_the_metadata_names_the_classes(server):
    # Before: the metadata had no class names, and v1 could not write serve's class_name (bytes) as JSON.
    process, base_path = server
    metadata = httpx.get(f"{process.url}/v2/models/{NAME}").json()
    assert metadata["class_names"] == list(CLASS_NAMES)
    assert metadata["versions"] == ["1"]
    assert metadata["inputs"] == [{"name": "images", "datatype": "UINT8", "shape": [-1, 8, 8, 1]}]
    assert {"name": "class_name", "datatype": "BYTES", "shape": [-1]} in metadata["outputs"]
    pixels = images(3, seed=1)
    expected = in_process(base_path / "1", "serve", images=pixels)
    assert_same(v1_outputs(post(process, V1, {"instances": pixels.tolist()})), expected)
    tensor = {"name": "images", "shape": list(pixels.shape), "datatype": "UINT8", "data": pixels.ravel().tolist()}
    answer = post(process, V2, {"inputs": [tensor]}, headers={"content-type": "application/json"})
    assert answer.status_code == 200, answer.text
    outputs = {output["name"]: np.reshape(output["data"], output["shape"]) for output in answer.json()["outputs"]}
    assert_same(outputs, expected)


def test_a_file_that_is_not_an_image_is_refused_over_every_protocol_naming_it(server):
    # Before: v1 refused {"b64": ...} as an unknown input, REST v2 failed with a 500 and gRPC was refused by serve.
    process, base_path = server
    files = [pictures()[0], TEXT_FILE]
    v1 = post(process, V1, {"instances": [b64(data) for data in files]})
    assert v1.status_code == 400 and not_an_image(1) in v1.json()["error"] and EXPECTED in v1.json()["error"], v1.text
    with pytest.raises(httpx.HTTPStatusError) as v2:
        v2_rest(process, files)
    assert v2.value.response.status_code == 400 and not_an_image(1) in v2.value.response.json()["error"]
    text = {"name": "image_bytes", "shape": [1], "datatype": "BYTES", "data": ["text, not a picture"]}
    v2_json = post(process, V2, {"inputs": [text]}, headers={"content-type": "application/json"})
    assert v2_json.status_code == 400 and not_an_image(0) in v2_json.json()["error"], v2_json.text
    for raw in (True, False):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            v2_grpc(process, files, raw)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert not_an_image(1) in refused.value.details() and EXPECTED in refused.value.details()
    assert_same(v1_outputs(post(process, V1, {"instances": [b64(files[0])]})), computed(base_path, files[:1]))


def binary_v2(tensor: dict, data: bytes) -> tuple[bytes, dict[str, str]]:
    """A REST v2 body in the binary data extension: the JSON header, then the tensor's bytes."""
    header = json.dumps({"inputs": [tensor]}).encode()
    return header + data, {
        "inference-header-content-length": str(len(header)),
        "content-type": "application/octet-stream",
    }


MALFORMED = {
    "b64 that is not base64": (V1, {"instances": [{"b64": "not base64!"}]}, {}, 'its "b64" is not base64'),
    "b64 that is no string": (V1, {"instances": [{"b64": 7}]}, {}, 'its "b64" is not base64 (a int'),
    "a number for a string input": (
        V1,
        {"inputs": {"image_bytes": [7]}},
        {},
        "element 0 of input 'image_bytes' is int, not a string",
    ),
    "v2 binary data short of its size": (
        V2,
        *binary_v2(
            {"name": "image_bytes", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 99}}, b"x"
        ),
        "the binary_data_size of input 'image_bytes', 99, passes the body's end",
    ),
    "v2 BYTES whose length passes its end": (
        V2,
        *binary_v2(
            {"name": "image_bytes", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 9}},
            struct.pack("<I", 1000) + b"short",
        ),
        "input 'image_bytes': its data does not fill its shape [1]",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_bytes_are_refused_with_400_naming_the_problem(server, case):
    process, _ = server
    path, body, headers, problem = MALFORMED[case]
    refused = post(process, path, body, headers=headers)
    assert refused.status_code == 400, refused.text
    # A body that cannot be read names no signature's inputs but the default's.
    expected = "images: uint8 [-1, 8, 8, 1]" if "binary_data_size" in problem else EXPECTED
    assert problem in refused.json()["error"] and expected in refused.json()["error"], refused.json()


def test_a_signature_without_inputs_answers_no_request(server):
    process, _ = server
    refused = post(process, V1, {"instances": [b64(pictures()[0])], "signature_name": "class_names"})
    assert refused.status_code == 400, refused.text
    assert "signature_name 'class_names' names the model's metadata" in refused.json()["error"]
    assert "('serve', 'serve_image_bytes')" in refused.json()["error"]


@pytest.fixture(scope="module")
def signatures(classes_model):
    from trainer.serving.signature import load_signatures

    return load_signatures(str(classes_model))


@pytest.mark.parametrize(
    ("names", "binary", "chosen"),
    [
        (None, False, "serve"),  # v1 values, unnamed: numbers (or text, which serve refuses as today)
        (None, True, "serve_image_bytes"),  # v1 {"b64": ...}, unnamed
        (["images"], False, "serve"),
        (["image_bytes"], False, "serve_image_bytes"),  # v1 named, or a v2 tensor
        (["images", "image_bytes"], False, "serve"),  # fits none: the default refuses it, naming its inputs
        ([], False, "serve"),
    ],
)
def test_a_request_goes_to_the_signature_its_inputs_fit(signatures, names, binary, chosen):
    from trainer.serving.signature import choose  # here: the rule's own test, the module's others need none of it

    assert choose(signatures, names, binary).name == chosen


def test_concurrent_requests_for_pictures_are_joined_and_each_gets_its_own_answer(server):
    process, base_path = server
    files = [png(image) for image in images(16, seed=5)]
    expected = computed(base_path, files)
    protocols = ("v1 rows", "v1 columns", "v2 rest", "grpc raw", "grpc typed")
    plan = [(protocols[index % len(protocols)], 2 * index) for index in range(8)]

    def ask(protocol: str, first: int) -> dict:
        sent = files[first : first + 2]
        if protocol == "v2 rest":
            return v2_rest(process, sent)
        if protocol.startswith("grpc"):
            return v2_grpc(process, sent, raw=protocol == "grpc raw")
        values = [b64(data) for data in sent]
        body = {"instances": values} if protocol == "v1 rows" else {"inputs": {"image_bytes": values}}
        return v1_outputs(post(process, V1, body))

    before = metrics(process)
    with concurrent.futures.ThreadPoolExecutor(len(plan)) as pool:
        answers = list(pool.map(lambda step: ask(*step), plan))
    after = metrics(process)
    for (_, first), outputs in zip(plan, answers, strict=True):
        assert_same(outputs, {name: value[first : first + 2] for name, value in expected.items()})
    made = after["serving_batch_requests_count"] - before["serving_batch_requests_count"]
    assert made < len(plan), f"{made} model calls for {len(plan)} requests: none was joined"


def test_a_new_version_brings_its_class_names(server, tmp_path):
    # Last in this module: the server serves version 2 from here on.
    process, base_path = server
    renamed = ("ant", "bee", "cow")
    publish_version(save_classes_model(tmp_path / "2", renamed), base_path, 2)
    for _ in range(300):
        metadata = httpx.get(f"{process.url}/v2/models/{NAME}").json()
        if metadata["versions"] == ["2"]:
            break
        threading.Event().wait(0.2)
    assert metadata["versions"] == ["2"] and metadata["class_names"] == list(renamed)
    outputs = v1_outputs(post(process, V1, {"instances": [b64(data) for data in pictures()]}))
    assert outputs["class_name"] == [renamed[class_id] for class_id in outputs["class_id"]]
