"""Progress lines from the chief (a live bar on a terminal, plain lines in pod logs) and the throughput meter."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import TextIO


def figures(metrics: dict[str, float]) -> str:
    """'loss 0.3120 mae 0.2010': each metric by name, as the progress lines print them."""
    return " ".join(f"{name} {value:.4f}" for name, value in metrics.items())


class Progress:
    def __init__(
        self, total_steps: int, steps_per_epoch: int, epochs: int, enabled: bool = True, stream: TextIO | None = None
    ) -> None:
        self.total_steps = total_steps
        self.steps_per_epoch = steps_per_epoch
        self.epochs = epochs
        self.enabled = enabled
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty()
        self._bar_open = False

    def step(
        self, step: int, metrics: dict[str, float], examples_per_second: float | None, skipped_steps: int = 0
    ) -> None:
        """Reports training progress at global step `step` (1-based count of finished steps), with the task's
        training metrics by name, and the steps skipped for non-finite values so far (where there are any)."""
        if not self.enabled:
            return
        epoch = self.epoch_of(step)
        in_epoch = step - (epoch - 1) * self.steps_per_epoch
        speed = f"{examples_per_second:,.0f} ex/s" if examples_per_second else "warming up"
        text = (
            f"epoch {epoch}/{self.epochs} step {in_epoch}/{self.steps_per_epoch} "
            f"(global {step}/{self.total_steps}) {figures(metrics)} {speed}"
            + (f", {skipped_steps} steps skipped (non-finite)" if skipped_steps else "")
        )
        if self.live:
            filled = int(30 * in_epoch / self.steps_per_epoch)
            self.stream.write(f"\r[{'=' * filled}{'.' * (30 - filled)}] {text}\x1b[K")
            self._bar_open = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def epoch_of(self, step: int) -> int:
        """The 1-based epoch of global step `step` (a count of finished steps)."""
        return min(self.epochs, (step - 1) // self.steps_per_epoch + 1)

    def epoch_done(self, epoch: int, train: dict[str, float], test: dict[str, float]) -> None:
        """The line that closes an epoch: its train and test metrics by name."""
        self.line(f"epoch {epoch}/{self.epochs} done: train {figures(train)} | test {figures(test)}")

    def line(self, text: str) -> None:
        """A line that stays, e.g. an epoch's test results."""
        if not self.enabled:
            return
        if self._bar_open:
            self.stream.write("\n")
            self._bar_open = False
        self.stream.write(text + "\n")
        self.stream.flush()


class Startup:
    """Seconds from process start to each start-up milestone: where the time to the first step goes."""

    def __init__(self, started_at: float) -> None:
        self.started_at = started_at
        self.seconds: dict[str, float] = {}

    def reached(self, milestone: str) -> None:
        self.seconds[milestone] = round(time.time() - self.started_at, 3)


class Throughput:
    """Examples per second between log points, the steady rate over the run, and the time to the first step.

    Wall-clock time between log points: checkpoints, metric reads and status writes count; time inside
    `paused()` (evaluation) does not. The first interval after a (re)start is warm-up (tracing) and is left out.
    """

    def __init__(self, global_batch_size: int, startup: Startup) -> None:
        self.global_batch_size = global_batch_size
        self.startup = startup
        self._interval_started = time.perf_counter()
        self._interval_steps = 0
        self._intervals = 0
        self._steady_seconds = 0.0
        self._steady_steps = 0

    def ran(self, steps: int) -> None:
        """Counts `steps` finished training steps (none yet while the async mode's first calls are in flight)."""
        self._interval_steps += steps
        if steps and not self.ran_a_step:
            self.startup.reached("first_step")

    @property
    def ran_a_step(self) -> bool:
        return "first_step" in self.startup.seconds

    @property
    def time_to_first_step(self) -> float | None:
        """Seconds from process start to the first finished step (after a restart: this process's start)."""
        return self.startup.seconds.get("first_step")

    def end_interval(self) -> float | None:
        """Closes the interval since the last call: its examples/s, or None for the warm-up interval."""
        seconds = time.perf_counter() - self._interval_started
        speed = self._interval_steps * self.global_batch_size / seconds if self._intervals else None
        if self._intervals:
            self._steady_seconds += seconds
            self._steady_steps += self._interval_steps
        self._interval_started, self._interval_steps, self._intervals = time.perf_counter(), 0, self._intervals + 1
        return speed

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent inside does not count towards the current interval."""
        paused_at = time.perf_counter()
        try:
            yield
        finally:
            self._interval_started += time.perf_counter() - paused_at

    @property
    def steady_examples_per_second(self) -> float | None:
        """Examples/s over every interval after the warm-up; None before the second log point."""
        return self._steady_steps * self.global_batch_size / self._steady_seconds if self._steady_steps else None
