"""The parameter-server cluster: the chief's ParameterServerStrategy and coordinator, and the worker and ps
tasks that serve them."""

from __future__ import annotations

import logging
import time
from typing import Any

import tensorflow as tf

from trainer.distribution.cluster import ASYNC_TYPES, Cluster
from trainer.distribution.strategy import wait_for_dns

log = logging.getLogger(__name__)


def run_server(cluster: Cluster, startup_timeout: float) -> None:
    """An async worker or ps task: serves the coordinator's ops and variables until the process is stopped."""
    wait_for_dns(cluster, time.monotonic() + startup_timeout, _async_addresses(cluster))
    server = tf.distribute.Server(
        _async_cluster_spec(cluster),
        job_name=cluster.task_type,
        task_index=cluster.task_index,
        protocol="grpc",
        start=True,
    )
    log.info(
        "%s: async %s serving at %s; the coordinator is %s (it schedules the work)",
        cluster.name,
        cluster.task_type,
        cluster.members[cluster.task_type][cluster.task_index],
        cluster.chief_address,
    )
    server.join()


def create_parameter_server_strategy(cluster: Cluster, startup_timeout: float) -> tuple[tf.distribute.Strategy, Any]:
    """The async chief's ParameterServerStrategy and the ClusterCoordinator that schedules steps onto workers.

    Variables go whole to the ps tasks in turn (round robin). A variable_partitioner would split large ones, but
    Keras 3's optimizer cannot update a ShardedVariable ("doesn't support being used as a reference")."""
    wait_for_dns(cluster, time.monotonic() + startup_timeout, _async_addresses(cluster))
    log.info(
        "%s: async coordinator of %d worker(s) and %d ps task(s): %s",
        cluster.name,
        cluster.num_workers,
        cluster.num_ps,
        ", ".join(_async_addresses(cluster)),
    )
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        _async_cluster_spec(cluster), task_type="chief", task_id=0, rpc_layer="grpc"
    )
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    return strategy, tf.distribute.coordinator.ClusterCoordinator(strategy)


def _async_addresses(cluster: Cluster) -> tuple[str, ...]:
    return tuple(address for kind in ASYNC_TYPES for address in cluster.members.get(kind, ()))


def _async_cluster_spec(cluster: Cluster) -> tf.train.ClusterSpec:
    # The evaluator is no part of the async cluster: it only reads checkpoints.
    return tf.train.ClusterSpec({kind: list(cluster.members[kind]) for kind in ASYNC_TYPES if kind in cluster.members})
