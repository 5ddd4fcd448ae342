"""The server's heap is frozen out of the garbage collector's scans once a version is loaded (its full collections
stopped the whole server for hundreds of milliseconds: docs/bench-log.md), and after a swap it is thawed, collected and
frozen again, so the old version's objects (TensorFlow's hold cycles, which only the collector frees) are freed rather
than kept for good. In process, on the rows model: what is checked is which objects the collector frees, not time."""

from __future__ import annotations

import gc
import weakref

import pytest

from model_server import ServerProcess, metrics, publish_version, save_rows_model


class Timers:
    """threading.Timer, recording what is scheduled instead of running it in this test process later."""

    def __init__(self) -> None:
        self.scheduled: list[tuple[float, object]] = []

    def __call__(self, seconds: float, function: object) -> Timers:
        self.scheduled.append((seconds, function))
        return self

    def start(self) -> None:
        pass


@pytest.mark.slow  # full collections of the test process's heap, as large as what ran before it there
def test_the_old_versions_cycles_are_freed_when_the_heap_is_frozen_again_after_a_swap(tmp_path, monkeypatch):
    from trainer.serving import model as model_module
    from trainer.serving.model import REFREEZE_AFTER_SWAP_SECONDS, SavedModelVersions, freeze_heap

    timers = Timers()
    monkeypatch.setattr(model_module.threading, "Timer", timers)
    base_path = tmp_path / "serving"
    save_rows_model(base_path / "1", factor=2.0)
    save_rows_model(tmp_path / "tripling", factor=3.0)
    model = SavedModelVersions("rows", str(base_path), poll_seconds=60)
    try:
        model.load()
        assert gc.get_freeze_count() > 0
        # An operation of the old version's graph: TensorFlow's graphs hold cycles, which only the collector frees.
        old = weakref.ref(model.served.signature.function.graph.get_operations()[0])
        publish_version(tmp_path / "tripling", base_path, 2)
        model.watcher.check_once()  # the swap, as the watcher thread makes it
        assert model.served.version == 2
        gc.collect()
        assert old() is not None, "frozen, the old version's cycles outlive a collection: nothing to test"
        assert timers.scheduled == [(REFREEZE_AFTER_SWAP_SECONDS, freeze_heap)]  # the swap's refreeze, for later
        timers.scheduled[0][1]()
        assert old() is None, "the old version was kept"
    finally:
        gc.unfreeze()


@pytest.mark.slow
def test_a_served_model_reports_its_frozen_heap(tmp_path):
    base_path = tmp_path / "serving"
    save_rows_model(base_path / "1", factor=2.0)
    server = ServerProcess(base_path, "rows", tmp_path / "server.log").wait_ready()
    try:
        frozen = metrics(server)["serving_heap_frozen_objects"]
    finally:
        server.stop()
    assert frozen > 10_000, frozen  # TensorFlow's, KServe's and the model's objects
