"""Starting and stopping replica processes so that none outlives the runner.

Each replica runs in a session and process group of its own (the local stand-in for a pod), so a
stop reaches everything it started. PR_SET_PDEATHSIG kills a replica if the runner dies (Linux), and
the watchdog process (watchdog.py) stops the groups if the runner is killed with SIGKILL anywhere.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import pathlib
import signal
import subprocess
import sys
from typing import Mapping, Sequence

PR_SET_PDEATHSIG = 1
_WATCHDOG = pathlib.Path(__file__).with_name("watchdog.py")


def _load_prctl():
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    return libc.prctl


_PRCTL = _load_prctl()


def _die_with(parent_pid: int):
    def in_child() -> None:
        if _PRCTL is not None:
            _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # The runner may have died between fork and prctl: then nobody would send the signal.
        if os.getppid() != parent_pid:
            os._exit(128 + signal.SIGKILL)
    return in_child


def spawn(argv: Sequence[str], env: Mapping[str, str], cwd: str) -> subprocess.Popen:
    """A replica in its own process group, its stdout and stderr on one pipe."""
    return subprocess.Popen(
        list(argv), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with(os.getpid()),
    )


def signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Watchdog:
    """A separate process that stops every registered process group when the runner's pipe closes."""

    def __init__(self, grace_s: float):
        read_fd, write_fd = os.pipe()
        self._proc = subprocess.Popen([sys.executable, str(_WATCHDOG), str(grace_s)], stdin=read_fd,
                                      start_new_session=True)
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
