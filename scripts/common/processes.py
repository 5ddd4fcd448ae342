"""Process groups for local training processes (run-local's replicas, bench's workers, the tests' groups).

Each process runs in a session and process group of its own (the local stand-in for a pod), so a
stop reaches everything it started. PR_SET_PDEATHSIG kills one if its parent dies (Linux).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from trainer.settings.options import ENV_PREFIX

PR_SET_PDEATHSIG = 1


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


def spawn(argv: Sequence[str], env: Mapping[str, str], cwd: str, output: Any = subprocess.PIPE) -> subprocess.Popen:
    """A replica in its own process group, its stdout and stderr on one pipe (or into output, an open file)."""
    return subprocess.Popen(
        list(argv),
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_die_with(os.getpid()),
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


def inherited_environment() -> dict[str, str]:
    """This shell's environment minus what would change what a training process does (a pod has neither)."""
    return {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith(ENV_PREFIX)}


def peak_rss_bytes(usage: Any) -> int:
    """Peak resident memory from a `resource.getrusage` or `os.wait4` result (kilobytes on Linux, bytes on macOS)."""
    return usage.ru_maxrss if sys.platform == "darwin" else usage.ru_maxrss * 1024
