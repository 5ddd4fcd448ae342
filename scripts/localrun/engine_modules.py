"""Each engine's part of the local runner, from its folder: k8s/engines/<engine>/local_run.py (the default's, the
TFJob's, too), imported only when a manifest of the engine's kind runs, so a fork that deleted an optional folder
loses nothing else. This room holds what every engine shares: the pods' processes (podplan.Planner.plan_container),
their replicas, restarts and conditions (operator_rules), the supervisor and the report.

A local_run module either runs its object (`validate(job)`, `plan(planner)` -> the replicas and what its rules
need, `rules(manifests, replicas, planned)`, and optionally `PROCESS_NOUN`, what the console calls one process, "pod"
without it) or turns it into another engine's object that runs (`as_run(job, docs)`, `describe(made_from, job)`: a
TrainJob becomes the JobSet Trainer would make of it)."""

from __future__ import annotations

from types import ModuleType

from scripts.common.manifest import engine_module


def local_run(kind: str) -> ModuleType:
    """The local_run module of the engine folder whose kind this is."""
    return engine_module(kind, "local_run")
