"""SIGTERM, which Kubernetes sends before it kills a pod, as a request to checkpoint and stop.

The handler only sets a flag. The training loop all-reduces the flag with every
tf.function call, so when any one worker is told to stop, all of them save the
same step together and exit with a code the TFJob's restartPolicy retries.
"""

from __future__ import annotations

import logging
import signal

log = logging.getLogger(__name__)


class Preempted(Exception):
    """Training stopped at a saved checkpoint because a worker received SIGTERM."""


class StopSignal:
    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        if not self.requested:
            log.warning("SIGTERM received: the group will checkpoint at the next step and exit")
        self.requested = True
