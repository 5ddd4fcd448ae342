"""`python -m worker_lost_in_copy WORKER_PID` is an async chief (TF_CONFIG) that kills its one worker in the window
ClusterCoordinator leaves between a call finishing and its own thread copying the call's output to the chief, then
fetches the output as the trainer does (async_runner.fetch_output). It prints "worker killed" (restart the worker
then) and, once fetched, "fetched V". The coordinator's copy is held back a few seconds to make the window wide enough
to kill in; everything else is TensorFlow's own."""

import os
import pathlib
import signal
import sys
import threading
import time

from trainer.reporting import tf_log_filter

tf_log_filter.install()  # as python -m trainer does, before TensorFlow is imported

import tensorflow as tf  # noqa: E402
from tensorflow.python.distribute.coordinator import values  # noqa: E402

from trainer.distribution.cluster import from_environment  # noqa: E402
from trainer.ps.async_runner import fetch_output  # noqa: E402
from trainer.ps.strategy import create_parameter_server_strategy  # noqa: E402

HOLD_SECONDS = 5.0  # how long the coordinator's first copy waits: the worker is killed and the chief fetches meanwhile

finished = threading.Event()
armed = threading.Event()
_set_values, _get = values.RemoteValueImpl._set_values, values.RemoteValueImpl.get


def set_values(self, tensors):
    _set_values(self, tensors)
    finished.set()


def get(self):
    if armed.is_set() and threading.current_thread() is not threading.main_thread():
        armed.clear()  # only the first copy: the call's run again afterwards goes as usual
        time.sleep(HOLD_SECONDS)
    return _get(self)


def kill_and_wait(pid: int) -> None:
    """SIGKILLs the process group `pid` and waits until the process is gone or a zombie (its sockets closed)."""
    os.killpg(pid, signal.SIGKILL)
    while True:
        try:
            state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.01)


def main(worker_pid: int) -> None:
    strategy, coordinator = create_parameter_server_strategy(from_environment(), startup_timeout=120)
    with strategy.scope():
        variable = tf.Variable([1.0, 2.0, 3.0])

    @tf.function
    def call():
        return variable * 2.0

    print("warm-up", fetch_output(coordinator.schedule(call)).tolist(), flush=True)
    values.RemoteValueImpl._set_values, values.RemoteValueImpl.get = set_values, get
    finished.clear()
    armed.set()
    scheduled = coordinator.schedule(call)
    assert finished.wait(60), "the call never finished"
    kill_and_wait(worker_pid)
    print("worker killed", flush=True)
    print("fetched", fetch_output(scheduled).tolist(), flush=True)
    os._exit(0)  # the coordinator's threads do not stop on their own


if __name__ == "__main__":
    main(int(sys.argv[1]))
