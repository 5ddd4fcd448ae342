import pytest
import tensorflow as tf

from multiworker import free_ports
from trainer.artifacts.layout import ModelDir
from trainer.reporting import status

# Two logical CPUs before any test starts TensorFlow's runtime: in-process training runs two replicas, so
# replica-context code (the loss scaling, dropout, synchronized batch norm) runs as it does in a group.
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2
)


@pytest.fixture
def status_server(tmp_path, monkeypatch):
    """Starts a chief's status server on a free port, under the limits given (status_server(MAX_CONNECTIONS=3)), its
    status running at step 7; closed after the test."""
    started = []

    def start(**limits):
        for name, value in limits.items():
            monkeypatch.setattr(status, name, value)
        reporter = status.StatusReporter(ModelDir(str(tmp_path)), enabled=True)
        reporter.update(state="running", global_step=7)
        reporter.serve("127.0.0.1", free_ports(1)[0])
        started.append(reporter)
        return reporter

    yield start
    for reporter in started:
        reporter.close()
