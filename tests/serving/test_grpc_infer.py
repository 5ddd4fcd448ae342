"""The project's ModelInfer handler answers and refuses exactly as KServe's own servicer path does (its InferRequest,
the model, its InferResponse.to_grpc), on a real trained SavedModel and a classifier's taking picture files (BYTES),
in process."""

from __future__ import annotations

import asyncio
import shutil
import struct
import uuid

import numpy as np
import pytest
from kserve.errors import InvalidInput, ModelNotFound
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.grpc.servicer import InferenceServicer
from kserve.protocol.infer_type import InferRequest, deserialize_bytes_tensor, serialize_byte_tensor

from classes_model import images, in_process, jpeg, png
from model_server import image_examples
from trainer.serving.admission import Admission
from trainer.serving.grpc_infer import ModelInferHandler
from trainer.serving.model import SavedModelVersions


@pytest.fixture(scope="module")
def handler(image_model):
    model = SavedModelVersions("model", str(image_model / "serving"), poll_seconds=60)
    model.load()
    return ModelInferHandler(model, Admission(0))


def raw_request(array: np.ndarray, datatype: str = "UINT8", name: str = "images", **fields) -> pb.ModelInferRequest:
    tensor = pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=list(array.shape))
    return pb.ModelInferRequest(model_name="model", inputs=[tensor], raw_input_contents=[array.tobytes()], **fields)


def kserve_answer(handler: ModelInferHandler, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
    """What KServe's servicer gives for the request: its validation, InferRequest, the model and to_grpc."""
    InferenceServicer.validate_grpc_request(request)
    return asyncio.run(handler.model.predict(InferRequest.from_grpc(request))).to_grpc()


def refusal(call) -> tuple[type, str]:
    with pytest.raises(Exception) as refused:
        call()
    return type(refused.value), str(refused.value)


def test_raw_tensors_are_answered_byte_for_byte_as_kserve_answers_them(handler):
    for rows in (1, 3):
        request = raw_request(image_examples(rows), id=f"request-{rows}")
        ours = asyncio.run(handler.answer(request))
        assert ours == kserve_answer(handler, request)
        assert {tensor.name: list(tensor.shape) for tensor in ours.outputs} == {
            "probabilities": [rows, 10],
            "class_id": [rows],
            "class_name": [rows],
        }
        assert ours.model_version == str(handler.model.served.version)


def test_a_request_without_an_id_gets_a_fresh_one_as_from_kserve(handler):
    first, second = (asyncio.run(handler.answer(raw_request(image_examples(1)))) for _ in range(2))
    assert uuid.UUID(first.id) != uuid.UUID(second.id)
    first.id = ""
    expected = kserve_answer(handler, raw_request(image_examples(1)))
    expected.id = ""
    assert first == expected


def test_typed_contents_are_answered_through_kserve_with_the_same_values_as_raw(handler):
    images = image_examples(2)
    raw = asyncio.run(handler.answer(raw_request(images, id="same")))
    typed = raw_request(images, id="same")
    del typed.raw_input_contents[:]
    typed.inputs[0].contents.uint_contents.extend(images.flatten().tolist())
    answer = asyncio.run(handler.answer(typed))
    assert answer == kserve_answer(handler, typed)
    values = {tensor.name: tensor.contents for tensor in answer.outputs}
    index = [tensor.name for tensor in raw.outputs].index("probabilities")
    probabilities = np.frombuffer(raw.raw_output_contents[index], np.float32)
    np.testing.assert_allclose(values["probabilities"].fp32_contents, probabilities, rtol=1e-6)


@pytest.mark.parametrize(
    "request_for",
    [
        pytest.param(lambda: raw_request(np.zeros((1, 28, 28), np.uint8)), id="a shape the model does not take"),
        pytest.param(lambda: raw_request(image_examples(1).astype(np.float32), "FP32"), id="another datatype"),
        pytest.param(lambda: raw_request(image_examples(1), name="pixels"), id="an input the model lacks"),
        pytest.param(
            lambda: pb.ModelInferRequest(
                model_name="model",
                inputs=[pb.ModelInferRequest.InferInputTensor(name="images", datatype="UINT8", shape=[1, 28, 28, 1])],
                raw_input_contents=[bytes(100)],
            ),
            id="data that does not fill its shape",
        ),
        pytest.param(
            lambda: pb.ModelInferRequest(
                model_name="model",
                inputs=[pb.ModelInferRequest.InferInputTensor(name="images", datatype="UINT8", shape=[1, 28, 28, 1])],
                raw_input_contents=[bytes(784), bytes(784)],
            ),
            id="more raw contents than inputs",
        ),
    ],
)
def test_a_bad_raw_request_is_refused_with_kserves_exception_and_message(handler, request_for):
    ours = refusal(lambda: asyncio.run(handler.answer(request_for())))
    assert ours == refusal(lambda: kserve_answer(handler, request_for()))
    assert ours[0] is InvalidInput
    assert "this model's inputs are" in ours[1] or "raw input contents" in ours[1]


def test_another_model_name_is_not_found(handler):
    request = raw_request(image_examples(1))
    request.model_name = "other"
    kind, message = refusal(lambda: asyncio.run(handler.answer(request)))
    assert kind is ModelNotFound
    assert "other" in message


@pytest.fixture(scope="module")
def classes_handler(classes_model, tmp_path_factory):
    """The handler on a classifier's SavedModel, whose serve_image_bytes takes picture files (BYTES)."""
    base_path = tmp_path_factory.mktemp("classes") / "serving"
    shutil.copytree(classes_model, base_path / "1")
    model = SavedModelVersions("model", str(base_path), poll_seconds=60)
    model.load()
    return ModelInferHandler(model, Admission(0))


def bytes_request(raw: bytes, elements: int, **fields) -> pb.ModelInferRequest:
    tensor = pb.ModelInferRequest.InferInputTensor(name="image_bytes", datatype="BYTES", shape=[elements])
    return pb.ModelInferRequest(model_name="model", inputs=[tensor], raw_input_contents=[raw], **fields)


def test_raw_bytes_are_answered_byte_for_byte_as_kserve_answers_them(classes_handler, classes_model):
    # Before: raw BYTES went through KServe's types to serve, which has no input image_bytes.
    files = [png(images(1)[0]), jpeg(images(1, seed=1)[0])]
    request = bytes_request(serialize_byte_tensor(np.array(files, dtype=object)).item(), len(files), id="files")
    ours = asyncio.run(classes_handler.answer(request))
    assert ours == kserve_answer(classes_handler, request)
    index = [tensor.name for tensor in ours.outputs].index("class_name")
    names = deserialize_bytes_tensor(ours.raw_output_contents[index]).tolist()
    assert (
        names
        == in_process(classes_model, "serve_image_bytes", image_bytes=np.array(files, object))["class_name"].tolist()
    )


def test_raw_bytes_whose_length_passes_their_end_are_refused_as_kserve_refuses_them(classes_handler):
    # Before: the length-prefix parser's struct.error was no refusal: a 500.
    request = bytes_request(struct.pack("<I", 1000) + b"short", 1)
    ours = refusal(lambda: asyncio.run(classes_handler.answer(request)))
    assert ours == refusal(lambda: kserve_answer(classes_handler, request))
    assert ours[0] is InvalidInput
    assert "input 'image_bytes': its data does not fill its shape [1]" in ours[1], ours[1]
