"""Stops the replicas' process groups when the runner dies, however it dies.

Started by the runner with the read end of a pipe as stdin; the runner writes "+PGID" when a replica
starts and "-PGID" when it has ended. End of file means the runner has gone: every group still
registered gets SIGTERM, then SIGKILL after the grace period. The runner starts it with
`python -m scripts.localrun.watchdog GRACE_S` through `Watchdog`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from scripts.common.processes import group_alive, signal_group
from scripts.common.settings import ROOT


def main() -> int:
    grace_s = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    groups: set[int] = set()
    for line in sys.stdin:
        line = line.strip()
        if line.startswith("+"):
            groups.add(int(line[1:]))
        elif line.startswith("-"):
            groups.discard(int(line[1:]))
    groups = {g for g in groups if group_alive(g)}
    if not groups:
        return 0
    print(
        f"run-local watchdog: the runner is gone; stopping process groups {sorted(groups)}", file=sys.stderr, flush=True
    )
    for pgid in groups:
        signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(group_alive(g) for g in groups):
        time.sleep(0.1)
    for pgid in groups:
        signal_group(pgid, signal.SIGKILL)
    return 0


class Watchdog:
    """A separate process that stops every registered process group when the runner's pipe closes."""

    def __init__(self, grace_s: float):
        read_fd, write_fd = os.pipe()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", __name__, str(grace_s)], stdin=read_fd, cwd=ROOT, start_new_session=True
        )
        os.close(read_fd)
        self._pipe = os.fdopen(write_fd, "w", buffering=1)

    def _send(self, line: str) -> None:
        try:
            self._pipe.write(line + "\n")
        except BrokenPipeError:
            pass

    def watch(self, pgid: int) -> None:
        self._send(f"+{pgid}")

    def forget(self, pgid: int) -> None:
        self._send(f"-{pgid}")

    def close(self) -> None:
        """Normal end: nothing is registered any more, so the watchdog exits on EOF."""
        try:
            self._pipe.close()
        except BrokenPipeError:
            pass
        self._proc.wait()


if __name__ == "__main__":
    sys.exit(main())
