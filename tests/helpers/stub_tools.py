"""A PATH of stand-in tools, for running the project's shell scripts where a tool is missing or only pretends."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

# What the scripts need from the system before they look for the cluster tools.
BASICS = ("bash", "dirname")


def path_with(tmp_path: pathlib.Path, stubs: dict[str, str], tools: tuple[str, ...] = BASICS) -> str:
    """A PATH holding only the system's `tools` (the basics by default) plus the given stub tools (name -> shell
    body), and this interpreter as python3."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in tools:
        if tool not in stubs:  # a stub is written into bin_dir: through a link it would overwrite the system's tool
            (bin_dir / tool).symlink_to(shutil.which(tool))
    # The scripts check the settings with python3 (scripts/common/settings.py): this interpreter stands in.
    (bin_dir / "python3").write_text(f'#!{shutil.which("bash")}\nexec {sys.executable} "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    for name, body in stubs.items():
        stub = bin_dir / name
        stub.write_text(f"#!{shutil.which('bash')}\n{body}\n")
        stub.chmod(0o755)
    return str(bin_dir)


def with_real(path: str, *tools: str) -> str:
    for tool in tools:
        pathlib.Path(path, tool).symlink_to(shutil.which(tool))
    return path


def run_script(script: pathlib.Path, path: str, **settings: str) -> subprocess.CompletedProcess:
    """The shell script under bash with only PATH, HOME and the given settings in its environment."""
    return subprocess.run(
        [shutil.which("bash"), str(script)],
        capture_output=True,
        text=True,
        env={"PATH": path, "HOME": os.environ.get("HOME", "/tmp"), **settings},
        timeout=60,
    )
