"""The console a person follows: every replica's lines prefixed with its name, plus one log file per replica."""

from __future__ import annotations

import collections
import pathlib
import sys
from collections.abc import Iterable
from typing import IO

RUNNER = "run-local"


class LineBuffer:
    """Turns chunks of a pipe's bytes into whole lines; keeps an unfinished line until more arrives."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes) -> list[str]:
        data = self._pending + chunk
        *lines, self._pending = data.split(b"\n")
        return [line.rstrip(b"\r").decode("utf-8", errors="replace") for line in lines]

    def flush(self) -> list[str]:
        rest, self._pending = self._pending, b""
        return [rest.rstrip(b"\r").decode("utf-8", errors="replace")] if rest else []


class Console:
    def __init__(self, names: Iterable[str], log_dir: pathlib.Path, stream: IO[str] | None = None):
        self._stream: IO[str] | None = stream or sys.stdout
        self._width = max([len(RUNNER), *(len(n) for n in names)])
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        self._logs: dict[str, IO[str]] = {}

    def log_path(self, name: str) -> pathlib.Path:
        return self.log_dir / f"{name}.log"

    def _log(self, name: str) -> IO[str]:
        if name not in self._logs:
            self._logs[name] = self.log_path(name).open("w", buffering=1)
        return self._logs[name]

    def _print(self, source: str, text: str) -> None:
        if self._stream is None:
            return
        try:
            self._stream.write(f"{source.ljust(self._width)} | {text}\n")
            self._stream.flush()
        except BrokenPipeError:
            # Whoever read the console has gone (`| head`); the job goes on and its logs are still written.
            self._stream = None

    def replica(self, name: str, lines: Iterable[str]) -> None:
        log = self._log(name)
        for line in lines:
            log.write(line + "\n")
            self._print(name, line)

    def mark(self, name: str, text: str) -> None:
        """A line in the replica's log file (not its output) where it was restarted, as `kubectl logs --previous`
        would split."""
        self._log(name).write(f"--- {text} ---\n")

    def say(self, text: str) -> None:
        self._print(RUNNER, text)

    def tail(self, name: str, count: int) -> list[str]:
        path = self.log_path(name)
        if not path.exists():
            return []
        with path.open(errors="replace") as handle:
            return list(collections.deque(handle, maxlen=count))

    def close(self) -> None:
        for log in self._logs.values():
            log.close()
        self._logs.clear()
