"""Joining the training group: the distribution strategy, built before any other TF op.

MultiWorkerMirroredStrategy blocks in C++ (holding the GIL) until every worker
has registered with the coordination leader, rank 0. Python threads and signal
handlers cannot bound that wait, so a small watchdog process does: if the group
has not formed in time it prints why and kills the trainer, which exits with a
retryable code (137) that the TFJob restarts.

Leaving the group at the end is ordered too (leave_group): every worker meets at a barrier, the others exit,
and the leader exits last, once their servers are gone.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
import time

import tensorflow as tf

from trainer.base import private_api
from trainer.base.errors import ExitCode, StartupTimeout, first_line
from trainer.distribution.cluster import TRAINING_TYPES, Cluster

log = logging.getLogger(__name__)

# What a collective raises when a peer died or the group broke up: every worker must restart and resume.
_GROUP_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.CancelledError,
    tf.errors.AbortedError,
    tf.errors.DeadlineExceededError,
)
# The coordination service aborts collectives with whatever status it saw, e.g. InvalidArgument
# "must be registered before sending heartbeat" when the chief restarted under a live worker.
_GROUP_ABORT_MARKERS = ("Collective ops is aborted by", "/tensorflow.CoordinationService/")

_COLLECTIVES = {
    "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}

# The leader (rank 0) hosts TF 2.21's coordination service, which calls a peer dead once its heartbeats have stopped
# for heartbeat_timeout_in_ms (10 s by default, a heartbeat every 5 s), while a peer's agent fails at once when the
# leader's process is gone. So the leader exits after the others (docs/bench.md, "Start-up and exit": how long
# theirs takes), waiting for them at most this long.
PEERS_GONE_WAIT_S = 20.0

# Runs in its own interpreter: waits for the parent to close stdin (group formed, or parent gone).
_WATCHDOG = """
import os, select, signal, sys
timeout, parent, message = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ready, _, _ = select.select([sys.stdin], [], [], timeout)
if not ready:
    sys.stderr.write(message + "\\n")
    sys.stderr.flush()
    os.kill(parent, signal.SIGKILL)
"""


def share_cores(threads: int, cluster: Cluster, overlap: bool = False) -> None:
    """Sizes TensorFlow's thread pools; call it before any TensorFlow op. threads 0: the visible cores, shared out
    among the TF_CONFIG tasks on this host, since processes that each start a pool per core run more threads than
    there are cores and fight over them (docs/bench-log.md measures the gain); alone on its host, TensorFlow's default.
    overlap (gradients all-reduced in buckets): at least 2 inter-op threads, since with one the first bucket's
    all-reduce starts only after the whole backward pass (trainer/distribution/allreduce.py)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if not threads and cluster.tasks_on_this_host == 1 and not (overlap and cores < 2):
        return
    threads = threads or max(1, cores // cluster.tasks_on_this_host)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(2, threads) if overlap else threads)


def create_strategy(cluster: Cluster, collective: str, startup_timeout: float) -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy for a group of two or more, the default strategy for one process."""
    if not cluster.is_distributed:
        return tf.distribute.get_strategy()
    deadline = time.monotonic() + startup_timeout
    wait_for_dns(cluster, deadline)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        # Only the training tasks form the collective; an evaluator or ps entry must not be waited for.
        tf.train.ClusterSpec({k: list(v) for k, v in cluster.members.items() if k in TRAINING_TYPES}),
        task_type=cluster.task_type,
        task_id=cluster.task_index,
        rpc_layer="grpc",
    )
    remaining = max(1.0, deadline - time.monotonic())
    log.info(
        "%s (rank %d of %d) joining the group led by %s; waiting up to %.0f s for every worker to register",
        cluster.name,
        cluster.rank,
        cluster.num_workers,
        cluster.chief_address,
        remaining,
    )
    message = (
        f"{cluster.name}: the training group did not form within {startup_timeout:.0f} s "
        f"(--startup-timeout). Members: {', '.join(cluster.training_addresses)}. Check that every replica "
        f"is running and can reach {cluster.chief_address}; "
        f"exiting with code {ExitCode.STARTUP_TIMEOUT} so the job restarts."
    )
    watchdog = subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, str(remaining), str(os.getpid()), message], stdin=subprocess.PIPE
    )
    assert watchdog.stdin is not None  # stdin=PIPE: the watchdog's only signal that the group formed
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver,
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=_COLLECTIVES[collective]
            ),
        )
    finally:
        watchdog.stdin.close()
        watchdog.wait()
    log.info("%s joined: %d workers in sync", cluster.name, strategy.num_replicas_in_sync)
    return strategy


def leave_group(cluster: Cluster, strategy: tf.distribute.Strategy, timeout_s: float) -> None:
    """Ends a finished run so that no worker logs a lost peer (StartAbort UNAVAILABLE "Failed to send RPC to
    coordination service" in a peer that outlived the leader; "The following tasks are unhealthy" in a leader that
    outlived a peer by a heartbeat timeout). Python cannot reach the coordination agent's own Shutdown, whose
    shutdown barrier would do this: TF 2.21 calls it only when the C++ eager context is destroyed, and Python never
    destroys it. So: every worker waits at a barrier, then the others return (and exit), and the leader returns
    once their servers stop accepting connections, at most PEERS_GONE_WAIT_S later."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return  # the barrier is for MWMS's coordinated tasks; other strategies' tasks never reach it
    try:
        private_api.wait_at_barrier("trainer_finished", int(timeout_s * 1000))
    except tf.errors.OpError as error:
        log.warning(
            "%s: the group did not reach the end together (%s); exiting anyway", cluster.name, first_line(error)
        )
        return
    if cluster.is_chief:
        _wait_until_gone(
            [address for rank, address in enumerate(cluster.training_addresses) if rank != cluster.rank],
            time.monotonic() + PEERS_GONE_WAIT_S,
        )


def _wait_until_gone(addresses: list[str], deadline: float) -> None:
    """Waits until no process listens at these host:port addresses any more (or the deadline passes)."""
    pending = list(addresses)
    while pending and time.monotonic() < deadline:
        pending = [address for address in pending if _listening(address)]
        if pending:
            time.sleep(0.05)


def _listening(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:  # refused, unreachable, timed out or no longer in DNS: the peer is gone
        return False


_TASK_NAME = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)")
# The words that say why, in the many lines of a collective's error; the first line is "Graph execution error:".
_WHY = re.compile(r"crashed|heartbeat|unhealthy|connect|socket|unavailable|deadline|aborted|cancelled", re.IGNORECASE)


def failure_reason(error: BaseException) -> str:
    """The line of TensorFlow's many-line error that says why a peer was lost (its first line when none does)."""
    return next((line.strip() for line in str(error).splitlines() if _WHY.search(line)), first_line(error))


def lost_group_message(error: BaseException, cluster: Cluster) -> str:
    """The one line a worker prints when its group broke up: which task stopped answering (as TensorFlow names it
    in the error), why in TensorFlow's words, and that every worker restarts."""
    text = str(error)
    peers = sorted({f"{job}-{index}" for job, index in _TASK_NAME.findall(text)} - {cluster.name})
    reason = failure_reason(error)
    who = f"{', '.join(peers)} stopped answering" if peers else "a peer stopped answering"
    return (
        f"{cluster.name} lost contact with the training group: {who} (crashed, stopped, or its node froze or was "
        f"cut off; TensorFlow says: {reason[:200]}). The group will be restarted: every worker exits with retryable "
        f"code {ExitCode.GROUP_FAILED} and resumes from the last checkpoint."
    )


def is_group_failure(error: BaseException) -> bool:
    """True when `error` means the group broke up (restart and resume), not a bug in this worker."""
    if isinstance(error, _GROUP_ERRORS):
        return True
    return isinstance(error, tf.errors.OpError) and any(marker in str(error) for marker in _GROUP_ABORT_MARKERS)


def wait_for_dns(cluster: Cluster, deadline: float, addresses: tuple[str, ...] | None = None) -> None:
    """Waits until every member's host name resolves: pods' DNS records appear a little after they start."""
    hosts = sorted({address.rsplit(":", 1)[0] for address in addresses or cluster.training_addresses})
    pending = list(hosts)
    announced = False
    while pending:
        pending = [host for host in pending if not _resolves(host)]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise StartupTimeout(
                f"{cluster.name}: these peers' host names never resolved: {', '.join(pending)}. Check that their "
                f"pods are running and that the Service names in TF_CONFIG exist; the job restarts this worker "
                f"(exit code {ExitCode.STARTUP_TIMEOUT})"
            )
        if not announced:
            log.info("%s: waiting for DNS names of %s", cluster.name, ", ".join(pending))
            announced = True
        time.sleep(1.0)


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
        return True
    except socket.gaierror:
        return False
