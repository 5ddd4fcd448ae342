"""Adaptive batching and load shedding (`--max-batch-size`, `--batch-timeout-ms`, `--max-queued-examples`), in the
spirit of TensorFlow Serving's `--enable_batching`.

Requests that arrive within the timeout of the first one waiting are joined, up to the maximum number of examples,
into one call of the SavedModel; each request gets exactly its own rows back, in order. One model call runs at a
time, and the batch at the head of the queue keeps taking requests while the call ahead of it runs, so under load
the batches grow to what arrives during a call, and when idle a request waits at most the timeout. Only requests
for the same signature of the same loaded version, whose inputs agree in everything but the number of rows, share a
batch: during a version swap the old version's batch and the new one's are two calls. A request with more rows than
the maximum, or an input with no rows to join on (a scalar), runs alone. Requests are checked before they are
queued, so a malformed one fails alone. What the model itself refuses (a file that is no picture, a check of its own)
is found by bisection: when a joined call is refused, its halves are called apart, and a refused half split again,
down to the requests the model refuses alone, which get its refusal in their own words (a 4xx), while every other
request is answered as soon as its half is. A joined call the model takes costs nothing more; a refused one a few
smaller calls per refused request, rather than checking every input twice or failing its neighbours. Any other error
in a joined call fails that call's requests, each with a 5xx saying so (a request that ran alone gets the error it
would get unbatched).

The queue is bounded: a request that would bring the examples waiting past `--max-queued-examples` is refused at
once (QueueFull: REST 503 with Retry-After, gRPC RESOURCE_EXHAUSTED) rather than waiting, so memory and latency stay
flat under a burst while the server stays ready. An empty queue always admits one request, however large (the
request size limit bounds it). /metrics shows the batches formed, the queue's depth, the time waited and the
requests shed.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time

import numpy as np
from kserve.errors import InvalidInput
from prometheus_client import Counter, Gauge, Histogram

from trainer.base.errors import first_line
from trainer.serving.signature import Signature

log = logging.getLogger(__name__)

# The event loop's timers count whole milliseconds (asyncio's epoll wait rounds up to them, uvloop's libuv timers
# count them): a batch goes once its deadline is nearer than that, so the wake-up that follows never puts a request
# past its timeout.
TIMER_SLACK_SECONDS = 0.001

# One model per server process, so no model label.
BATCH_EXAMPLES = Histogram(
    "serving_batch_examples",
    "examples in each model call the batcher made (the batch sizes formed)",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
)
BATCH_REQUESTS = Histogram(
    "serving_batch_requests", "requests joined in each model call", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256)
)
BATCH_CALL_SECONDS = Histogram(
    "serving_batch_call_seconds",
    "time of each batch's model call, joining and splitting included (and the calls of its halves, when refused)",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0),
)
QUEUE_WAIT_SECONDS = Histogram(
    "serving_queue_wait_seconds",
    "time each request waited in the queue, from its admission to the start of its model call",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0),
)
QUEUED_EXAMPLES = Gauge("serving_queued_examples", "examples waiting for a model call")
SPLIT_CALLS = Counter(
    "serving_batch_splits_total",
    "joined calls whose input the model refused, split in halves called apart so only the requests it refuses alone "
    "are refused",
)
# Every shed request, whichever limit refused it (trainer/serving/admission.py counts its own apart as well).
REQUESTS_SHED = Counter(
    "serving_requests_shed_total",
    "requests refused at once because the server was full: its queue (--max-queued-examples) or its admission limit "
    "(--max-concurrent-requests)",
)


@dataclasses.dataclass(frozen=True)
class BatchingOptions:
    """The server's batching flags (python -m trainer.serving --help)."""

    max_batch_size: int  # the most examples one model call joins
    timeout_seconds: float  # the longest a request waits for others to join it, when the model is idle
    max_queued_examples: int  # past this many waiting examples a new request is refused


class QueueFull(Exception):
    """A request refused at once because the queue holds too many examples (REST 503 with Retry-After, gRPC
    RESOURCE_EXHAUSTED)."""

    def __init__(self, queued: int, rows: int, limit: int) -> None:
        self.reason = (
            f"the server is full: {queued} examples are waiting for the model and this request's {rows} would pass "
            f"its limit of {limit} (--max-queued-examples); retry shortly, or send from fewer clients at once"
        )
        super().__init__(self.reason)


class JoinedCallFailed(Exception):
    """The model call that joined this request with others failed, other than by refusing their input (which is
    answered request by request): each of its requests gets a 5xx saying so."""

    def __init__(self, requests: int, examples: int, error: BaseException) -> None:
        self.reason = (
            f"the model call failed for a batch of {requests} requests ({examples} examples) joined by "
            f"--max-batch-size, this one among them: {first_line(error)[:500]}"
        )
        super().__init__(self.reason)


# What a request's arrays must agree on with the others in its batch, beside the signature: each input's name, its
# shape past the rows and its dtype.
InputLayout = tuple[tuple[str, tuple[int, ...], str], ...]


@dataclasses.dataclass
class _Waiting:
    arrays: dict[str, np.ndarray]
    rows: int
    answer: asyncio.Future[dict[str, np.ndarray]]
    admitted: float  # time.perf_counter()


@dataclasses.dataclass
class _Batch:
    signature: Signature
    layout: InputLayout | None  # None: it runs alone
    deadline: float  # loop time: dispatched by then even if not full, once the model is free
    waiting: list[_Waiting] = dataclasses.field(default_factory=list)
    rows: int = 0
    closed: bool = False  # full, or nothing more fits: dispatched as soon as the model is free


def rows_of(arrays: dict[str, np.ndarray]) -> int | None:
    """The number of examples in a checked request (its inputs agree on it), None when an input has no rows axis."""
    if not arrays or any(array.ndim == 0 for array in arrays.values()):
        return None
    return int(next(iter(arrays.values())).shape[0])


def layout_of(arrays: dict[str, np.ndarray]) -> InputLayout:
    return tuple((name, array.shape[1:], array.dtype.str) for name, array in sorted(arrays.items()))


def joined_call(signature: Signature, requests: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """One model call on the requests' rows joined, each request's outputs split back out in order."""
    if len(requests) == 1:
        return [signature.run(requests[0])]
    joined = {name: np.concatenate([arrays[name] for arrays in requests]) for name in requests[0]}
    outputs = signature.run(joined)
    total = sum(int(next(iter(arrays.values())).shape[0]) for arrays in requests)
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise RuntimeError(
                f"output {name!r} has shape {list(array.shape)} for {total} joined examples: this model's outputs do "
                f"not keep one row per example, so its requests cannot be joined; serve it without --max-batch-size"
            )
    answers, start = [], 0
    for arrays in requests:
        end = start + int(next(iter(arrays.values())).shape[0])
        answers.append({name: array[start:end] for name, array in outputs.items()})
        start = end
    return answers


class Batcher:
    """The queue of waiting requests and the one task that calls the model on their batches."""

    def __init__(self, options: BatchingOptions) -> None:
        self.options = options
        self._queue: collections.deque[_Batch] = collections.deque()
        self._open: dict[tuple[Signature, InputLayout], _Batch] = {}  # the newest batch of each kind still taking rows
        self._queued = 0  # examples waiting, the head batch's included until its call starts
        QUEUED_EXAMPLES.set_function(lambda: self._queued)  # read when /metrics is scraped, not set per request
        self._changed: asyncio.Event | None = None
        self._dispatcher: asyncio.Task[None] | None = None

    @property
    def queued_examples(self) -> int:
        return self._queued

    async def run(self, signature: Signature, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The signature's outputs for this request's checked inputs, computed in a batch with others."""
        rows = rows_of(arrays)
        size = rows if rows is not None else 1
        if self._queued and self._queued + size > self.options.max_queued_examples:
            REQUESTS_SHED.inc()
            raise QueueFull(self._queued, size, self.options.max_queued_examples)
        loop = asyncio.get_running_loop()
        if self._dispatcher is None or self._dispatcher.done():
            self._changed = asyncio.Event()
            self._dispatcher = loop.create_task(self._dispatch(), name="batcher")
        waiting = _Waiting(arrays, size, loop.create_future(), time.perf_counter())
        batch = self._batch_for(signature, arrays, rows, loop.time())
        batch.waiting.append(waiting)
        batch.rows += size
        if batch.layout is not None and batch.rows >= self.options.max_batch_size:
            self._close(batch)
        self._queued += size
        head = self._queue[0]
        if head.closed or (head is batch and len(batch.waiting) == 1):
            assert self._changed is not None
            self._changed.set()  # a new head batch, or one ready to go: the dispatcher looks again
        return await waiting.answer

    def _batch_for(self, signature: Signature, arrays: dict[str, np.ndarray], rows: int | None, now: float) -> _Batch:
        deadline = now + self.options.timeout_seconds
        if rows is None or rows == 0 or rows > self.options.max_batch_size:
            alone = _Batch(signature, None, deadline, closed=True)
            self._queue.append(alone)
            return alone
        key = (signature, layout_of(arrays))
        batch = self._open.get(key)
        if batch is not None and batch.rows + rows <= self.options.max_batch_size:
            return batch
        if batch is not None:
            self._close(batch)  # this request does not fit: the batch goes as it is, as TF Serving's does
        batch = _Batch(signature, key[1], deadline)
        self._queue.append(batch)
        self._open[key] = batch
        return batch

    def _close(self, batch: _Batch) -> None:
        batch.closed = True
        if batch.layout is not None and self._open.get((batch.signature, batch.layout)) is batch:
            del self._open[(batch.signature, batch.layout)]

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        changed = self._changed
        assert changed is not None
        while True:
            if not self._queue:
                changed.clear()
                await changed.wait()
                continue
            head = self._queue[0]
            if not head.closed and loop.time() < head.deadline - TIMER_SLACK_SECONDS:
                changed.clear()
                timer = loop.call_at(head.deadline - TIMER_SLACK_SECONDS, changed.set)
                await changed.wait()
                timer.cancel()
                continue
            self._queue.popleft()
            self._close(head)
            self._queued -= head.rows
            await self._call(head, loop)

    async def _call(self, batch: _Batch, loop: asyncio.AbstractEventLoop) -> None:
        started = time.perf_counter()
        for waiting in batch.waiting:
            QUEUE_WAIT_SECONDS.observe(started - waiting.admitted)
        BATCH_EXAMPLES.observe(batch.rows)
        BATCH_REQUESTS.observe(len(batch.waiting))
        await self._answer(batch.signature, batch.waiting, loop)
        BATCH_CALL_SECONDS.observe(time.perf_counter() - started)

    async def _answer(
        self, signature: Signature, group: list[_Waiting], loop: asyncio.AbstractEventLoop, refused: bool = False
    ) -> bool:
        """Calls the model on the group's requests joined and answers each; returns whether the model took them all.
        When it refuses their joined input, each half is answered apart in the same way, so only a request it refuses
        alone gets a refusal, its own; `refused`: the group is known to be refused whole, so it is split at once."""
        if not refused:
            try:
                answers = await loop.run_in_executor(
                    None, joined_call, signature, [waiting.arrays for waiting in group]
                )
            except InvalidInput as error:
                if len(group) == 1:
                    self._fail(group, error)
                    return False
            except Exception as error:  # noqa: BLE001 (every request of the call must be answered, whatever failed)
                self._fail(group, error)
                return False
            else:
                for waiting, answer in zip(group, answers, strict=True):
                    if not waiting.answer.done():  # done: the client went away while it waited
                        waiting.answer.set_result(answer)
                return True
        half = len(group) // 2
        SPLIT_CALLS.inc()
        first_taken = await self._answer(signature, group[:half], loop)
        # The whole refused and its first half taken: the second holds the refusal, so it is not called whole again.
        await self._answer(signature, group[half:], loop, refused=first_taken and len(group) - half > 1)
        return False

    def _fail(self, group: list[_Waiting], error: BaseException) -> None:
        if len(group) == 1:
            failure: BaseException = error  # alone, the request gets what it would get unbatched
        else:
            failure = JoinedCallFailed(len(group), sum(waiting.rows for waiting in group), error)
            log.error("%s", failure.reason, exc_info=error)
        for waiting in group:
            if not waiting.answer.done():
                waiting.answer.set_exception(failure)


def describe(options: BatchingOptions | None) -> str:
    """The batching settings in the server's start-up line."""
    if options is None:
        return "batching off"
    return (
        f"batching up to {options.max_batch_size} examples a call, waiting at most "
        f"{options.timeout_seconds * 1000:g} ms, refusing past {options.max_queued_examples} waiting examples"
    )
