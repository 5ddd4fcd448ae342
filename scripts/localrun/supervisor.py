"""Runs a job's replicas as local processes and applies the engine's rules (the training operator's for a TFJob,
JobSet's for a JobSet or a TrainJob) to every exit.

One thread, one select loop: replica output, signals (through a wake-up pipe) and timers (restart
back-offs, activeDeadlineSeconds, stop escalation) are handled in order, so no state is shared.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import itertools
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from scripts.common.processes import signal_group, spawn

from .console import Console, LineBuffer
from .operator_rules import Condition, Outcome, Replica, exit_code_of
from .podplan import ProcessPlan
from .watchdog import Watchdog

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def describe_exit(returncode: int) -> str:
    """A Popen returncode in the kubelet's terms: -9 is exit code 137, killed by SIGKILL."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"exit code {exit_code_of(returncode)} (killed by {name})"
    return f"exit code {returncode}"


class Rules(Protocol):
    """What the supervisor asks of an engine's rules (an engine folder's local_rules.py: the TFJob's TFJobRules,
    the JobSet's JobSetRules), or of a batch Job's (batch_job.BatchJobRules)."""

    kind: str
    name: str
    namespace: str
    clean_pod_policy: str
    active_deadline_s: float | None
    progress_conditions: tuple[str, ...]  # the condition types after which the job goes on

    def cleanup(self, running: str) -> str: ...  # what the finished job does to the replicas still running

    def on_exit(self, replica: Replica, exit_code: int, finished_at: float) -> Outcome: ...

    def record_exit(self, replica: Replica, exit_code: int) -> None: ...

    def on_deadline(self, elapsed_s: float) -> Outcome | None: ...

    def begin_attempt(self) -> None: ...


@dataclasses.dataclass
class JobResult:
    condition: Condition | None  # the final Succeeded/Failed condition, None if stopped by a signal first
    stop_signal: int | None
    duration_s: float
    failed_replica: str | None
    last_exit: dict[str, int]
    stopped: set[str]  # replicas the runner stopped (SIGTERM/SIGKILL) rather than ended by themselves


class Supervisor:
    def __init__(
        self,
        rules: Rules,
        replicas: Mapping[str, tuple[Replica, ProcessPlan]],
        console: Console,
        watchdog: Watchdog,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._rules = rules
        self._replicas = dict(replicas)
        self._console = console
        self._watchdog = watchdog
        self._clock = clock
        self._procs: dict[str, subprocess.Popen] = {}
        self._buffers: dict[str, LineBuffer] = {}
        self._timers: list[tuple[float, int, str, str, int]] = []
        self._sequence = itertools.count()
        self._selector = selectors.DefaultSelector()
        self._pending_signals: list[int] = []
        self._condition: Condition | None = None
        self._stop_signal: int | None = None
        self._stopping: set[str] = set()
        self._stopped: set[str] = set()
        self._last_exit: dict[str, int] = {}
        self._last_failure: str | None = None  # frozen once the job has an outcome: then it is the failed replica
        self._start = 0.0
        self._end: float | None = None
        self._regroup = False  # every replica is being stopped, to start again together (a group restart)
        self._attempt_start = 0.0  # when the current attempt began: Jobs count their deadline from it

    # Timers -----------------------------------------------------------------------------------
    def _schedule(self, when: float, kind: str, name: str = "", pid: int = 0) -> None:
        heapq.heappush(self._timers, (when, next(self._sequence), kind, name, pid))

    def _cancel(self, kind: str) -> None:
        self._timers = [t for t in self._timers if t[2] != kind]
        heapq.heapify(self._timers)

    # Processes --------------------------------------------------------------------------------
    def _spawn(self, name: str) -> None:
        replica, plan = self._replicas[name]
        proc = spawn(plan.argv, plan.env, plan.cwd)
        self._watchdog.watch(proc.pid)
        fd = proc.stdout.fileno()
        os.set_blocking(fd, False)
        self._selector.register(fd, selectors.EVENT_READ, name)
        self._buffers[name] = LineBuffer()
        self._procs[name] = proc
        replica.phase = "Running"

    def _read(self, name: str, drain: bool = False) -> None:
        proc = self._procs[name]
        fd = proc.stdout.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                return
            if not chunk:
                self._close_output(name)
                return
            self._console.replica(name, self._buffers[name].feed(chunk))
            if not drain:
                return

    def _close_output(self, name: str) -> None:
        proc = self._procs[name]
        self._selector.unregister(proc.stdout.fileno())
        self._console.replica(name, self._buffers[name].flush())
        proc.stdout.close()

    def _stop(self, name: str, now: float) -> None:
        """What deleting a pod does: SIGTERM to everything in it, SIGKILL after the grace period."""
        proc = self._procs[name]
        self._stopping.add(name)
        signal_group(proc.pid, signal.SIGTERM)
        self._schedule(now + self._replicas[name][1].grace_s, "kill", name, proc.pid)

    def _reap(self, now: float) -> None:
        for name, proc in list(self._procs.items()):
            returncode = proc.poll()
            if returncode is None:
                continue
            if not proc.stdout.closed:
                self._read(name, drain=True)
            if not proc.stdout.closed:
                self._close_output(name)
            # A container ends with its main process; nothing it started may stay behind.
            signal_group(proc.pid, signal.SIGKILL)
            self._watchdog.forget(proc.pid)
            del self._procs[name]
            self._on_exit(name, returncode, now)

    def _on_exit(self, name: str, returncode: int, now: float) -> None:
        code = exit_code_of(returncode)
        self._last_exit[name] = code
        replica = self._replicas[name][0]
        if name in self._stopping:
            self._stopping.discard(name)
            self._stopped.add(name)
            self._console.say(f"{name} ended with {describe_exit(returncode)} (stopped)")
            return
        if self._finished_or_stopping():
            # The job's outcome is decided; the pod still gets its phase, as on a cluster.
            self._rules.record_exit(replica, code)
            self._console.say(f"{name} ended with {describe_exit(returncode)} after the job ended")
            return
        outcome = self._rules.on_exit(replica, code, now)
        if code != 0:
            self._last_failure = name
        self._console.say(
            f"{name} ended with {describe_exit(returncode)}" + (f": {outcome.note}" if outcome.note else "")
        )
        if outcome.condition is not None:
            self._set_condition(outcome.condition, now)
        if self._finished_or_stopping():
            return
        self._follow(outcome, name, code, now)

    def _follow(self, outcome: Outcome, name: str, code: int, now: float) -> None:
        """Carries out what the rules decided after replica `name` exited with `code` (or after a deadline)."""
        if outcome.restart_group:
            self._regroup = True
            self._cancel("restart")
            self._cancel("deadline")
            for other in list(self._procs):
                self._stop(other, now)
        elif outcome.recreate:
            self._console.mark(name, f"pod recreated after {describe_exit(code)}")
            self._spawn(name)
        elif outcome.restart_after is not None:
            self._schedule(now + outcome.restart_after, "restart", name)

    def _start_group(self, now: float) -> None:
        """Every replica stopped after a group restart: the rules begin a new attempt and every pod starts again."""
        self._regroup = False
        self._rules.begin_attempt()
        self._console.say(f"every replica has stopped; {self._rules.kind} {self._rules.name} starts them all again")
        for name in self._replicas:
            self._stopped.discard(name)
            self._console.mark(name, "pod created again by the group restart")
            self._spawn(name)
        if self._rules.active_deadline_s is not None:
            self._schedule(now + self._rules.active_deadline_s, "deadline")
        self._attempt_start = now

    # Job state --------------------------------------------------------------------------------
    def _finished_or_stopping(self) -> bool:
        return self._condition is not None or self._stop_signal is not None

    def _set_condition(self, condition: Condition, now: float) -> None:
        self._console.say(f"{condition.type}: {condition.message}")
        if condition.type in self._rules.progress_conditions:
            return
        self._condition = condition
        self._end = now
        self._cancel("restart")
        if self._rules.clean_pod_policy in ("Running", "All") and self._procs:
            # common/job.go DeletePodsAndServices: a finished job's running pods are deleted.
            running = ", ".join(sorted(self._procs))
            self._console.say(self._rules.cleanup(running))
            for name in list(self._procs):
                self._stop(name, now)
        elif condition.type == "Failed":
            if self._procs:
                self._console.say(
                    "cleanPodPolicy None: on a cluster the running pods would keep running after the "
                    "job failed; stopping them here"
                )
            for name in list(self._procs):
                self._stop(name, now)
        else:
            for name, proc in self._procs.items():
                # Under cleanPodPolicy None the cluster lets them finish; here they get one grace period to.
                self._schedule(now + self._replicas[name][1].grace_s, "term", name, proc.pid)

    def _on_signal(self, signum: int, now: float) -> None:
        if self._stop_signal is None:
            self._stop_signal = signum
            self._end = now
            self._cancel("restart")
            grace = max((self._replicas[n][1].grace_s for n in self._procs), default=0)
            self._console.say(
                f"{signal.Signals(signum).name}: stopping every replica (SIGTERM now, SIGKILL after "
                f"{grace:.0f} s; press Ctrl-C again to kill them at once)"
            )
            for name in list(self._procs):
                self._stop(name, now)
        else:
            self._console.say(f"{signal.Signals(signum).name} again: killing every replica now")
            for proc in self._procs.values():
                signal_group(proc.pid, signal.SIGKILL)

    def _run_timers(self, now: float) -> None:
        while self._timers and self._timers[0][0] <= now:
            _, _, kind, name, pid = heapq.heappop(self._timers)
            proc = self._procs.get(name)
            if kind == "restart" and not self._finished_or_stopping():
                replica = self._replicas[name][0]
                self._console.mark(name, f"container restarted by the kubelet (restart {replica.in_place_restarts})")
                self._spawn(name)
            elif kind == "deadline" and not self._finished_or_stopping() and not self._regroup:
                outcome = self._rules.on_deadline(now - self._attempt_start)
                if outcome is not None:
                    if outcome.note:
                        self._console.say(outcome.note)
                    if outcome.condition is not None:
                        self._set_condition(outcome.condition, now)
                    if not self._finished_or_stopping():
                        self._follow(outcome, "", 0, now)
            elif kind == "term" and proc is not None and proc.pid == pid:
                self._console.say(f"{name} still running a grace period after the job ended; stopping it")
                self._stop(name, now)
            elif kind == "kill" and proc is not None and proc.pid == pid:
                self._console.say(f"{name} did not stop within its grace period; SIGKILL")
                signal_group(pid, signal.SIGKILL)

    # The loop -----------------------------------------------------------------------------------
    def run(self) -> JobResult:
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        os.set_blocking(wake_write, False)
        self._selector.register(wake_read, selectors.EVENT_READ, None)
        previous_wakeup = signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
        previous = {
            s: signal.signal(s, lambda signum, _frame: self._pending_signals.append(signum)) for s in STOP_SIGNALS
        }
        # A Python handler makes a child's exit write to the wake-up pipe, so the loop reaps at once.
        previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
        try:
            self._start = self._attempt_start = self._clock()
            self._console.say(f"Created: {self._rules.kind} {self._rules.name} is created.")
            for name in self._replicas:
                self._spawn(name)
            self._console.say(f"Running: {self._rules.kind} {self._rules.namespace}/{self._rules.name} is running.")
            if self._rules.active_deadline_s is not None:
                self._schedule(self._start + self._rules.active_deadline_s, "deadline")
            while self._procs or not self._finished_or_stopping():
                if self._regroup and not self._procs and not self._finished_or_stopping():
                    self._start_group(self._clock())
                if not self._procs and not any(t[2] == "restart" for t in self._timers):
                    self._console.say(
                        "every replica has ended and the job has no outcome; the operator would leave it Running"
                    )
                    break
                now = self._clock()
                timeout = min(0.5, max(0.0, self._timers[0][0] - now)) if self._timers else 0.5
                for key, _ in self._selector.select(timeout):
                    if key.data is None:
                        with contextlib.suppress(BlockingIOError):
                            while os.read(wake_read, 512):
                                pass
                    elif key.data in self._procs:
                        self._read(key.data)
                while self._pending_signals:
                    self._on_signal(self._pending_signals.pop(0), self._clock())
                now = self._clock()
                self._reap(now)
                self._run_timers(now)
        finally:
            for proc in self._procs.values():
                signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
            for s, handler in previous.items():
                signal.signal(s, handler)
            signal.set_wakeup_fd(previous_wakeup)
            self._selector.close()
            os.close(wake_read)
            os.close(wake_write)
        end = self._end if self._end is not None else self._clock()
        failed = self._condition is not None and self._condition.type == "Failed"
        return JobResult(
            condition=self._condition,
            stop_signal=self._stop_signal,
            duration_s=end - self._start,
            failed_replica=self._last_failure if failed else None,
            last_exit=dict(self._last_exit),
            stopped=set(self._stopped),
        )
