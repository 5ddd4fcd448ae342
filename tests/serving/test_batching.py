"""Adaptive batching and load shedding (`python -m trainer.serving --max-batch-size ...`) as clients see them: a real
server process, real HTTP (httpx) and gRPC (KServe's v2 stubs) clients, each request's rows different from every
other's, so a mix-up cannot pass.

Concurrent clients over REST v1 (both forms), REST v2 and gRPC v2 each get exactly their own rows, and a request over
the maximum runs alone; a malformed request sent into a full batch fails alone and at once; a request the model
refuses in a joined call gets its own 4xx while the others of that call are answered; the queue refuses a new
request exactly past its limit (REST 503 with Retry-After, gRPC RESOURCE_EXHAUSTED, one log line each) while the
server stays ready; past the admission limit (--max-concurrent-requests) a request is refused before it is queued,
while health, readiness, metadata and /metrics still answer; a request waits at least the timeout when the model is
idle, then goes alone, and in the next call when the model is busy; and across a version swap each answer comes
from the version it names.

Timing is held by the model, not by the machine: the rows model sleeps what a request asks (pause_us, a timer), so a
"blocker" request keeps the model busy for seconds while the test fills the queue behind it, and the checks are on
structure (which call each request joined, per /metrics; which answers came back while the blocker still ran).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.grpc.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub

from model_server import (
    ServerProcess,
    copy_versions,
    image_examples,
    in_process,
    metrics,
    publish_version,
    save_rows_model,
)

MAX_BATCH, TIMEOUT_MS, QUEUE_LIMIT = 4, 200, 8
BLOCKER_SECONDS = 3.0  # how long the blocker keeps the model busy: ample for a loaded machine to queue behind it


@pytest.fixture(scope="module")
def rows_server(tmp_path_factory):
    base_path = tmp_path_factory.mktemp("rows") / "serving"
    save_rows_model(base_path / "1", factor=2.0)
    flags = ["--max-batch-size", str(MAX_BATCH), "--batch-timeout-ms", str(TIMEOUT_MS)]
    server = ServerProcess(
        base_path, "rows", base_path.parent / "server.log", *flags, "--max-queued-examples", str(QUEUE_LIMIT)
    )
    yield server.wait_ready()
    server.stop()


@dataclasses.dataclass
class Answer:
    status: int | str  # the HTTP status, or the gRPC code's name
    ys: list[float] | None = None
    version: str | None = None
    error: str = ""
    headers: dict[str, str] = dataclasses.field(default_factory=dict)


def send(server: ServerProcess, protocol: str, xs: list[float], pause_us: int = 0) -> Answer:
    """One request to the rows model: y for each x, over REST v1 (rows), REST v2 or gRPC v2."""
    pauses = [pause_us] * len(xs)
    if protocol == "grpc":
        inputs = [
            pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[len(xs), 1]),
            pb.ModelInferRequest.InferInputTensor(name="pause_us", datatype="INT64", shape=[len(xs)]),
        ]
        raw = [np.array(xs, np.float32).tobytes(), np.array(pauses, np.int64).tobytes()]
        request = pb.ModelInferRequest(model_name=server.name, inputs=inputs, raw_input_contents=raw)
        with grpc.insecure_channel(server.grpc_target) as channel:
            try:
                reply = GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
            except grpc.RpcError as error:
                return Answer(error.code().name, error=error.details())
        return Answer("OK", np.frombuffer(reply.raw_output_contents[0], np.float32).tolist(), reply.model_version)
    if protocol == "v1":
        body: dict[str, Any] = {
            "instances": [{"x": [x], "pause_us": pause} for x, pause in zip(xs, pauses, strict=True)]
        }
        response = httpx.post(f"{server.url}/v1/models/{server.name}:predict", json=body, timeout=60)
    else:
        body = {
            "inputs": [
                {"name": "x", "shape": [len(xs), 1], "datatype": "FP32", "data": xs},
                {"name": "pause_us", "shape": [len(xs)], "datatype": "INT64", "data": pauses},
            ]
        }
        response = httpx.post(f"{server.url}/v2/models/{server.name}/infer", json=body, timeout=60)
    if response.status_code != 200:
        return Answer(response.status_code, error=response.json()["error"], headers=dict(response.headers))
    if protocol == "v1":
        return Answer(200, [row[0] for row in response.json()["predictions"]])
    return Answer(200, response.json()["outputs"][0]["data"], response.json()["model_version"])


def grpc_typed(server: ServerProcess, datatype: str) -> Answer:
    """One row of x sent as `datatype` in typed contents."""
    tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype=datatype, shape=[1, 1])
    tensor.contents.fp64_contents.append(1.0)
    pause = pb.ModelInferRequest.InferInputTensor(name="pause_us", datatype="INT64", shape=[1])
    pause.contents.int64_contents.append(0)
    request = pb.ModelInferRequest(model_name=server.name, inputs=[tensor, pause])
    with grpc.insecure_channel(server.grpc_target) as channel:
        try:
            GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
        except grpc.RpcError as error:
            return Answer(error.code().name, error=error.details())
    return Answer("OK")


def wait_for(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not so after {timeout:g} s")
        time.sleep(0.02)


def calls(server: ServerProcess) -> float:
    """Model calls the batcher has started."""
    return metrics(server)["serving_batch_examples_count"]


def joined(before: dict[str, float], after: dict[str, float], requests: int) -> float:
    """Calls between two readings of /metrics that joined exactly `requests` requests (a power of two)."""

    def exactly(sample: dict[str, float]) -> float:
        below = sample.get(f'serving_batch_requests_bucket{{le="{requests / 2:.1f}"}}', 0.0) if requests > 1 else 0.0
        return sample[f'serving_batch_requests_bucket{{le="{float(requests):.1f}"}}'] - below

    return exactly(after) - exactly(before)


def start_blocker(server: ServerProcess, pool: concurrent.futures.Executor) -> concurrent.futures.Future[Answer]:
    """A request that keeps the model busy for BLOCKER_SECONDS; returns once its call has started."""
    wait_for(lambda: metrics(server)["serving_queued_examples"] == 0, "the queue is empty")
    started = calls(server)
    blocker = pool.submit(send, server, "v1", [0.5], int(BLOCKER_SECONDS * 1e6))
    wait_for(lambda: calls(server) == started + 1, "the blocker's call started")
    return blocker


def test_concurrent_clients_over_every_protocol_each_get_their_own_rows(image_model, tmp_path):
    base_path = copy_versions(image_model, tmp_path / "serving")
    flags = ["--max-batch-size", "8", "--batch-timeout-ms", "300"]
    server = ServerProcess(base_path, "images", tmp_path / "server.log", *flags).wait_ready()
    images = image_examples(48)
    expected = in_process(base_path, images=images)
    # (protocol, first row, rows): 1 to 3 rows each, and one request of 11 rows, over the maximum of 8.
    plan, start = [], 0
    for index in range(16):
        rows = 11 if index == 7 else 1 + index % 3
        plan.append((("v1_rows", "v1_columns", "v2", "grpc_raw", "grpc_typed")[index % 5], start, rows))
        start += rows
    assert start <= len(images)

    def ask(protocol: str, first: int, rows: int) -> tuple[list[int], np.ndarray]:
        batch = images[first : first + rows]
        if protocol.startswith("grpc"):
            tensor = pb.ModelInferRequest.InferInputTensor(name="images", datatype="UINT8", shape=list(batch.shape))
            request = pb.ModelInferRequest(model_name="images", inputs=[tensor])
            if protocol == "grpc_raw":
                request.raw_input_contents.append(batch.tobytes())
            else:
                request.inputs[0].contents.uint_contents.extend(batch.flatten().tolist())
            with grpc.insecure_channel(server.grpc_target) as channel:
                reply = GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
            outputs = {}
            for index, tensor in enumerate(reply.outputs):
                if tensor.datatype == "BYTES":  # class_name: the class ids are what is compared
                    continue
                dtype = np.float32 if tensor.datatype == "FP32" else np.int64
                if reply.raw_output_contents:
                    data = np.frombuffer(reply.raw_output_contents[index], dtype)
                else:
                    data = np.array(tensor.contents.fp32_contents or tensor.contents.int64_contents, dtype)
                outputs[tensor.name] = data.reshape(list(tensor.shape))
            return outputs["class_id"].tolist(), outputs["probabilities"]
        if protocol == "v2":
            body = {"inputs": [{"name": "images", "shape": list(batch.shape), "datatype": "UINT8"}]}
            body["inputs"][0]["data"] = batch.flatten().tolist()
            answer = httpx.post(f"{server.url}/v2/models/images/infer", json=body, timeout=60)
            assert answer.status_code == 200, answer.text
            by_name = {output["name"]: output for output in answer.json()["outputs"]}
            probabilities = np.reshape(by_name["probabilities"]["data"], by_name["probabilities"]["shape"])
            return by_name["class_id"]["data"], probabilities
        body = {"instances": batch.tolist()} if protocol == "v1_rows" else {"inputs": {"images": batch.tolist()}}
        answer = httpx.post(f"{server.url}/v1/models/images:predict", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        if protocol == "v1_rows":
            predictions = answer.json()["predictions"]
            return [row["class_id"] for row in predictions], np.array([row["probabilities"] for row in predictions])
        outputs = answer.json()["outputs"]
        return outputs["class_id"], np.array(outputs["probabilities"])

    try:
        before = metrics(server)
        with concurrent.futures.ThreadPoolExecutor(len(plan)) as pool:
            answers = list(pool.map(lambda step: ask(*step), plan))
        after = metrics(server)
    finally:
        server.stop()
    for (protocol, first, rows), (class_ids, probabilities) in zip(plan, answers, strict=True):
        assert class_ids == expected["class_id"][first : first + rows].tolist(), (protocol, first, rows)
        np.testing.assert_allclose(probabilities, expected["probabilities"][first : first + rows], rtol=1e-5)
    made = after["serving_batch_requests_count"] - before["serving_batch_requests_count"]
    alone = after['serving_batch_requests_bucket{le="1.0"}'] - before['serving_batch_requests_bucket{le="1.0"}']
    assert made < len(plan) and alone < made, f"{made} calls for {len(plan)} requests, {alone} of them alone"
    over = 'serving_batch_examples_bucket{le="16.0"}', 'serving_batch_examples_bucket{le="8.0"}'
    assert (after[over[0]] - after[over[1]]) - (before[over[0]] - before[over[1]]) == 1  # the 11 rows, alone


def send_each(pool, server, xs, protocols: str) -> list:
    """One single-row request per x, each over its protocol (space-separated), submitted to POOL."""
    return [pool.submit(send, server, protocol, [x]) for x, protocol in zip(xs, protocols.split(), strict=True)]


def test_a_malformed_request_sent_into_a_full_batch_fails_alone_and_at_once(rows_server):
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        blocker = start_blocker(rows_server, pool)
        before = metrics(rows_server)
        good = send_each(pool, rows_server, (1.0, 2.0, 3.0, 4.0), "v1 v2 grpc v1")
        wrong_shape = httpx.post(
            f"{rows_server.url}/v1/models/rows:predict", json={"instances": [{"x": [1.0, 2.0], "pause_us": 0}]}
        )
        wrong_datatype = grpc_typed(rows_server, "FP64")
        answered_while_busy = not blocker.done()
        wait_for(lambda: metrics(rows_server)["serving_queued_examples"] == MAX_BATCH, "the good four queued")
        answers = [future.result() for future in good]
        assert blocker.result().ys == [1.0]
    after = metrics(rows_server)
    assert wrong_shape.status_code == 400 and "has shape [1, 2], expected [-1, 1]" in wrong_shape.json()["error"]
    assert wrong_datatype.status == "INVALID_ARGUMENT" and "datatype FP64, expected FP32" in wrong_datatype.error
    assert answered_while_busy, "a malformed request waited for a batch"
    assert [answer.ys for answer in answers] == [[2.0], [4.0], [6.0], [8.0]]
    assert after["serving_batch_examples_count"] - before["serving_batch_examples_count"] == 1
    assert joined(before, after, MAX_BATCH) == 1  # the four good requests, in one call


def test_a_request_the_model_refuses_in_a_joined_call_fails_alone_and_its_neighbours_are_answered(rows_server):
    # Before: the model's refusal of one request's x failed the whole joined call, each of its four requests with a
    # 5xx naming that x.
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        blocker = start_blocker(rows_server, pool)
        before = metrics(rows_server)
        # Behind the blocker: a batch holding one x the model refuses when called (negative), then a good batch.
        refused = send_each(pool, rows_server, (1.0, -1.0, 3.0, 4.0), "v1 v2 grpc grpc")
        wait_for(lambda: metrics(rows_server)["serving_queued_examples"] == MAX_BATCH, "the refused batch queued")
        good = send_each(pool, rows_server, (5.0, 6.0, 7.0, 8.0), "v2 grpc v1 v2")
        wait_for(lambda: metrics(rows_server)["serving_queued_examples"] == 2 * MAX_BATCH, "the good batch queued")
        assert not blocker.done(), "the blocker ended before both batches were queued: raise BLOCKER_SECONDS"
        neighbours = [future.result() for future in refused]
        answered = [future.result() for future in good]
    after = metrics(rows_server)
    assert [answer.status for answer in neighbours] == [200, 400, "OK", "OK"], neighbours
    assert [answer.ys for answer in neighbours] == [[2.0], None, [6.0], [8.0]]
    culprit = neighbours[1].error
    assert culprit.startswith("the model refused the input (x must not be negative") and "joined" not in culprit
    assert "this model's inputs are pause_us: int64 [-1]; x: float32 [-1, 1]" in culprit, culprit
    assert [answer.ys for answer in answered] == [[10.0], [12.0], [14.0], [16.0]]
    assert joined(before, after, MAX_BATCH) == 2
    assert after["serving_batch_splits_total"] > before["serving_batch_splits_total"]
    # A request alone gets the same refusal.
    alone = send(rows_server, "v1", [-2.0])
    assert alone.status == 400 and alone.error.startswith("the model refused the input (x must not be negative")


def test_the_queue_refuses_exactly_past_its_limit_at_once_and_the_server_stays_ready(rows_server):
    log_before = rows_server.log.read_text()
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        blocker = start_blocker(rows_server, pool)
        before = metrics(rows_server)
        protocols = "v1 v2 grpc v1 v2 grpc v1".split()
        admitted = [pool.submit(send, rows_server, protocol, [float(x)]) for x, protocol in enumerate(protocols, 1)]
        wait_for(lambda: metrics(rows_server)["serving_queued_examples"] == 7, "seven examples waiting")
        two_rows = send(rows_server, "v1", [20.0, 21.0])  # 7 + 2 > 8: refused
        admitted.append(pool.submit(send, rows_server, "grpc", [8.0]))  # 7 + 1 = 8: admitted
        wait_for(lambda: metrics(rows_server)["serving_queued_examples"] == QUEUE_LIMIT, "the queue at its limit")
        rest_refused, grpc_refused = send(rows_server, "v2", [22.0]), send(rows_server, "grpc", [23.0])
        ready = (
            httpx.get(f"{rows_server.url}/v2/health/ready").json(),
            httpx.get(f"{rows_server.url}/v2/models/rows/ready"),
        )
        refused_while_busy = not blocker.done()
        shed = metrics(rows_server)["serving_requests_shed_total"] - before["serving_requests_shed_total"]
        answers = [future.result() for future in admitted]
        assert blocker.result().ys == [1.0]
    assert refused_while_busy, "the blocker ended before the queue was filled: raise BLOCKER_SECONDS"
    for refused, rows in ((two_rows, 2), (rest_refused, 1)):
        assert refused.status == 503 and refused.headers["retry-after"] == "1"
        assert f"{7 if rows == 2 else 8} examples are waiting for the model and this request's {rows}" in refused.error
        assert "its limit of 8 (--max-queued-examples)" in refused.error
    assert (
        grpc_refused.status == "RESOURCE_EXHAUSTED" and "its limit of 8 (--max-queued-examples)" in grpc_refused.error
    )
    assert ready[0] == {"ready": True} and ready[1].status_code == 200
    assert shed == 3
    assert [answer.ys for answer in answers] == [[2.0 * x] for x in range(1, 9)]
    log = rows_server.log.read_text()[len(log_before) :]
    assert log.count("refused with 503") == 2 and log.count("refused with RESOURCE_EXHAUSTED") == 1, log
    assert "Traceback" not in log, log


@pytest.mark.slow  # a server of its own: the quick suite's margin; the queue's limit stays quick
def test_past_the_concurrent_request_limit_a_request_is_refused_before_it_is_queued_and_health_still_answers(tmp_path):
    base_path = tmp_path / "serving"
    save_rows_model(base_path / "1", factor=2.0)
    flags = ["--max-batch-size", str(MAX_BATCH), "--batch-timeout-ms", str(TIMEOUT_MS)]
    flags += ["--max-queued-examples", str(QUEUE_LIMIT), "--max-concurrent-requests", "3"]
    server = ServerProcess(base_path, "rows", tmp_path / "server.log", *flags).wait_ready()
    try:
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            blocker = start_blocker(server, pool)
            admitted = send_each(pool, server, (1.0, 2.0), "v2 grpc")
            wait_for(lambda: metrics(server)["serving_queued_examples"] == 2, "two requests queued behind the blocker")
            before = metrics(server)
            refused = [send(server, protocol, [9.0]) for protocol in ("v1", "v2", "grpc")]
            gets = {path: httpx.get(f"{server.url}{path}", timeout=30) for path in HEALTH_PATHS}
            with grpc.insecure_channel(server.grpc_target) as channel:
                stub = GRPCInferenceServiceStub(channel)
                grpc_ready = (
                    stub.ServerReady(pb.ServerReadyRequest(), timeout=30).ready,
                    stub.ModelReady(pb.ModelReadyRequest(name="rows"), timeout=30).ready,
                )
            after = metrics(server)
            refused_while_busy = not blocker.done()
            answers = [future.result() for future in admitted]
            assert blocker.result().ys == [1.0]
        afterwards = send(server, "grpc", [5.0])  # the blocker and its two are out: room again
    finally:
        server.stop()
    assert refused_while_busy, "the blocker ended before the refusals: raise BLOCKER_SECONDS"
    assert [answer.status for answer in refused] == [503, 503, "RESOURCE_EXHAUSTED"]
    for answer in refused:
        assert answer.error == (
            "the server is full: it holds 3 requests at once, its limit (--max-concurrent-requests); retry shortly, "
            "or send from fewer clients at once"
        )
    assert [answer.headers["retry-after"] for answer in refused[:2]] == ["1", "1"]
    assert {path: answer.status_code for path, answer in gets.items()} == dict.fromkeys(HEALTH_PATHS, 200)
    assert gets["/v2/health/ready"].json() == {"ready": True} and grpc_ready == (True, True)
    # Refused before the queue: nothing more waits, the batcher's limit refused nothing, /metrics counts the three.
    assert before["serving_requests_in_flight"] == after["serving_requests_in_flight"] == 3
    assert after["serving_queued_examples"] == 2
    shed = {name: after[name] - before[name] for name in SHED_COUNTERS}
    assert shed == dict.fromkeys(SHED_COUNTERS, 3)  # all three at admission: none reached the queue's limit
    assert [answer.ys for answer in answers] == [[2.0], [4.0]] and afterwards.ys == [10.0]
    log = server.log.read_text()
    assert log.count("refused with 503") == 2 and log.count("refused with RESOURCE_EXHAUSTED") == 1, log
    assert "Traceback" not in log, log


SHED_COUNTERS = ("serving_requests_shed_total", "serving_requests_shed_at_admission_total")
# Never refused, however full the server: health, readiness, metadata, TF Serving's model status, /metrics.
HEALTH_PATHS = (
    "/",
    "/v2/health/live",
    "/v2/health/ready",
    "/v2/models/rows/ready",
    "/v2/models/rows",
    "/v1/models/rows",
    "/metrics",
)


def test_a_request_waits_for_the_timeout_when_idle_and_goes_in_the_next_call_when_busy(rows_server):
    """Checked by structure (which call each request joined, per /metrics), and one lower bound: how much longer a
    loaded machine takes is not the batcher's behaviour."""
    timeout = TIMEOUT_MS / 1000
    wait_for(lambda: metrics(rows_server)["serving_queued_examples"] == 0, "the queue is empty")
    before = metrics(rows_server)
    started = time.perf_counter()
    lone = send(rows_server, "grpc", [1.0])  # one row of a batch of four: it never fills, the timeout sends it
    idle_latency = time.perf_counter() - started
    assert lone.ys == [2.0] and idle_latency >= 0.9 * timeout, idle_latency  # it waited for company, then went
    assert (
        joined(before, metrics(rows_server), 1) == 1
        and calls(rows_server) == before["serving_batch_examples_count"] + 1
    )
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        blocker = start_blocker(rows_server, pool)
        during = calls(rows_server)
        behind = send(rows_server, "v2", [2.0])  # arrives during the blocker's call; its timeout passes meanwhile
        assert blocker.result().ys == [1.0]
    # It went alone in the call right after the blocker's: its timeout had passed, so nothing held it further.
    assert behind.ys == [4.0] and calls(rows_server) == during + 1


@pytest.mark.slow  # a load run across a swap: make test-slow
def test_across_a_version_swap_each_answer_comes_from_the_version_it_names(tmp_path):
    base_path = tmp_path / "serving"
    save_rows_model(base_path / "1", factor=2.0)
    save_rows_model(tmp_path / "tripling", factor=3.0)
    flags = ["--max-batch-size", "8", "--batch-timeout-ms", "5"]
    server = ServerProcess(base_path, "rows", tmp_path / "server.log", *flags).wait_ready()
    factors = {"1": 2.0, "2": 3.0}
    wrong: list[str] = []
    after_swap = threading.Event()
    counts = {"1": 0, "2": 0}

    def client(number: int) -> None:
        for request in range(2000):
            if counts["2"] >= 40:
                return
            xs = [float(1000 * number + request), float(1000 * number + request) + 0.5][: 1 + request % 2]
            answer = send(server, ("v2", "grpc")[number % 2], xs)
            if answer.ys is None or answer.version not in factors:
                wrong.append(f"{answer.status} {answer.error[:200]}")
                continue
            counts[answer.version] += 1
            if answer.ys != [factors[answer.version] * x for x in xs]:
                wrong.append(f"version {answer.version} answered {answer.ys} for {xs}")
            if answer.version == "2":
                after_swap.set()

    try:
        before = metrics(server)
        clients = [threading.Thread(target=client, args=(number,)) for number in range(6)]
        for thread in clients:
            thread.start()
        wait_for(lambda: counts["1"] >= 30 or bool(wrong), "version 1 answered")
        publish_version(tmp_path / "tripling", base_path, 2)
        assert after_swap.wait(120), f"version 2 was never served:\n{server.log.read_text()[-3000:]}"
        for thread in clients:
            thread.join(timeout=300)
        after = metrics(server)
    finally:
        server.stop()
    assert not wrong, wrong[:5]
    assert counts["1"] and counts["2"]
    made = after["serving_batch_requests_count"] - before["serving_batch_requests_count"]
    assert made < counts["1"] + counts["2"], "no call joined two requests: the swap was not tested under batching"


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--batch-timeout-ms", "5"], "--batch-timeout-ms applies to batching, which is off: add --max-batch-size N"),
        (["--max-queued-examples", "64"], "--max-queued-examples applies to batching, which is off"),
        (["--max-batch-size", "-1"], "--max-batch-size must be 0 (off) or more, got -1"),
        (["--max-concurrent-requests", "-1"], "--max-concurrent-requests must be 0 (no limit) or more, got -1"),
        (["--max-batch-size", "8", "--batch-timeout-ms", "-1"], "--batch-timeout-ms must be 0 or more"),
        (
            ["--max-batch-size", "8", "--max-queued-examples", "4"],
            "--max-queued-examples 4 is below --max-batch-size 8",
        ),
    ],
)
def test_batching_flags_that_cannot_work_are_refused_naming_the_fix(flags, says, capsys):
    from trainer.serving.__main__ import parse

    with pytest.raises(SystemExit) as refused:
        parse(["--model-base-path", "unused", *flags])
    assert refused.value.code == 2
    assert says in capsys.readouterr().err


def test_one_flag_turns_batching_on_with_tf_servings_queue_default():
    from trainer.serving.__main__ import DEFAULT_BATCH_TIMEOUT_MS, parse

    off = parse(["--model-base-path", "unused"])
    assert (off.max_batch_size, off.batch_timeout_ms, off.max_queued_examples) == (0, None, None)
    assert off.max_concurrent_requests == 0  # no limit
    on = parse(["--model-base-path", "unused", "--max-batch-size", "16"])
    assert (on.max_batch_size, on.batch_timeout_ms, on.max_queued_examples) == (16, DEFAULT_BATCH_TIMEOUT_MS, 160)
    assert on.max_concurrent_requests == 160 + 16  # a full queue and a call of single-example requests
    alone = parse(["--model-base-path", "unused", "--max-concurrent-requests", "8"])
    assert (alone.max_batch_size, alone.max_concurrent_requests) == (0, 8)  # shedding without batching
