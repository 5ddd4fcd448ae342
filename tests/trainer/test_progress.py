"""Progress output: a bar that rewrites itself on a terminal, plain lines in pod logs."""

import io

from trainer.reporting.progress import Progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_pod_logs_get_one_plain_line_per_report():
    stream = io.StringIO()
    progress = Progress(total_steps=20, steps_per_epoch=10, epochs=2, stream=stream)
    progress.step(10, {"loss": 0.5, "accuracy": 0.75}, None)
    progress.step(15, {"loss": 0.25, "accuracy": 0.875}, 1234.0)
    progress.epoch_done(2, {"loss": 0.25, "accuracy": 0.875}, {"loss": 0.5, "accuracy": 0.75})
    lines = stream.getvalue().splitlines()
    assert lines == [
        "epoch 1/2 step 10/10 (global 10/20) loss 0.5000 accuracy 0.7500 warming up",
        "epoch 2/2 step 5/10 (global 15/20) loss 0.2500 accuracy 0.8750 1,234 ex/s",
        "epoch 2/2 done: train loss 0.2500 accuracy 0.8750 | test loss 0.5000 accuracy 0.7500",
    ]
    assert "\r" not in stream.getvalue()


def test_a_terminal_gets_a_bar_redrawn_in_place():
    stream = Terminal()
    progress = Progress(total_steps=10, steps_per_epoch=10, epochs=1, stream=stream)
    progress.step(5, {"loss": 1.0, "accuracy": 0.5}, 100.0)
    progress.step(10, {"loss": 0.5, "accuracy": 0.9}, 100.0)
    progress.line("done")
    text = stream.getvalue()
    assert text.count("\r") == 2 and "[" + "=" * 15 + "." * 15 + "]" in text and "[" + "=" * 30 + "]" in text
    assert text.endswith("\ndone\n")


def test_quiet_workers_print_nothing():
    stream = io.StringIO()
    progress = Progress(total_steps=10, steps_per_epoch=10, epochs=1, enabled=False, stream=stream)
    progress.step(5, {"loss": 1.0}, 100.0)
    progress.line("x")
    assert stream.getvalue() == ""
