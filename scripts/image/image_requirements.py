"""Prints the trainer's runtime requirements for one TensorFlow flavour, one per line.

The image build installs these before it copies the trainer's source, so a code
change does not reinstall TensorFlow. Usage: python3 scripts/image/image_requirements.py cpu|gpu|tf [pyproject.toml]
"""

from __future__ import annotations

import pathlib
import sys
import tomllib

# The extras of pyproject.toml that each bring exactly one TensorFlow wheel.
FLAVOURS = ("cpu", "gpu", "tf")
# Extras every image holds, where pyproject.toml has them: serve is the model server (trainer/serving/), so the
# trainer's image also serves what it trained.
IMAGE_EXTRAS = ("serve",)


def requirements(flavour: str, pyproject: pathlib.Path) -> list[str]:
    """The project's dependencies plus those of the flavour's extra and of the image's extras."""
    if flavour not in FLAVOURS:
        raise ValueError(f"TensorFlow flavour must be one of {', '.join(FLAVOURS)}, got {flavour!r}")
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project["optional-dependencies"]
    return [
        *project["dependencies"],
        *extras[flavour],
        *(line for extra in IMAGE_EXTRAS for line in extras.get(extra, [])),
    ]


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print(__doc__, file=sys.stderr)
        return 2
    pyproject = pathlib.Path(argv[1] if len(argv) == 2 else "pyproject.toml")
    try:
        lines = requirements(argv[0], pyproject)
    except ValueError as error:
        print(f"image_requirements: {error}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
