"""Reads the settings, each key in the one file of its owner: the forker's k8s/base/settings.env (names, paths, ports,
sizes, the engine) and k8s/base/trainer.env (the trainer's TRAINER_* variables, which every pod also gets), then
each room's settings.env, which holds what the room installs or runs: each folder of k8s/engines/ (an engine's, an
add-on's), each tool room's (scripts/<room>/settings.env: the image's, the cluster's Kubernetes in scripts/common, the
k3d cluster's, the pipeline's, the local node's, the benches') and the model server's (trainer/serving/). A key lives
in exactly one of them.

The files hold the defaults; a variable of the same name in the environment wins over it (make exports
its effective values, so `WORKERS=3 make submit` and `make submit WORKERS=3` both reach the scripts).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the repository
K8S_ROOT = ROOT / "k8s"
SETTINGS_FILE = K8S_ROOT / "base" / "settings.env"  # the forker's; kustomize fills the manifests from it
TRAINER_FILE = K8S_ROOT / "base" / "trainer.env"  # the trainer's variables, every pod's environment too
TRAINER_PREFIX = "TRAINER_"


def room_files(name: str) -> list[pathlib.Path]:
    """Each room's own file of this name: each folder's of k8s/engines/, then each tool room's (scripts/<room>/NAME),
    then each of the trainer's optional rooms' (trainer/<room>/NAME), so that a deleted room's go with it."""
    rooms = (K8S_ROOT / "engines", ROOT / "scripts", ROOT / "trainer")
    return [path for folder in rooms for path in sorted(folder.glob(f"*/{name}"))]


def settings_files() -> list[pathlib.Path]:
    """The forker's two files, then each room's."""
    return [SETTINGS_FILE, TRAINER_FILE, *room_files(SETTINGS_FILE.name)]


LOCAL_RUNS = ROOT / "runs"  # run-local's volumes, one folder per job: runs/<job-name>/


# Each setting's characters, so that no value can end a quote or start a command where make or a script pastes it
# (a JOB_NAME taken from a branch name, say). The Makefile holds every value to GENERAL itself, before it runs a
# command; this table is stricter per key, checked by the scripts (check, --check) before they act.
_NAME = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"  # a DNS label: a Kubernetes object's name
# A path's segment: never . or .., which would lead a path out of where it is meant to stay (SELECTION_ROOT=../../etc).
_SEGMENT = r"(?!\.\.?(/|$))[A-Za-z0-9._-]+"
_PATH = rf"(/{_SEGMENT})+/?"
_RELATIVE_PATH = rf"{_SEGMENT}(/{_SEGMENT})*"
_VERSION = r"v[0-9]+\.[0-9]+\.[0-9]+"
_CPU = r"[0-9]+(\.[0-9]+)?m?"
_IMAGE = r"[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9._-]+)?(@sha256:[0-9a-f]{64})?"
_CIDR = r"[0-9]+(\.[0-9]+){3}/[0-9]+"
GENERAL = r"[A-Za-z0-9._,:/=+@*?\[\]-]*"
_DNS_LABEL_RULE = (_NAME, "lower-case letters, digits and '-' (a DNS label)")
_DIGITS_RULE = (r"[0-9]+", "digits")
_PATH_RULE = (_PATH, "an absolute path of letters, digits and . _ - /, with no . or .. segment")
_IMAGE_REFERENCE_RULE = (_IMAGE, "an image reference: name:tag")
# A path below a folder: SELECTION_ROOT, and every file name make upload-images copies to the volume.
RELATIVE_PATH_RULE = (_RELATIVE_PATH, "a relative path of letters, digits and . _ - /, with no . or .. segment")
# Each rule once, with the keys it holds.
RULES: dict[str, tuple[str, str]] = {
    **dict.fromkeys(("JOB_NAME", "NAMESPACE", "CLUSTER_NAME", "VOLUME_CLAIM", "ENGINE"), _DNS_LABEL_RULE),
    **dict.fromkeys(
        ("WORKERS", "TFJOB_PORT", "TRAINER_STATUS_PORT", "SERVE_PORT", "SERVE_GRPC_PORT", "NODE_API_PORT"),
        _DIGITS_RULE,
    ),
    **dict.fromkeys(
        (
            "MOUNT_PATH",
            "MODEL_ROOT",
            "IMAGES_ROOT",
            "TRAINER_DATA_DIR",
            "NODE_CACHE",
            "NODE_ROOT",
            "NODE_RUN",
            "NODE_CNI_BIN",
        ),
        _PATH_RULE,
    ),
    **dict.fromkeys(("K3S_IMAGE", "TRAINING_OPERATOR_IMAGE"), _IMAGE_REFERENCE_RULE),
    **dict.fromkeys(("NODE_POD_CIDR", "NODE_SERVICE_CIDR"), (_CIDR, "an IPv4 range such as 10.244.0.0/16")),
    "VOLUME_SIZE": (r"[0-9]+(\.[0-9]+)?([KMGTPE]i?)?", "a quantity such as 2Gi"),
    "VOLUME_ACCESS_MODE": (r"ReadWriteOnce|ReadWriteMany", "ReadWriteOnce or ReadWriteMany"),
    "VOLUME_STORAGE_CLASS": (r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", "a StorageClass name (kubectl get storageclass)"),
    "SPREAD_OVER_NODES": (r"[01]", "1 (a job's pods spread over the nodes) or 0 (wherever they fit)"),
    "IMAGE_NAME": (_IMAGE, "an image name: lower-case letters, digits and . _ - /"),
    "IMAGE_TF_FLAVOUR": (r"(cpu|tf|gpu)?", "cpu, tf, gpu or empty"),
    # The trainer's choices (tests/tools/test_settings.py holds them to its options), or empty: its default.
    "TRAINER_ON_CORRUPT_RECORD": (r"(fail|skip)?", "fail, skip or empty (the trainer's default)"),
    "TRAINER_ON_NONFINITE": (r"(stop|skip|ignore)?", "stop, skip, ignore or empty (the trainer's default)"),
    "K3D_GPUS": (r"[A-Za-z0-9,=]*", "letters, digits , and ="),
    # k3d's --volume FOLDER:PATH@all: a : or @ in the folder would be read as its separators.
    "K3D_SHARED_DIR": (rf"({_PATH})?", "an absolute path of letters, digits and . _ - /, or empty (k3d-up's default)"),
    "KUBE_CONTEXT": (r"[A-Za-z0-9._@:/-]*", "a kubeconfig context name: letters, digits and . _ @ : / -"),
    "SERVE_MAX_BATCH_SIZE": (r"[0-9]*", "digits, or empty for the server's default (batching off)"),
    "SERVE_BATCH_TIMEOUT_MS": (
        r"([0-9]+(\.[0-9]+)?)?",
        "milliseconds such as 2 or 0.5, or empty for the server's default",
    ),
    "SERVE_MAX_QUEUED_EXAMPLES": (r"[0-9]*", "digits, or empty for the server's default"),
    "SERVE_MAX_CONCURRENT_REQUESTS": (r"[0-9]*", "digits (0: no limit), or empty for the server's default"),
    **dict.fromkeys(
        ("BENCH_GHZ_MODULE_SHA256", "BENCH_HEY_MODULE_SHA256"), (r"[0-9a-f]{64}", "64 lower-case hex digits")
    ),
    "SELECTION_ROOT": RELATIVE_PATH_RULE,
    "RUN_HERE_SUITE": RELATIVE_PATH_RULE,
    "RUN_HERE_KUBERNETES": (_VERSION, "a Kubernetes version such as v1.36.3"),
    # TensorFlow Serving's image tags carry no v: 2.21.0.
    "TF_SERVING_VERSION": (r"[0-9]+\.[0-9]+\.[0-9]+", "a TensorFlow Serving release such as 2.21.0"),
    # The pause image's tags carry no v: 3.10.1.
    "NODE_PAUSE_VERSION": (r"[0-9]+\.[0-9]+(\.[0-9]+)?", "a pause image tag such as 3.10.1"),
    **dict.fromkeys(
        ("NODE_IP", "NODE_AGENT_IP", "NODE_AGENT_GATEWAY"),
        (r"[0-9]+(\.[0-9]+){3}", "an IPv4 address no other host uses, such as 10.243.255.1"),
    ),
    "NODE_LINK_RATE": (r"([0-9]+[kmg]?bit)?", "a rate in tc's units such as 1gbit or 100mbit, or empty: unlimited"),
    **dict.fromkeys(
        ("WORKER_CPU_REQUEST", "PS_EVALUATOR_CPU_REQUEST", "DATA_CPU_REQUEST", "SERVE_CPU_REQUEST"),
        (_CPU, "a CPU quantity such as 1, 0.5 or 250m"),
    ),
}
_VERSION_RULE = (_VERSION, "a version such as v1.2.3")
_COMMIT_RULE = (r"[0-9a-f]{40}", "a full commit SHA (40 hexadecimal digits)")
_SHA256_RULE = (r"([0-9a-f]{64})?", "a sha256 (64 lower-case hexadecimal digits) or empty")
_DIGEST_RULE = (r"(sha256:[0-9a-f]{64})?", "an image digest, sha256: and 64 lower-case hexadecimal digits, or empty")
_TESTED_RULE = (r"v[0-9.]+(,v[0-9.]+)*", "versions separated by commas, such as v1.34.3,v1.35.0")
_GENERAL_RULE = (GENERAL, "letters, digits and . _ , : / = + @ * ? [ ] -")


class SettingsError(ValueError):
    """A setting's value that make or a script could not pass on safely; the message names the key and the fix."""


def rule_of(key: str) -> tuple[str, str]:
    """(the pattern a value must match whole, what it allows in words) for one setting."""
    if key in RULES:
        return RULES[key]
    if key.endswith("_TESTED_KUBERNETES"):
        return _TESTED_RULE
    if key.endswith("_VERSION"):
        return _VERSION_RULE
    if key.endswith("_COMMIT"):
        return _COMMIT_RULE
    if key.endswith("_SHA256"):
        return _SHA256_RULE
    if key.endswith("_DIGEST"):
        return _DIGEST_RULE
    return _GENERAL_RULE


def problems(settings: Mapping[str, str]) -> list[str]:
    """One line per setting whose value breaks its key's rule, naming the key, the value and what is allowed. A key
    may be empty only where its rule allows it (a checksum not recorded yet, the trainer's own defaults): every
    name, commit, version, port and path the scripts use is required."""
    found = []
    for key, value in settings.items():
        pattern, allowed = rule_of(key)
        if re.fullmatch(pattern, value):
            continue
        where = f"{home(key)}, the environment or make's command line"
        if value == "":
            found.append(f"setting {key} is empty, and the scripts need it: set it to {allowed} ({where})")
        else:
            found.append(f"setting {key}={value!r} is not allowed: use {allowed} (set in {where})")
    return found


def check(settings: Mapping[str, str]) -> None:
    """Raises SettingsError listing every setting that breaks its rule."""
    found = problems(settings)
    if found:
        raise SettingsError("\n".join(found))


def _check(key: str, value: str, where: str) -> None:
    if not key.isidentifier() or " " in value or '"' in value:
        raise ValueError(f"{where}: expected KEY=VALUE without quotes or spaces, got {key}={value!r}")


def _read(path: pathlib.Path) -> dict[str, str]:
    settings: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{path}:{number}: expected KEY=VALUE without quotes or spaces, got {line!r}")
        _check(key, value, f"{path}:{number}")
        settings[key] = value
    return settings


def _misplaced(path: pathlib.Path, keys: set[str]) -> list[str]:
    """A TRAINER_* key reaches the pods only from trainer.env, and trainer.env holds nothing else."""
    if path.name == TRAINER_FILE.name:
        return sorted(key for key in keys if not key.startswith(TRAINER_PREFIX))
    return sorted(key for key in keys if key.startswith(TRAINER_PREFIX))


def load_file(path: pathlib.Path | None = None) -> dict[str, str]:
    """The KEY=VALUE pairs of one settings file, or (no path) of every one, in file order, without the environment.
    A key in two files, or in the wrong one of the forker's two, is refused naming the file it belongs in."""
    if path is not None:
        return _read(path)
    settings: dict[str, str] = {}
    where: dict[str, pathlib.Path] = {}
    for each in settings_files():
        if not each.exists():
            continue
        pairs = _read(each)
        wrong = _misplaced(each, set(pairs))
        if wrong:
            right = TRAINER_FILE if wrong[0].startswith(TRAINER_PREFIX) else SETTINGS_FILE
            raise ValueError(f"{_shown(each)}: {', '.join(wrong)} belong in {_shown(right)}; move them there")
        twice = sorted(pairs.keys() & settings.keys())
        if twice:
            raise ValueError(
                f"{', '.join(twice)} is set in {_shown(where[twice[0]])} and in {_shown(each)}, which pins it for what "
                f"it installs: keep it there only (or set it in the environment or on make's command line)"
            )
        settings.update(pairs)
        where.update(dict.fromkeys(pairs, each))
    return settings


def _shown(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def home(key: str) -> str:
    """The settings file that holds the key, as the user finds it from the repository's root."""
    owner = TRAINER_FILE if key.startswith(TRAINER_PREFIX) else SETTINGS_FILE
    found = next((path for path in settings_files()[1:] if path.exists() and key in _read(path)), owner)
    return _shown(found)


def trainer_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment's non-empty TRAINER_* variables: each reaches the pods whether or not trainer.env lists it,
    so that `TRAINER_TRAIN_FILES=... make submit` works for an option trainer.env shows only as an example."""
    return {key: value for key, value in environ.items() if key.startswith(TRAINER_PREFIX) and value}


def load(path: pathlib.Path | None = None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings file's pairs (no path: every file's), each replaced by a non-empty environment variable of the
    same name; trainer.env's (and every file's) also gain the environment's other TRAINER_* variables."""
    environ = os.environ if environ is None else environ
    settings = load_file(path)
    extra = trainer_variables(environ) if path is None or path.name == TRAINER_FILE.name else {}
    for key in [*settings, *(key for key in extra if key not in settings)]:
        if environ.get(key):
            _check(key, environ[key], f"environment variable {key}")
            settings[key] = environ[key]
    check(settings)
    return settings


def local_model_dir(job_name: str, settings: Mapping[str, str]) -> pathlib.Path:
    """A job's model dir as run-local lays it out: the volume (MOUNT_PATH) is runs/<job>/, so MODEL_ROOT/<job> is
    runs/<job>/<MODEL_ROOT below MOUNT_PATH>/<job> (the Makefile's local_model_dir)."""
    below_mount = os.path.relpath(settings["MODEL_ROOT"], settings["MOUNT_PATH"])
    return LOCAL_RUNS / job_name / below_mount / job_name


def kube_context(settings: Mapping[str, str]) -> str:
    """The kubeconfig context the cluster commands act on: KUBE_CONTEXT when named, else the project's k3d cluster's
    (k3d names it k3d-<cluster>), never the current one; scripts/common/settings.sh's kube_context is the same rule."""
    return settings.get("KUBE_CONTEXT") or f"k3d-{settings['CLUSTER_NAME']}"


def main(argv: list[str]) -> int:
    """--check: exit 2 with one line per unsafe setting (the file's values, the environment's over them). An empty
    variable counts as given: make passes the settings so (KEY='' when set empty) and pastes that value as it is."""
    if argv != ["--check"]:
        print("usage: python3 -m scripts.common.settings --check", file=sys.stderr)
        return 2
    try:
        defaults = load_file()
        given = {key: os.environ[key] for key in defaults if key in os.environ} | trainer_variables(os.environ)
        for key, value in given.items():
            _check(key, value, f"environment variable {key}")
        check({**defaults, **given})
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


def _settings_root(k8s_dir: pathlib.Path) -> tuple[pathlib.Path, list[pathlib.Path]] | None:
    """(the tree to copy, the settings files kustomize reads there) for a kustomization: the nearest directory at or
    above k8s_dir that holds base/settings.env (k8s/ for every overlay), with base/trainer.env beside it, else
    k8s_dir itself when it holds a settings.env."""
    for directory in (k8s_dir, *k8s_dir.parents):
        base = directory / "base"
        if (base / SETTINGS_FILE.name).exists():
            return directory, [path for path in (base / SETTINGS_FILE.name, base / TRAINER_FILE.name) if path.exists()]
    if (k8s_dir / SETTINGS_FILE.name).exists():
        return k8s_dir, [k8s_dir / SETTINGS_FILE.name]
    return None


@contextlib.contextmanager
def kustomization(k8s_dir: pathlib.Path, environ: Mapping[str, str] | None = None) -> Iterator[pathlib.Path]:
    """k8s_dir, or the same directory in a copy of its tree whose settings.env holds the environment's overrides,
    for kustomize to read (an overlay reads the settings through ../../base)."""
    k8s_dir = k8s_dir.resolve()
    found = _settings_root(k8s_dir)
    if found is None:
        yield k8s_dir
        return
    tree, paths = found
    effective = {path: load(path, environ) for path in paths}
    if all(pairs == load_file(path) for path, pairs in effective.items()):
        yield k8s_dir
        return
    with tempfile.TemporaryDirectory(prefix="kustomization-") as tmp:
        copy = pathlib.Path(tmp) / tree.name
        shutil.copytree(tree, copy, ignore=shutil.ignore_patterns(".*"))
        for path, pairs in effective.items():
            (copy / path.relative_to(tree)).write_text("".join(f"{key}={value}\n" for key, value in pairs.items()))
        yield copy / k8s_dir.relative_to(tree)
