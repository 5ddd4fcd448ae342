"""Maps a pod's volume mounts to local directories and rewrites paths under a mount to the local ones.

Every PersistentVolumeClaim is one directory of the job (the job directory itself when the job uses
a single claim), so /mnt/training/model in the manifest becomes runs/<job>/model here and every
replica, restart and data-preparation run sees the same files, as pods see the same volume.

An emptyDir is the pod's own: one directory per pod and volume under run-local/pods/ in the job directory, emptied
when the pod is planned (a pod's emptyDir starts empty). The manifests mount their scratch emptyDir at /tmp and
set TMPDIR and HOME there (the root filesystem is read-only), so a local process writes its temporary files and
caches into that directory, as the pod would, though nothing stops it writing elsewhere. A path below an
emptyDir's mount path is left as written: here it names this machine's files (a user's data under /tmp).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .envvars import Problems


@dataclasses.dataclass(frozen=True)
class Mount:
    mount_path: str
    local_path: pathlib.Path
    # An emptyDir: only a value that is its mount path itself (TMPDIR=/tmp) becomes the pod's directory; a path
    # below it (a user's --train-files /tmp/data/*) is a file of this machine, left as written.
    scratch: bool = False


def claim_dirs(claims: Iterable[str], job_dir: pathlib.Path) -> dict[str, pathlib.Path]:
    """One claim: the job directory is its root. Several: one sub-directory per claim name."""
    names = sorted(set(claims))
    if len(names) == 1:
        return {names[0]: job_dir}
    return {name: job_dir / name for name in names}


EMPTY_DIRS = pathlib.Path("run-local") / "pods"  # inside the job directory


def pod_claims(pod_spec: Mapping[str, Any]) -> list[str]:
    return [
        v["persistentVolumeClaim"]["claimName"] for v in pod_spec.get("volumes") or [] if "persistentVolumeClaim" in v
    ]


def container_mounts(
    container: Mapping[str, Any],
    pod_spec: Mapping[str, Any],
    claims: Mapping[str, pathlib.Path],
    where: str,
    problems: Problems,
    pod_dir: pathlib.Path | None = None,
) -> list[Mount]:
    """Local directories for the container's volumeMounts: PersistentVolumeClaim volumes, and emptyDir volumes when
    the pod has a directory of its own (pod_dir: emptied here, as a new pod's emptyDir is empty)."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes") or []}
    supported = ("persistentVolumeClaim", "emptyDir") if pod_dir is not None else ("persistentVolumeClaim",)
    for name, volume in volumes.items():
        if not any(kind in volume for kind in supported):
            problems.unsupported(f"volumes[{name}]." + ".".join(k for k in volume if k != "name"), where)
    mounts: list[Mount] = []
    for mount in container.get("volumeMounts") or []:
        volume = volumes.get(mount["name"])
        label = f"{where}: volumeMount {mount['name']!r} at {mount['mountPath']}"
        for field in ("subPath", "subPathExpr"):
            if mount.get(field):
                problems.unsupported(f"volumeMounts[{mount['name']}].{field}", where)
        if volume is None:
            problems.errors.append(f"{label}: the pod has no volume named {mount['name']!r}")
            continue
        if "emptyDir" in volume and pod_dir is not None:
            local = pod_dir / mount["name"]
            shutil.rmtree(local, ignore_errors=True)
            local.mkdir(parents=True)
            mounts.append(Mount(mount["mountPath"].rstrip("/") or "/", local.resolve(), scratch=True))
            continue
        if "persistentVolumeClaim" not in volume:
            continue
        claim = volume["persistentVolumeClaim"]["claimName"]
        if claim not in claims:
            problems.notes.append(f"{label}: claim {claim!r} is not one of the job's; the path is left as written")
            continue
        claims[claim].mkdir(parents=True, exist_ok=True)
        mounts.append(Mount(mount["mountPath"].rstrip("/") or "/", claims[claim].resolve()))
    return mounts


class PathMapper:
    """Rewrites mount paths inside strings: whole values, --flag=VALUE forms and PATH-like lists."""

    def __init__(self, mounts: Sequence[Mount]):
        self._scratch = {m.mount_path: str(m.local_path) for m in mounts if m.scratch}
        mounts = [m for m in mounts if not m.scratch]
        # Longest mount path first, so a nested mount wins over its parent.
        ordered = sorted(mounts, key=lambda m: len(m.mount_path), reverse=True)
        self._local = {m.mount_path: str(m.local_path) for m in ordered}
        alternatives = "|".join(re.escape(m.mount_path) for m in ordered)
        self._pattern = re.compile(r"(?:^|(?<=[=:,\s]))(" + alternatives + r")(?=$|[/:,\s])") if ordered else None

    def rewrite(self, text: str) -> str:
        if text.rstrip("/") in self._scratch:
            return self._scratch[text.rstrip("/")]
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda match: self._local[match.group(1)], text)
