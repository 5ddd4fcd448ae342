"""One job per model directory: the chief records which job it belongs to (<model-dir>/owner.json) and refuses a
directory that another job owns, so two jobs on one volume never resume from, or overwrite, each other's
checkpoints, status and exports.

A job is its namespace and name (JOB_NAMESPACE, from the downward API, and JOB_NAME, from the settings; run-local
gives both, from the manifest). Not a uid: `make delete` then `make submit` recreates the engine's object with a new
uid, and that resubmit must resume; and no uid of the job reaches a TFJob's pods. Kubernetes allows one object of a
name per namespace at a time, so a namespace and a name name at most one live job, and any other owner is another
job, whether or not it still runs (the trainer holds no API token to ask). Handing a directory to another job is
the user's act: delete owner.json. Each pod that claims it adds its name and uid, so the record says who wrote last.
A run with no JOB_NAME (python -m trainer on a laptop) records and checks nothing.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from trainer.artifacts.layout import ModelDir
from trainer.base.atomic_file import write_json
from trainer.base.errors import ModelDirError

log = logging.getLogger(__name__)


def identity(environ: Mapping[str, str]) -> dict[str, str] | None:
    """The job this process belongs to, as the pod's environment names it; None without a JOB_NAME."""
    name = environ.get("JOB_NAME", "")
    if not name:
        return None
    return {"namespace": environ.get("JOB_NAMESPACE", ""), "job": name}


def read_owner(model_dir: ModelDir) -> dict[str, Any] | None:
    """The recorded owner, None where there is none; ModelDirError for a file that is not an owner record."""
    path = model_dir.owner
    try:
        with open(path) as handle:
            record = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise ModelDirError(
            f"{path} cannot be read as this directory's owner ({error}); if no other job uses {model_dir.root}, delete "
            f"{path} and start the job again"
        ) from None
    if not (
        isinstance(record, dict) and isinstance(record.get("job"), str) and isinstance(record.get("namespace"), str)
    ):
        raise ModelDirError(
            f"{path} is not an owner record (expected an object with job and namespace strings); if no other job "
            f"uses {model_dir.root}, delete {path} and start the job again"
        )
    return record


def claim(model_dir: ModelDir, environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """Records this job as the model directory's owner, or raises ModelDirError (exit 2) naming the job that owns it
    and the fix. The same job (a restart, a resubmit) claims it again and resumes. Returns the record written."""
    environ = os.environ if environ is None else environ
    me = identity(environ)
    if me is None:
        return None
    owner = read_owner(model_dir)
    if owner is not None and (owner["namespace"], owner["job"]) != (me["namespace"], me["job"]):
        raise ModelDirError(
            f"{model_dir.root} belongs to job {_named(owner)} (its {model_dir.owner}), not to "
            f"{_named(me)}: one model directory holds one job's checkpoints. Give this job a name of its own "
            f"(JOB_NAME: the model directory is MODEL_ROOT/JOB_NAME), or, to take over that job's directory once it "
            f"is gone, delete {model_dir.owner}"
        )
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    record = {
        **me,
        "first_claimed": (owner or {}).get("first_claimed", now),
        "claimed": now,
        "pod": environ.get("POD_NAME", ""),
        "pod_uid": environ.get("POD_UID", ""),
    }
    os.makedirs(model_dir.root, exist_ok=True)
    write_json(model_dir.owner, record)
    if owner is not None and owner.get("pod_uid") != record["pod_uid"]:
        pod = record["pod"]
        log.info("model dir %s: job %s again (pod %s), resuming what it holds", model_dir.root, _named(me), pod)
    return record


def _named(who: Mapping[str, Any]) -> str:
    return f"{who['namespace']}/{who['job']}" if who.get("namespace") else str(who["job"])
