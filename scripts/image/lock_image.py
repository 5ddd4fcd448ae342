"""Writes the image's hashed locks (make lock): scripts/image/locks/<flavour>.txt, every package the image installs
for that TensorFlow flavour, pinned (==) with the sha256 of each of that release's files on the index, so the
Dockerfile installs them with `pip install --require-hashes --no-deps` and a changed file on the index fails the build.

Which packages: pip's own resolver, run as a dry run (`pip install --dry-run --report`) on the flavour's requirements
(scripts/image/image_requirements.py) under constraints.txt, for this machine's platform; the hashes: the index's
JSON API (PEP 691), every file of the pinned version, so the lock holds for the image's platforms too (a wheel per
platform, or the sdist). Re-run it after constraints.txt changes (make lock runs it after pinning constraints.txt).
Usage: python -m scripts.image.lock_image [FLAVOUR ...] (default: every flavour).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import tempfile
import urllib.request

from scripts.common.packages import normalized
from scripts.image.image_requirements import FLAVOURS, requirements

ROOT = pathlib.Path(__file__).resolve().parents[2]
LOCKS = ROOT / "scripts" / "image" / "locks"
INDEX = "https://pypi.org/simple"


def resolved(flavour: str) -> dict[str, str]:
    """name -> version of everything pip would install for the flavour under constraints.txt."""
    with tempfile.TemporaryDirectory(prefix="image-lock-") as scratch:
        wanted = pathlib.Path(scratch, "requirements.txt")
        wanted.write_text("\n".join(requirements(flavour, ROOT / "pyproject.toml")) + "\n")
        report = pathlib.Path(scratch, "report.json")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--dry-run",
                "--quiet",
                "--ignore-installed",
                "--report",
                str(report),
                "-c",
                str(ROOT / "constraints.txt"),
                "-r",
                str(wanted),
            ],
            check=True,
        )
        installs = json.loads(report.read_text())["install"]
    return {normalized(item["metadata"]["name"]): item["metadata"]["version"] for item in installs}


def release_hashes(name: str, version: str) -> list[str]:
    """The sha256 of every file of the release on the index (its wheels and sdist)."""
    request = urllib.request.Request(f"{INDEX}/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    hashes = sorted(
        f["hashes"]["sha256"] for f in files if "sha256" in f.get("hashes", {}) and _of(f["filename"], name, version)
    )
    if not hashes:
        raise SystemExit(f"lock_image: the index lists no file of {name}=={version}")
    return hashes


def _of(filename: str, name: str, version: str) -> bool:
    """Whether a file on the index is of this release: a wheel name-version-..., or an sdist name-version.tar.gz."""
    if filename.endswith(".whl"):
        parts = filename.split("-")
        return normalized(parts[0]) == name and parts[1] == version
    for extension in (".tar.gz", ".zip"):
        if filename.endswith(extension):
            stem, _, found = filename[: -len(extension)].rpartition("-")
            return normalized(stem) == name and found == version
    return False


def lock_text(flavour: str, pins: dict[str, str]) -> str:
    lines = [
        f"# The image's packages for TF_FLAVOUR={flavour}, each with the sha256 of every file of its release.",
        "# Written by `make lock` (python -m scripts.image.lock_image); the Dockerfile installs it: --require-hashes.",
    ]
    for name in sorted(pins):
        hashes = " \\\n    ".join(f"--hash=sha256:{digest}" for digest in release_hashes(name, pins[name]))
        lines.append(f"{name}=={pins[name]} \\\n    {hashes}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    flavours = argv or list(FLAVOURS)
    unknown = [f for f in flavours if f not in FLAVOURS]
    if unknown:
        print(f"lock_image: unknown flavour {unknown[0]!r}: use {', '.join(FLAVOURS)}", file=sys.stderr)
        return 2
    LOCKS.mkdir(parents=True, exist_ok=True)
    for flavour in flavours:
        pins = resolved(flavour)
        (LOCKS / f"{flavour}.txt").write_text(lock_text(flavour, pins))
        print(f"lock_image: {LOCKS / f'{flavour}.txt'}: {len(pins)} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
