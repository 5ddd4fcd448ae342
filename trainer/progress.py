"""Progress lines from the chief: a live bar on a terminal, plain lines in pod logs."""

from __future__ import annotations

import sys
from typing import TextIO


class Progress:
    def __init__(self, total_steps: int, steps_per_epoch: int, epochs: int,
                 enabled: bool = True, stream: TextIO | None = None) -> None:
        self.total_steps = total_steps
        self.steps_per_epoch = steps_per_epoch
        self.epochs = epochs
        self.enabled = enabled
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty()
        self._bar_open = False

    def step(self, step: int, loss: float, accuracy: float, examples_per_second: float | None) -> None:
        """Reports training progress at global step `step` (1-based count of finished steps)."""
        if not self.enabled:
            return
        epoch = self.epoch_of(step)
        in_epoch = step - (epoch - 1) * self.steps_per_epoch
        speed = f"{examples_per_second:,.0f} ex/s" if examples_per_second else "warming up"
        text = (f"epoch {epoch}/{self.epochs} step {in_epoch}/{self.steps_per_epoch} "
                f"(global {step}/{self.total_steps}) loss {loss:.4f} accuracy {accuracy:.4f} {speed}")
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

    def line(self, text: str) -> None:
        """A line that stays, e.g. an epoch's test results."""
        if not self.enabled:
            return
        if self._bar_open:
            self.stream.write("\n")
            self._bar_open = False
        self.stream.write(text + "\n")
        self.stream.flush()
