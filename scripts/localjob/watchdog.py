"""Stops the replicas' process groups when the runner dies, however it dies.

Started by the runner with the read end of a pipe as stdin; the runner writes "+PGID" when a replica
starts and "-PGID" when it has ended. End of file means the runner has gone: every group still
registered gets SIGTERM, then SIGKILL after the grace period. Run as a script, beside processes.py.
"""

import signal
import sys
import time

# Run as a script, so its own directory is on sys.path: the group helpers are the runner's own.
from processes import group_alive, signal_group


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
    print(f"run-local watchdog: the runner is gone; stopping process groups {sorted(groups)}",
          file=sys.stderr, flush=True)
    for pgid in groups:
        signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(group_alive(g) for g in groups):
        time.sleep(0.1)
    for pgid in groups:
        signal_group(pgid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
