"""Two "machines" on one host: a network namespace each, joined by a veth pair whose rate the bench sets.

Everything is made inside namespaces this module creates: the veth ends are created directly in them (never in
the host's namespace) and carry 10.x addresses that exist only there, so the host's interfaces, routes and
qdiscs are never touched. The namespaces are named `tfbench-<pid>-<i>`; leaving `linked_namespaces` removes them
(and with them the veth pair and its qdiscs) on every exit path: return, exception, Ctrl-C, SIGTERM, SIGHUP.
A bench killed with SIGKILL leaves its namespaces behind; the next one removes those whose process is gone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator

PREFIX = "tfbench"
SUBNET = "10.213.0"
VETH = ("tfb0", "tfb1")
# tbf's bucket: this long at the rate, and never under 64 KiB (a TSO segment must fit in it).
BURST_SECONDS = 0.001
MIN_BURST_BYTES = 64 * 1024
# tbf's queue: packets may wait this long before tbf drops them (TCP then backs off).
QUEUE_LATENCY = "100ms"


class NamespaceError(RuntimeError):
    """An `ip` or `tc` command failed; the message holds the command and its error."""


@dataclasses.dataclass(frozen=True)
class Link:
    """Two namespaces and the address of each; `run_in(i, argv)` is argv as run inside namespace i."""

    namespaces: tuple[str, str]

    @property
    def addresses(self) -> tuple[str, str]:
        return (f"{SUBNET}.1", f"{SUBNET}.2")

    def run_in(self, index: int, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[index], *argv]

    def set_rate(self, rate_bits: float | None) -> None:
        """Both ends' egress limited to rate_bits per second with tbf; None removes the limit."""
        for namespace, device in zip(self.namespaces, VETH, strict=True):
            if rate_bits is None:
                _ip(["netns", "exec", namespace, "tc", "qdisc", "del", "dev", device, "root"], missing_ok=True)
                continue
            burst = max(MIN_BURST_BYTES, int(rate_bits / 8 * BURST_SECONDS))
            _ip(
                ["netns", "exec", namespace, "tc", "qdisc", "replace", "dev", device, "root", "tbf",
                 "rate", f"{int(rate_bits)}bit", "burst", str(burst), "latency", QUEUE_LATENCY],
            )  # fmt: skip

    def qdiscs(self) -> list[str]:
        """Each end's root qdisc as `tc` prints it (the bench records what it ran under)."""
        return [
            _ip(["netns", "exec", namespace, "tc", "qdisc", "show", "dev", device]).strip()
            for namespace, device in zip(self.namespaces, VETH, strict=True)
        ]


def unavailable() -> str | None:
    """Why namespaces cannot be made here (one line), or None when they can."""
    if sys.platform != "linux":
        return f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return "making network namespaces needs root (run the bench as root, or in CI)"
    missing = [tool for tool in ("ip", "tc", "taskset") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found: install iproute2 (ip, tc) and util-linux (taskset)"
    return None


def ours() -> list[str]:
    """The namespaces on this host that a bench made (alive or not)."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    return [line.split()[0] for line in listing.splitlines() if line.startswith(f"{PREFIX}-")]


def remove_orphans() -> list[str]:
    """Deletes namespaces left by benches whose process is gone (killed with SIGKILL); returns their names."""
    removed = []
    for name in ours():
        match = re.fullmatch(rf"{PREFIX}-(\d+)-\d+", name)
        if match and not _alive(int(match.group(1))):
            _ip(["netns", "del", name], missing_ok=True)
            removed.append(name)
    return removed


@contextlib.contextmanager
def linked_namespaces() -> Iterator[Link]:
    """Two namespaces with loopback up, joined by a veth pair (SUBNET.1 and .2), no rate limit yet; removed
    again on leaving, whatever the way out. SIGTERM and SIGHUP unwind like Ctrl-C while inside."""
    remove_orphans()
    names = (f"{PREFIX}-{os.getpid()}-0", f"{PREFIX}-{os.getpid()}-1")
    previous = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGHUP)}
    for number in previous:
        signal.signal(number, _exit_on_signal)
    try:
        for name in names:
            _ip(["netns", "add", name])
        # Created in the namespaces themselves: the host's namespace never holds either end.
        _ip(["link", "add", VETH[0], "netns", names[0], "type", "veth", "peer", "name", VETH[1], "netns", names[1]])
        link = Link(names)
        for index, (name, device) in enumerate(zip(names, VETH, strict=True)):
            _ip(["-n", name, "link", "set", "lo", "up"])
            _ip(["-n", name, "addr", "add", f"{link.addresses[index]}/24", "dev", device])
            _ip(["-n", name, "link", "set", device, "up"])
        yield link
    finally:
        for name in names:
            _ip(["netns", "del", name], missing_ok=True)
        for number, handler in previous.items():
            signal.signal(number, handler)


def _exit_on_signal(number: int, _frame: object) -> None:
    raise SystemExit(128 + number)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ip(args: list[str], missing_ok: bool = False) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        if missing_ok:
            return ""
        raise NamespaceError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout
