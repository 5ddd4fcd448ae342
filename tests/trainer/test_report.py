"""The status (file, HTTP, Prometheus) and its one-screen view speak the task's metric names, whatever they are."""

from trainer.artifacts.layout import ModelDir
from trainer.reporting.status import StatusReporter, read_status, render


def test_the_status_has_a_gauge_and_a_line_for_each_of_the_tasks_metrics(tmp_path):
    status = StatusReporter(ModelDir(str(tmp_path)), enabled=True)
    status.update(state="running", metric_names=["loss", "mae"], loss=0.5, mae=0.25)
    status.update(test_loss=0.4, test_mae=0.2)
    text = status.metrics_text().decode()
    for line in ("trainer_loss 0.5", "trainer_mae 0.25", "trainer_test_loss 0.4", "trainer_test_mae 0.2"):
        assert line in text, text
    assert "accuracy" not in text
    view = render(read_status(str(tmp_path)))
    assert "training     loss 0.5000  mae 0.2500" in view and "test         loss 0.4000  mae 0.2000" in view
