"""Runs a module as `python -m MODULE ARGS` would, and writes the file of every module it imported from an installed
package (site-packages), lazily included, to OUT (JSON) as the process exits. With --missing=NAME, the module NAME
cannot be imported, as in an environment whose lock left its package out.

Usage: python tests/helpers/imports_of.py OUT [--missing=NAME ...] -m MODULE [ARGS ...]
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
from collections.abc import Iterable, Sequence


class Missing:
    """A finder, first on sys.meta_path, that refuses the named top-level modules as a missing package would."""

    def __init__(self, names: list[str]) -> None:
        self.names = set(names)

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def command(out: str, module_args: Sequence[str], missing: Iterable[str] = ()) -> list[str]:
    """The command line that runs `python -m MODULE_ARGS` under this recorder, writing OUT, with MISSING refused."""
    return [sys.executable, __file__, out, *(f"--missing={name}" for name in sorted(missing)), "-m", *module_args]


def main(argv: list[str]) -> None:
    out, rest = argv[0], argv[1:]
    missing = []
    while rest[:1] and rest[0].startswith("--missing="):
        missing.append(rest[0].removeprefix("--missing="))
        rest = rest[1:]
    if rest[:1] != ["-m"] or len(rest) < 2:
        raise SystemExit(__doc__)
    if missing:
        sys.meta_path.insert(0, Missing(missing))

    def record() -> None:
        files = {getattr(module, "__file__", None) for module in list(sys.modules.values())}
        with open(out, "w") as written:
            json.dump(sorted(f for f in files if f and f"{os.sep}site-packages{os.sep}" in f), written)

    atexit.register(record)  # the trainer ends with os._exit after running the exit functions
    sys.argv = [rest[1], *rest[2:]]
    runpy.run_module(rest[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
