"""`python -m trainer.serving` as a client sees it: a real server process, real HTTP (httpx) and gRPC (KServe's
v2 stubs) clients. Its predictions over REST v1 (both forms), REST v2 and gRPC v2 equal the SavedModel called in
process on test examples; each bad request gets a 4xx naming the expected input and the next request is answered;
a version published while clients keep sending is swapped in with no failed request."""

from __future__ import annotations

import base64
import json
import os
import pathlib
import shutil
import threading

import grpc
import httpx
import numpy as np
import pytest
import tensorflow as tf
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.grpc.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from kserve.protocol.infer_type import deserialize_bytes_tensor, serialize_byte_tensor

import classes_model
from model_server import (
    EXAMPLES,
    ServerProcess,
    copy_versions,
    image_examples,
    in_process,
    publish_version,
    save_rows_model,
)
from trainer.data.datasets import TEST_INDEX_OFFSET


def regression_examples(count: int = EXAMPLES) -> np.ndarray:
    from examples.regression import linear_features_example  # examples/ is not a package every copy holds

    example = linear_features_example(42)
    return np.stack([example(tf.constant(TEST_INDEX_OFFSET + i))[0].numpy() for i in range(count)])


@pytest.fixture(scope="module")
def image_server(image_model, tmp_path_factory):
    base_path = copy_versions(image_model, tmp_path_factory.mktemp("image-served") / "serving")
    server = ServerProcess(base_path, "images", base_path.parent / "server.log").wait_ready()
    yield server, base_path
    server.stop()


def post(server: ServerProcess, path: str, body: object, **options) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{server.url}{path}", content=content, timeout=60, **options)


def grpc_infer(server: ServerProcess, name: str, array: np.ndarray, datatype: str, raw: bool = True):
    tensor = pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=list(array.shape))
    request = pb.ModelInferRequest(model_name=server.name, inputs=[tensor])
    if raw:
        request.raw_input_contents.append(array.tobytes())
    else:
        tensor = request.inputs[0]
        tensor.contents.uint_contents.extend(array.flatten().tolist())
    with grpc.insecure_channel(server.grpc_target) as channel:
        return GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)


def grpc_outputs(response) -> dict[str, np.ndarray]:
    dtypes = {"FP32": np.float32, "INT64": np.int64, "BYTES": object}
    outputs = {}
    for index, tensor in enumerate(response.outputs):
        if response.raw_output_contents and tensor.datatype == "BYTES":
            data = deserialize_bytes_tensor(response.raw_output_contents[index])
        elif response.raw_output_contents:
            data = np.frombuffer(response.raw_output_contents[index], dtypes[tensor.datatype])
        else:
            contents = tensor.contents
            values = contents.fp32_contents or contents.int64_contents or contents.bytes_contents
            data = np.array(values, dtypes[tensor.datatype])
        outputs[tensor.name] = data.reshape(list(tensor.shape))
    return outputs


def test_every_protocol_answers_what_the_saved_model_computes_in_process(image_server):
    server, base_path = image_server
    images = image_examples()
    expected = in_process(base_path, images=images)

    rows = post(server, "/v1/models/images:predict", {"instances": images.tolist()})
    assert rows.status_code == 200, rows.text
    predictions = rows.json()["predictions"]
    assert [row["class_id"] for row in predictions] == expected["class_id"].tolist()
    assert [row["class_name"] for row in predictions] == [name.decode() for name in expected["class_name"]]
    np.testing.assert_allclose([row["probabilities"] for row in predictions], expected["probabilities"], rtol=1e-6)

    columns = post(server, "/v1/models/images:predict", {"inputs": {"images": images.tolist()}})
    assert columns.status_code == 200, columns.text
    outputs = columns.json()["outputs"]
    assert outputs["class_id"] == expected["class_id"].tolist()
    np.testing.assert_allclose(outputs["probabilities"], expected["probabilities"], rtol=1e-6)

    v2 = post(
        server,
        "/v2/models/images/infer",
        {
            "inputs": [
                {"name": "images", "shape": list(images.shape), "datatype": "UINT8", "data": images.flatten().tolist()}
            ]
        },
        headers={"content-type": "application/json"},
    )
    assert v2.status_code == 200, v2.text
    by_name = {output["name"]: output for output in v2.json()["outputs"]}
    assert by_name["class_id"]["data"] == expected["class_id"].tolist()
    np.testing.assert_allclose(
        np.reshape(by_name["probabilities"]["data"], by_name["probabilities"]["shape"]),
        expected["probabilities"],
        rtol=1e-6,
    )
    assert v2.json()["model_version"] == "1"

    for raw in (True, False):
        response = grpc_infer(server, "images", images, "UINT8", raw=raw)
        outputs = grpc_outputs(response)
        assert response.model_version == "1"
        assert outputs["class_id"].tolist() == expected["class_id"].tolist()
        assert outputs["class_name"].tolist() == expected["class_name"].tolist()
        np.testing.assert_allclose(outputs["probabilities"], expected["probabilities"], rtol=1e-6)


def test_the_trained_default_task_answers_picture_files_with_their_class_names(image_server):
    # The trainer's own export (serve_image_bytes, class_names) against the server: a PNG and a resized JPEG as
    # {"b64": ...} over v1 with no signature_name, and as raw BYTES over gRPC, answered as the signature computes them.
    server, base_path = image_server
    pictures = image_examples(2)
    larger = np.repeat(np.repeat(pictures[1], 2, axis=0), 2, axis=1)  # 56x56: the signature resizes it
    files = [tf.io.encode_png(pictures[0]).numpy(), tf.io.encode_jpeg(larger).numpy()]
    expected = classes_model.in_process(base_path / "1", "serve_image_bytes", image_bytes=np.array(files, object))
    body = {"instances": [{"b64": base64.b64encode(data).decode()} for data in files]}
    predictions = post(server, "/v1/models/images:predict", body).json()["predictions"]
    assert [row["class_id"] for row in predictions] == expected["class_id"].tolist()
    assert [row["class_name"] for row in predictions] == [name.decode() for name in expected["class_name"]]
    names = httpx.get(f"{server.url}/v2/models/images").json()["class_names"]
    assert [row["class_name"] for row in predictions] == [names[row["class_id"]] for row in predictions]
    tensor = pb.ModelInferRequest.InferInputTensor(name="image_bytes", datatype="BYTES", shape=[len(files)])
    raw = serialize_byte_tensor(np.array(files, dtype=object)).item()
    request = pb.ModelInferRequest(model_name=server.name, inputs=[tensor], raw_input_contents=[raw])
    with grpc.insecure_channel(server.grpc_target) as channel:
        outputs = grpc_outputs(GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60))
    assert outputs["class_name"].tolist() == expected["class_name"].tolist()
    np.testing.assert_allclose(outputs["probabilities"], expected["probabilities"], rtol=1e-6)


@pytest.mark.slow
def test_a_single_output_task_is_served_in_tf_servings_plain_form(regression_models, tmp_path):
    base_path = copy_versions(regression_models[0], tmp_path / "serving")
    server = ServerProcess(base_path, "regression", tmp_path / "server.log").wait_ready()
    try:
        features = regression_examples()
        expected = in_process(base_path, features=features)["prediction"]
        # `curl -d` sends a form content type: TF Serving reads the body as JSON anyway, so this server does too.
        rows = httpx.post(
            f"{server.url}/v1/models/regression:predict",
            data=None,
            content=json.dumps({"instances": features.tolist()}),
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        assert rows.status_code == 200, rows.text
        np.testing.assert_allclose(rows.json()["predictions"], expected, rtol=1e-6)
        columns = post(server, "/v1/models/regression:predict", {"inputs": features.tolist()})
        np.testing.assert_allclose(columns.json()["outputs"], expected, rtol=1e-6)
        metadata = httpx.get(f"{server.url}/v2/models/regression").json()
        assert metadata["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 8]}]
        assert metadata["versions"] == ["1"]
        assert "class_names" not in metadata  # it has no class_names signature
    finally:
        server.stop()


V1 = "/v1/models/images:predict"
V2 = "/v2/models/images/infer"
JSON = {"content-type": "application/json"}
BAD_REQUESTS = {
    "v1 wrong shape": (V1, {"instances": [[1, 2, 3]]}, {}, 400, "shape [1, 3]"),
    "v1 wrong dtype (text)": (V1, {"instances": [[["a"] * 28] * 28]}, {}, 400, "numbers"),
    "v1 value out of uint8 range": (V1, {"instances": np.full((1, 28, 28, 1), 300).tolist()}, {}, 400, "[0, 255]"),
    "v1 fractional values for integers": (
        V1,
        {"instances": np.full((1, 28, 28, 1), 0.5).tolist()},
        {},
        400,
        "fractional",
    ),
    "v1 malformed JSON": (V1, b'{"instances": [[1, 2', {}, 400, "Unrecognized request format"),
    "v1 missing input": (V1, {"inputs": {}}, {}, 400, "no value for input 'images'"),
    "v1 unknown input": (V1, {"inputs": {"pixels": [[1]]}}, {}, 400, "no input named 'pixels'"),
    "v1 neither form": (V1, {"rows": []}, {}, 400, "neither"),
    "v1 ragged rows": (V1, {"instances": [[1, 2], [1]]}, {}, 400, "rectangular"),
    "v1 body over the limit": (V1, b" " * (64 * 1024 + 1), {}, 413, "limit of 65536 bytes"),
    "v2 wrong datatype": (
        V2,
        {"inputs": [{"name": "images", "shape": [1, 28, 28, 1], "datatype": "FP32", "data": [0.0] * 784}]},
        JSON,
        400,
        "datatype FP32, expected UINT8",
    ),
    "v2 wrong shape": (
        V2,
        {"inputs": [{"name": "images", "shape": [1, 28, 28], "datatype": "UINT8", "data": [0] * 784}]},
        JSON,
        400,
        "shape [1, 28, 28]",
    ),
    "v2 data short of its shape": (
        V2,
        {"inputs": [{"name": "images", "shape": [1, 28, 28, 1], "datatype": "UINT8", "data": [0] * 10}]},
        JSON,
        400,
        "does not fill",
    ),
    "v2 missing input": (V2, {"inputs": []}, JSON, 400, "no value for input 'images'"),
    "v2 malformed JSON": (V2, b'{"inputs": [', JSON, 400, "not a v2 inference request"),
    "v2 not a request": (V2, {"input": []}, JSON, 400, "not a v2 inference request"),
}


# A thread count no machine's default gives: TensorFlow's own is one per core.
LIMITED_THREADS = (os.cpu_count() or 1) + 1


@pytest.fixture(scope="module")
def limited_server(image_model, tmp_path_factory):
    """Limited in request bytes and in TensorFlow's threads."""
    base_path = copy_versions(image_model, tmp_path_factory.mktemp("limited") / "serving")
    flags = ["--max-request-bytes", "65536", "--threads", str(LIMITED_THREADS)]
    server = ServerProcess(base_path, "images", base_path.parent / "server.log", *flags)
    yield server.wait_ready()
    server.stop()


def test_threads_sizes_tensorflows_thread_pool_whatever_the_machines_cores(limited_server):
    assert post(limited_server, "/v1/models/images:predict", {"instances": image_examples(1).tolist()}).is_success
    tasks = pathlib.Path(f"/proc/{limited_server.process.pid}/task")
    names = [(task / "comm").read_text().strip() for task in tasks.iterdir()]
    assert names.count("tf_Compute") == LIMITED_THREADS, sorted(names)  # TensorFlow's inter-op pool, by its name


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_a_bad_request_gets_a_4xx_naming_the_expected_input_and_the_next_one_is_answered(limited_server, case):
    path, body, headers, status, problem = BAD_REQUESTS[case]
    refused = post(limited_server, path, body, headers=headers)
    assert refused.status_code == status, refused.text
    message = refused.json()["error"]
    assert problem in message, message
    assert "images: uint8 [-1, 28, 28, 1]" in message, message
    answered = post(limited_server, V1, {"instances": image_examples(2).tolist()})
    assert answered.status_code == 200, answered.text
    assert len(answered.json()["predictions"]) == 2


PICTURES_OVER_THE_LIMIT = {
    "v1 b64": (V1, {"instances": [{"b64": "A" * 70_000}]}, {}),
    "v1 named": (V1, {"inputs": {"image_bytes": [{"b64": "A" * 70_000}]}}, {}),
    "v2 binary": (
        V2,
        json.dumps({"inputs": [{"name": "image_bytes", "shape": [1], "datatype": "BYTES", "parameters": {}}]}).encode()
        + b"\0" * 70_000,
        {"inference-header-content-length": "98", "content-type": "application/octet-stream"},
    ),
}


@pytest.mark.parametrize("case", sorted(PICTURES_OVER_THE_LIMIT))
def test_a_picture_request_over_the_limit_names_the_input_it_was_sent_to(limited_server, case):
    # Before: the 413 named serve's input (images: uint8 [...]), whatever the body was for.
    path, body, headers = PICTURES_OVER_THE_LIMIT[case]
    refused = post(limited_server, path, body, headers=headers)
    assert refused.status_code == 413, refused.text
    message = refused.json()["error"]
    assert "over this server's limit of 65536 bytes" in message, message
    assert message.endswith("this model's inputs are image_bytes: string [-1]"), message


def test_a_bad_grpc_request_is_invalid_argument_naming_the_expected_input(limited_server):
    with pytest.raises(grpc.RpcError) as refused:
        grpc_infer(limited_server, "images", np.zeros((1, 28, 28), np.uint8), "UINT8")
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "images: uint8 [-1, 28, 28, 1]" in refused.value.details()
    assert grpc_infer(limited_server, "images", image_examples(1), "UINT8").model_version == "1"


def test_a_grpc_message_over_the_limit_is_refused_and_the_next_one_is_answered(limited_server):
    with pytest.raises(grpc.RpcError) as refused:
        grpc_infer(limited_server, "images", np.zeros((100, 28, 28, 1), np.uint8), "UINT8")  # 78,400 bytes > 64 KiB
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert grpc_infer(limited_server, "images", image_examples(1), "UINT8").model_version == "1"


def grpc_refused(server: ServerProcess) -> None:
    with pytest.raises(grpc.RpcError):
        grpc_infer(server, "images", np.zeros((1, 28, 28), np.uint8), "UINT8")


REFUSALS_LOGGED = {
    "v1 wrong shape": (lambda s: post(s, V1, {"instances": [[1, 2, 3]]}), "refused with 400: input 'images' has shape"),
    "v2 not a request": (lambda s: post(s, V2, {"input": []}, headers=JSON), "refused with 400: the body is not a v2"),
    "body over the limit": (lambda s: post(s, V1, b" " * (64 * 1024 + 1)), "refused with 413: the request body"),
    "unknown model": (lambda s: httpx.get(f"{s.url}/v1/models/other"), "refused with 404: Model with name other"),
    "unknown path": (lambda s: httpx.get(f"{s.url}/v3/nothing"), "refused with 404: Not Found"),
    "gRPC wrong shape": (grpc_refused, "refused with INVALID_ARGUMENT: input 'images' has shape [1, 28, 28]"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS_LOGGED))
def test_a_refused_request_is_one_log_line_with_its_status_and_reason(limited_server, case):
    # Before: KServe logged a full traceback for each refusal, and REST two timing lines and the access line besides.
    refuse, says = REFUSALS_LOGGED[case]
    assert post(limited_server, V1, {"instances": image_examples(1).tolist()}).status_code == 200
    before = len(limited_server.log.read_text())
    refuse(limited_server)
    marker = '"GET /v2/health/live HTTP/1.1" 200'  # the next request's access line: the refusal's lines are above it
    assert httpx.get(f"{limited_server.url}/v2/health/live").status_code == 200
    for _ in range(100):
        written = limited_server.log.read_text()[before:]
        if marker in written:
            break
        threading.Event().wait(0.05)
    lines = written[: written.index(marker)].splitlines()[:-1]  # the marker's own line starts with its time stamp
    assert len(lines) == 1 and says in lines[0] and "WARNING" in lines[0], lines


def test_health_readiness_metadata_and_metrics(image_server):
    server, _ = image_server
    assert httpx.get(f"{server.url}/v2/health/live").json() == {"live": True}
    assert httpx.get(f"{server.url}/v2/health/ready").json() == {"ready": True}
    # KServe's v1 readiness and TF Serving's model status, in one answer.
    status = httpx.get(f"{server.url}/v1/models/images").json()
    assert (status["name"], status["ready"]) == ("images", True)
    assert status["model_version_status"] == [
        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
    ]
    assert httpx.get(f"{server.url}/v1/models/other").status_code == 404
    metadata = httpx.get(f"{server.url}/v2/models/images").json()
    assert metadata["versions"] == ["1"]
    assert metadata["inputs"] == [{"name": "images", "datatype": "UINT8", "shape": [-1, 28, 28, 1]}]
    assert {output["name"] for output in metadata["outputs"]} == {"class_id", "class_name", "probabilities"}
    assert len(metadata["class_names"]) == 10  # the trainer's class_names signature, read by the server
    metrics = httpx.get(f"{server.url}/metrics").text
    assert "serving_model_version 1.0" in metrics
    assert "request_predict_seconds" in metrics


@pytest.mark.slow  # a load run across a swap: make test-slow
def test_a_version_published_under_load_is_swapped_in_with_no_failed_request(image_model, tmp_path):
    base_path = copy_versions(image_model, tmp_path / "serving")
    server = ServerProcess(base_path, "images", tmp_path / "server.log").wait_ready()
    images = image_examples(4)
    body = {
        "inputs": [
            {"name": "images", "shape": list(images.shape), "datatype": "UINT8", "data": images.flatten().tolist()}
        ]
    }
    seen: list[str] = []
    failures: list[str] = []
    swapped, stop = threading.Event(), threading.Event()

    def client() -> None:
        with httpx.Client(timeout=60) as http:
            # Bounded: each client sends until the new version has answered it a few times, or 1000 requests.
            after_swap = 0
            for _ in range(1000):
                if stop.is_set() or after_swap >= 5:
                    return
                try:
                    response = http.post(f"{server.url}{V2}", json=body)
                except httpx.HTTPError as error:
                    failures.append(repr(error))
                    continue
                if response.status_code != 200:
                    failures.append(f"{response.status_code} {response.text[:200]}")
                    continue
                seen.append(response.json()["model_version"])
                if seen[-1] == "2":
                    swapped.set()
                    after_swap += 1

    clients = [threading.Thread(target=client) for _ in range(4)]
    try:
        for thread in clients:
            thread.start()
        while len(seen) < 8 and not failures and all(thread.is_alive() for thread in clients):
            threading.Event().wait(0.05)
        publish_version(base_path / "1", base_path, 2)
        assert swapped.wait(120), f"version 2 was never served:\n{(tmp_path / 'server.log').read_text()[-3000:]}"
    finally:
        if not swapped.is_set():
            stop.set()
        for thread in clients:
            thread.join(timeout=120)
        metadata = httpx.get(f"{server.url}/v2/models/images").json()
        server.stop()
    assert not failures, failures[:5]
    assert seen[0] == "1" and "2" in seen
    assert metadata["versions"] == ["2"]


def test_a_base_path_without_versions_is_refused_naming_the_fix(tmp_path):
    (tmp_path / "serving").mkdir()
    server = ServerProcess(tmp_path / "serving", "empty", tmp_path / "server.log")
    assert server.process.wait(timeout=120) == 2
    log = (tmp_path / "server.log").read_text()
    assert "holds no numbered SavedModel folder" in log and "make run-local" in log


def test_a_version_that_does_not_load_is_skipped_and_the_served_one_keeps_answering(image_model, tmp_path):
    base_path = copy_versions(image_model, tmp_path / "serving")
    server = ServerProcess(base_path, "images", tmp_path / "server.log").wait_ready()
    try:
        broken = tmp_path / "broken"
        broken.mkdir()
        (broken / "saved_model.pb").write_bytes(b"not a SavedModel")
        publish_version(broken, base_path, 2)
        deadline = threading.Event()
        for _ in range(100):
            if "version 2 under" in (tmp_path / "server.log").read_text():
                break
            deadline.wait(0.2)
        assert "does not load" in (tmp_path / "server.log").read_text()
        answered = post(server, V1, {"instances": image_examples(1).tolist()})
        assert answered.status_code == 200, answered.text
        assert httpx.get(f"{server.url}/v2/models/images").json()["versions"] == ["1"]
    finally:
        server.stop()


@pytest.mark.slow  # a server of its own: the quick suite's margin
def test_zero_padded_version_folders_are_served_by_their_number(image_model, tmp_path):
    # Before: base/0002 was read as version 2, then loaded from base/2, which does not exist: nothing was served.
    base_path = tmp_path / "serving"
    base_path.mkdir()
    (version,) = [path for path in (image_model / "serving").iterdir() if path.name.isdigit()]
    publish_version(version, base_path, "0002")
    server = ServerProcess(base_path, "images", tmp_path / "server.log").wait_ready()
    try:
        assert httpx.get(f"{server.url}/v2/models/images").json()["versions"] == ["2"]
        publish_version(version, base_path, "0010")  # 10 is above 2 by number, though "0010" < "2" as text
        for _ in range(300):
            if httpx.get(f"{server.url}/v2/models/images").json()["versions"] == ["10"]:
                break
            threading.Event().wait(0.2)
        zeros = {"name": "images", "shape": [1, 28, 28, 1], "datatype": "UINT8", "data": [0] * 784}
        answered = post(server, V2, {"inputs": [zeros]}, headers=JSON)
        assert answered.status_code == 200 and answered.json()["model_version"] == "10", answered.text
    finally:
        server.stop()


@pytest.mark.slow  # a server of its own: the quick suite's margin
def test_a_version_whose_files_are_replaced_under_the_same_number_is_served_anew(tmp_path):
    # Before: only the number was compared, so a retrain published again as version 1 (CLEAN=1, the same step
    # count) was never served: the old weights kept answering.
    base_path = tmp_path / "serving"
    save_rows_model(base_path / "1", factor=2.0)
    save_rows_model(tmp_path / "retrained", factor=3.0)
    server = ServerProcess(base_path, "rows", tmp_path / "server.log").wait_ready()

    def y() -> float:
        tensors = [
            {"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.5]},
            {"name": "pause_us", "shape": [1], "datatype": "INT64", "data": [0]},
        ]
        answer = post(server, "/v2/models/rows/infer", {"inputs": tensors}, headers=JSON)
        assert answer.status_code == 200 and answer.json()["model_version"] == "1", answer.text
        return answer.json()["outputs"][0]["data"][0]

    try:
        assert y() == 3.0
        # Replaced as the trainer publishes: the old folder moved aside, the new one renamed into its place.
        shutil.copytree(tmp_path / "retrained", base_path / ".1.partial")
        os.replace(base_path / "1", tmp_path / "retired")
        os.replace(base_path / ".1.partial", base_path / "1")
        for _ in range(300):
            if y() == 4.5:
                break
            threading.Event().wait(0.2)
        assert y() == 4.5, server.log.read_text()[-3000:]
        assert (
            "serving version 1 from" in server.log.read_text() and "anew: its files changed" in server.log.read_text()
        )
    finally:
        server.stop()


class TwoSignatures(tf.Module):
    """A SavedModel whose serve and serving_default answer differently, so a test sees which one answered."""

    @tf.function(input_signature=[tf.TensorSpec((None, 1), tf.float32, name="x")])
    def double(self, x):
        return {"y": 2.0 * x}

    @tf.function(input_signature=[tf.TensorSpec((None, 1), tf.float32, name="x")])
    def triple(self, x):
        return {"y": 3.0 * x}


def test_a_v1_request_is_answered_by_the_signature_it_names(tmp_path):
    # Before: a request naming serving_default was answered by serve.
    module = TwoSignatures()
    base_path = tmp_path / "serving"
    tf.saved_model.save(
        module, str(base_path / "1"), signatures={"serve": module.double, "serving_default": module.triple}
    )
    server = ServerProcess(base_path, "two", tmp_path / "server.log").wait_ready()
    try:
        answered = {}
        for named in (None, "serve", "serving_default"):
            body = {"instances": [[1.0]], **({"signature_name": named} if named else {})}
            answered[named] = post(server, "/v1/models/two:predict", body).json()
        assert answered == {
            None: {"predictions": [[2.0]]},
            "serve": {"predictions": [[2.0]]},
            "serving_default": {"predictions": [[3.0]]},
        }
        refused = post(server, "/v1/models/two:predict", {"instances": [[1.0]], "signature_name": "predict"})
        assert refused.status_code == 400, refused.text
        message = refused.json()["error"]
        assert "signature_name 'predict' is not one of this model's signatures ('serve', 'serving_default')" in message
    finally:
        server.stop()


@pytest.mark.slow  # a server of its own: the quick suite's margin
def test_a_version_that_failed_to_load_once_is_tried_again_and_reported_until_it_loads(image_model, tmp_path):
    # Before: a version that failed once was skipped until its files changed, and only the log said so.
    base_path = copy_versions(image_model, tmp_path / "serving")
    server = ServerProcess(base_path, "images", tmp_path / "server.log").wait_ready()
    try:
        # A transient read error with the same files: saved_model.pb's target is missing, then appears, unchanged in
        # the files' count and newest modification time (os.walk lists the link; the target's time is the epoch).
        late = tmp_path / "late" / "saved_model.pb"
        partial = base_path / ".2.partial"  # published as publish_version does, the link kept a link
        shutil.copytree(base_path / "1", partial)
        (partial / "saved_model.pb").unlink()
        (partial / "saved_model.pb").symlink_to(late)
        os.replace(partial, base_path / "2")
        for _ in range(300):
            statuses = httpx.get(f"{server.url}/v1/models/images").json()["model_version_status"]
            if len(statuses) == 2:
                break
            threading.Event().wait(0.2)
        failed, served = statuses
        assert (failed["version"], failed["state"], failed["status"]["error_code"]) == ("2", "END", "UNKNOWN")
        assert "does not load (try 1; tried again soon" in failed["status"]["error_message"], failed
        assert served == {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
        late.parent.mkdir()
        shutil.copyfile(base_path / "1" / "saved_model.pb", late)
        os.utime(late, (0, 0))
        for _ in range(300):
            if httpx.get(f"{server.url}/v2/models/images").json()["versions"] == ["2"]:
                break
            threading.Event().wait(0.2)
        assert httpx.get(f"{server.url}/v1/models/images").json()["model_version_status"] == [
            {"version": "2", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
        ]
    finally:
        server.stop()
