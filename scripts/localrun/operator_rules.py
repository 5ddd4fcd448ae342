"""What every engine's rules decide about (k8s/engines/<engine>/local_rules.py: the training operator's for a TFJob,
JobSet's for a JobSet): a replica, one pod, and its phase and restarts; the kubelet's crash-loop back-off for a
container it restarts in place; the job's conditions; and what happens after an exit (`Outcome`)."""

from __future__ import annotations

import dataclasses

# The kubelet's crash-loop back-off: first restart at once, then 10 s doubling to 5 min, reset after 10 min.
KUBELET_BACKOFF_INITIAL_S = 10.0
KUBELET_BACKOFF_MAX_S = 300.0


def exit_code_of(returncode: int) -> int:
    """A process killed by signal n reports 128+n, as the kubelet reports a container's exit."""
    return 128 - returncode if returncode < 0 else returncode


class KubeletBackoff:
    """Delay before the kubelet restarts a crashed container in place (restartPolicy OnFailure/Always)."""

    def __init__(self) -> None:
        self._backoff: float | None = None
        self._last_update = 0.0

    def delay(self, finished_at: float) -> float:
        if self._backoff is None or finished_at - self._last_update > 2 * KUBELET_BACKOFF_MAX_S:
            self._backoff = KUBELET_BACKOFF_INITIAL_S
            self._last_update = finished_at
            return 0.0
        wait = self._backoff
        self._backoff = min(self._backoff * 2, KUBELET_BACKOFF_MAX_S)
        self._last_update = finished_at + wait
        return wait


@dataclasses.dataclass
class Replica:
    rtype: str
    index: int
    restart_policy: str = "Never"
    phase: str = "Pending"  # Pending, Running, Succeeded, Failed (the pod's phase)
    restart_count: int = 0  # in-place container restarts of the current pod
    recreations: int = 0  # pods the operator deleted and created again (ExitCode)
    in_place_restarts: int = 0  # every kubelet restart, across pods
    exit_codes: list[int] = dataclasses.field(default_factory=list)
    backoff: KubeletBackoff = dataclasses.field(default_factory=KubeletBackoff)

    @property
    def name(self) -> str:
        return f"{self.rtype.lower()}-{self.index}"

    @property
    def restarts(self) -> int:
        return self.in_place_restarts + self.recreations

    def end(self, exit_code: int) -> None:
        """Nothing restarts the container: the pod ends in the phase its exit code gives."""
        self.phase = "Succeeded" if exit_code == 0 else "Failed"


@dataclasses.dataclass(frozen=True)
class Condition:
    type: str  # Created, Running, Restarting, Succeeded, Failed
    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What happens after a replica exits: restart it in place after a delay, recreate it, restart the whole group
    (every replica stopped, then all started again: JobSet's RestartJobSet), or none of these."""

    restart_after: float | None = None
    recreate: bool = False
    restart_group: bool = False
    condition: Condition | None = None
    note: str = ""
